import json

import pytest

from nereus.errors import InputError
from nereus.spec import MODEL_PRESETS, Head, ModelSpec, get_model

# Published totals from the model cards (parameters, LM head included).
PUBLISHED = {"llama-3.1-8b": 8.03e9, "qwen3-14b": 14.8e9, "qwen3-32b": 32.8e9,
             "llama-3.3-70b": 70.6e9}


@pytest.mark.parametrize("name,total", PUBLISHED.items())
def test_preset_parameter_counts_match_published_totals(name, total):
    count = MODEL_PRESETS[name].param_count()
    assert abs(count - total) / total < 0.005, (name, count)


def test_scalar_head_replaces_lm_head():
    m = MODEL_PRESETS["llama-3.1-8b"]
    assert m.param_count(Head.LM) - m.param_count(Head.SCALAR) == m.vocab_size * m.hidden_size - m.hidden_size


def test_tied_embeddings_count_the_matrix_once():
    m = MODEL_PRESETS["tiny-qwen3"]
    assert m.head_params(Head.LM) == 0
    assert m.param_count() == m.embedding_params() + m.num_layers * m.layer_params() + m.hidden_size


def test_from_hf_config_reads_gqa_head_dim_qk_norm_and_tying(tmp_path):
    cfg = {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 17408,
           "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
           "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": False,
           "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = ModelSpec.from_hf_config(tmp_path)  # the folder works as well as the file
    assert m.qk_norm and m.num_kv_heads == 8 and m.head_dim == 128
    assert m.param_count() == MODEL_PRESETS["qwen3-14b"].param_count()
    assert get_model(str(tmp_path / "config.json")).param_count() == m.param_count()


def test_head_dim_defaults_to_hidden_over_heads(tmp_path):
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 100}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = ModelSpec.from_hf_config(p)
    assert m.head_dim == 16 and m.num_kv_heads == 4 and not m.qk_norm


def test_to_hf_dict_round_trips():
    m = MODEL_PRESETS["tiny-qwen3"]
    assert ModelSpec.from_hf_dict(m.to_hf_dict(), m.name) == m


def test_bad_models_name_the_field():
    with pytest.raises(InputError, match="model: unknown model"):
        get_model("llama-9b")
    with pytest.raises(InputError, match="num_kv_heads"):
        ModelSpec("x", 64, 128, 2, 4, 3, 16, 100)


@pytest.mark.parametrize("change,field", [
    ({"num_attention_heads": 0}, "model.config.num_attention_heads"),
    ({"hidden_size": "abc"}, "model.config.hidden_size"),
    ({"hidden_size": None}, "model.config.hidden_size"),
    ({"hidden_size": 4096.7}, "model.config.hidden_size"),
    ({"num_key_value_heads": "x"}, "model.config.num_key_value_heads"),
    ({"num_key_value_heads": 5}, "model.config.num_key_value_heads"),
    ({"rope_theta": [1]}, "model.config.rope_theta"),
    ({"model_type": "qwen3_moe", "num_experts": 128}, "model"),
])
def test_bad_hf_configs_are_one_line_input_errors(change, field):
    from nereus.errors import InputError
    from nereus.spec.model import ModelSpec, get_model

    cfg = {**get_model("llama-3.1-8b").to_hf_dict(), "model_type": "llama", **change}
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict(cfg, "bad")
    assert e.value.field == field
