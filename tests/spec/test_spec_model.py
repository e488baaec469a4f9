import json
import re

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
    """The LM head (vocab x hidden) gives way to a score row (hidden) and its bias."""
    m = MODEL_PRESETS["llama-3.1-8b"]
    assert m.param_count(Head.LM) - m.param_count(Head.SCALAR) == \
        m.vocab_size * m.hidden_size - (m.hidden_size + 1)


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
    with pytest.raises(InputError, match="^model: empty"):  # not the working directory
        get_model(" ")
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


@pytest.mark.parametrize("change", [
    {"num_experts": 128}, {"num_local_experts": 8}, {"n_routed_experts": 64},
    {"model_type": "qwen3_moe"}, {"model_type": "mixtral_moe"},
])
def test_mixture_of_experts_configs_are_refused(change):
    cfg = {**get_model("qwen3-14b").to_hf_dict(), **change}
    with pytest.raises(InputError, match="only dense decoders are supported") as e:
        ModelSpec.from_hf_dict(cfg, "moe")
    assert e.value.field == "model" and "\n" not in str(e.value)


def test_qk_norm_only_for_dense_qwen3():
    cfg = get_model("llama-3.1-8b").to_hf_dict()
    assert ModelSpec.from_hf_dict({**cfg, "model_type": "qwen3"}, "q").qk_norm
    assert not ModelSpec.from_hf_dict({**cfg, "model_type": "qwen2"}, "q").qk_norm
    assert not ModelSpec.from_hf_dict({**cfg, "model_type": "llama"}, "q").qk_norm
    # a model_type outside the known families is refused, not read as Qwen3 or Llama
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**cfg, "model_type": "qwen3_next_dense"}, "q")
    assert e.value.field == "model.config.model_type"


@pytest.mark.parametrize("change,field", [
    ({"tie_word_embeddings": "no"}, "model.config.tie_word_embeddings"),
    ({"rope_theta": float("inf")}, "model.config.rope_theta"),
    ({"rms_norm_eps": 0}, "model.config.rms_norm_eps"),
    ({"max_position_embeddings": 0}, "model.config.max_position_embeddings"),
    ({"max_position_embeddings": 4096.5}, "model.config.max_position_embeddings"),
    ({"rope_scaling": "yarn"}, "model.config.rope_scaling"),
    ({"rope_scaling": {"factor": 0}}, "model.config.rope_scaling.factor"),
    ({"num_attention_heads": 30}, "model.config.num_attention_heads"),  # 4096 % 30, no head_dim
])
def test_more_bad_hf_fields(change, field):
    cfg = {**get_model("llama-3.1-8b").to_hf_dict(), **change}
    if "num_attention_heads" in change:
        del cfg["head_dim"]
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict(cfg, "bad")
    assert e.value.field == field


def test_context_window_from_hf_config():
    cfg = get_model("qwen3-14b").to_hf_dict()
    assert ModelSpec.from_hf_dict(cfg, "q").max_position_embeddings == 40960
    # YaRN stretches Qwen3's 32,768 native tokens 4x (Qwen3 model card)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert ModelSpec.from_hf_dict({**cfg, "rope_scaling": yarn}, "q").max_position_embeddings \
        == 131072
    # Llama 3.1's rope_scaling is already counted in its max_position_embeddings
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = {**get_model("llama-3.1-8b").to_hf_dict(), "rope_scaling": llama3}
    assert ModelSpec.from_hf_dict(cfg, "l").max_position_embeddings == 131072
    # a config without a window sets none
    cfg.pop("max_position_embeddings")
    cfg.pop("rope_scaling")
    assert ModelSpec.from_hf_dict(cfg, "l").max_position_embeddings is None


def test_a_model_from_a_file_is_named_after_the_file(tmp_path, monkeypatch):
    """Every model read from a file was named after its folder: llama.json in a folder hf
    was 'hf', and two configs side by side had one name."""
    cfg = MODEL_PRESETS["tiny-llama"].to_hf_dict()
    folder = tmp_path / "hf"
    folder.mkdir()
    for name in ("llama.json", "config.json"):
        (folder / name).write_text(json.dumps(cfg))
    assert get_model(str(folder / "llama.json")).name == "llama"
    assert get_model(str(folder / "config.json")).name == "hf"  # a Hugging Face model folder
    assert get_model(str(folder)).name == "hf"
    monkeypatch.chdir(folder)
    assert get_model("config.json").name == "hf"  # a relative path has its folder too


@pytest.mark.parametrize("value", ["./nope.json", "nope.json", "/no/such/folder",
                                   "../nope/config.json"])
def test_a_model_that_looks_like_a_path_says_no_file_is_there(value, tmp_path, monkeypatch):
    """'--model ./nope.json' said "unknown model './nope.json'", as if it were a name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=rf"^model: no file or folder at {re.escape(value)} "
                       r"\(allowed: a path to a Hugging Face config\.json or its folder, "):
        get_model(value)


def test_a_hub_id_that_is_not_cached_still_says_how_to_fetch_it():
    """An id has a / too, but is no path: it keeps the hint to download its config."""
    with pytest.raises(InputError, match=r"^model: unknown model 'org/nope'; to read it from "
                       r"the hub, `hf download org/nope config.json` first"):
        get_model("org/nope")


@pytest.mark.parametrize("value, there", [("some/job.yaml", False), ("job.yaml", True),
                                          ("layout.YML", True)])
def test_a_yaml_file_as_the_model_says_what_model_takes(value, there, tmp_path, monkeypatch):
    """A job YAML given to --model was read as JSON ("not valid JSON ... (allowed: a JSON
    object)"), and where no file was there taken for a hub id (`hf download some/job.yaml`):
    neither said what --model takes."""
    monkeypatch.chdir(tmp_path)
    if there:
        (tmp_path / value).write_text("model: llama-3.1-8b\ngpus: 8\n")
    with pytest.raises(InputError, match=rf"^model: {re.escape(value)} is a YAML file, not a "
                       r"model's config\.json \(a job YAML is what --config reads\) \(allowed: "
                       r"a preset \(llama-3\.1-8b, .*config\.json or its folder, or a Hugging "
                       r"Face id \(ORG/NAME\)\)$") as e:
        get_model(value)
    assert "hf download" not in str(e.value)
