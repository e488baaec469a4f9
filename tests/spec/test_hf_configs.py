"""Real Hugging Face config.json files of common model families: a dense Llama-style decoder
plans with the published parameter count; anything else is one InputError naming the field.

The configs are the hub's files (fields that only tokenizers or generation read left out)."""

import json

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.errors import InputError
from nereus.spec.model import ModelSpec

LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000}
QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 152064}
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "use_sliding_window": False,
    "vocab_size": 151936}
# google/gemma-2-9b: no tie_word_embeddings (Gemma2Config's default, True, ties the LM head)
GEMMA_2_9B = {
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False,
    "attn_logit_softcapping": 50.0, "cache_implementation": "hybrid",
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "sliding_window_size": 4096, "torch_dtype": "float32", "vocab_size": 256000}
PHI_3_MINI_4K = {
    "architectures": ["Phi3ForCausalLM"], "attention_bias": False,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config"}, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 4096,
    "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
    "tie_word_embeddings": False, "vocab_size": 32064}
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}
# meta-llama/Llama-3.2-1B: llama3 RoPE with factor 32 over 8,192 tokens, and
# max_position_embeddings already the extended window (131,072); tied LM head
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "vocab_size": 128256}
# huggyllama/llama-7b: multi-head attention, no num_key_value_heads
LLAMA_1_7B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 11008, "max_position_embeddings": 2048, "max_sequence_length": 2048,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "vocab_size": 32000}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 151936}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000}
# EleutherAI/pythia-6.9b: an ungated MLP (two matrices), LayerNorm, partial rotary
PYTHIA_6_9B = {
    "architectures": ["GPTNeoXForCausalLM"], "hidden_act": "gelu", "hidden_size": 4096,
    "intermediate_size": 16384, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "gpt_neox", "num_attention_heads": 32, "num_hidden_layers": 32,
    "rotary_pct": 0.25, "tie_word_embeddings": False, "use_parallel_residual": True,
    "vocab_size": 50432}
# microsoft/phi-2: an ungated MLP, LayerNorm with biases
PHI_2 = {
    "architectures": ["PhiForCausalLM"], "hidden_act": "gelu_new", "hidden_size": 2560,
    "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "phi", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "vocab_size": 51200}
BERT_BASE = {
    "architectures": ["BertForMaskedLM"], "hidden_act": "gelu", "hidden_size": 768,
    "intermediate_size": 3072, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 2,
    "vocab_size": 30522}

# published totals (model cards; Qwen's "0.49B" is 494 M)
PLANNED = {
    "llama-2-7b": (LLAMA_2_7B, 6.74e9), "mistral-7b": (MISTRAL_7B, 7.24e9),
    "qwen2.5-7b": (QWEN2_5_7B, 7.62e9), "qwen2.5-0.5b": (QWEN2_5_0_5B, 0.494e9),
    "gemma-2-9b": (GEMMA_2_9B, 9.24e9), "phi-3-mini-4k": (PHI_3_MINI_4K, 3.82e9),
    "llama-3.1-8b": (LLAMA_3_1_8B, 8.03e9), "llama-1-7b": (LLAMA_1_7B, 6.74e9),
    # the hub's safetensors count: 1,235,814,400
    "llama-3.2-1b": (LLAMA_3_2_1B, 1.24e9),
}


def _write(tmp_path, cfg) -> str:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg) if isinstance(cfg, dict | list) else cfg)
    return str(d)


@pytest.mark.parametrize("name", PLANNED)
def test_dense_families_count_the_published_parameters(tmp_path, name):
    cfg, total = PLANNED[name]
    m = ModelSpec.from_hf_config(_write(tmp_path, cfg))
    assert abs(m.param_count() - total) / total < 0.005, (name, m.param_count())


def test_fields_a_config_leaves_out_take_the_families_defaults():
    assert ModelSpec.from_hf_dict(LLAMA_1_7B, "l").num_kv_heads == 32  # MHA
    gemma = ModelSpec.from_hf_dict(GEMMA_2_9B, "g")
    assert gemma.tie_embeddings and gemma.head_dim == 256 and gemma.q_dim != gemma.hidden_size
    no_head_dim = {k: v for k, v in GEMMA_2_9B.items() if k != "head_dim"}
    assert ModelSpec.from_hf_dict(no_head_dim, "g").head_dim == 256  # not 3584 / 16
    assert not ModelSpec.from_hf_dict({**GEMMA_2_9B, "tie_word_embeddings": False}, "g") \
        .tie_embeddings
    assert ModelSpec.from_hf_dict({**GEMMA_2_9B, "tie_word_embeddings": None}, "g") \
        .tie_embeddings
    # Qwen3Config's head_dim is 128 whatever hidden_size / heads is (Qwen3-0.6B: 1024 / 16)
    qwen3 = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
             "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "vocab_size": 151936, "tie_word_embeddings": True}
    assert ModelSpec.from_hf_dict(qwen3, "q").head_dim == 128
    phi3 = {k: v for k, v in PHI_3_MINI_4K.items() if k != "rms_norm_eps"}
    assert ModelSpec.from_hf_dict(phi3, "p").rms_norm_eps == 1e-5
    assert ModelSpec.from_hf_dict(LLAMA_3_1_8B, "l").max_position_embeddings == 131072


@pytest.mark.parametrize("cfg,field,says", [
    (QWEN3_30B_A3B, "model", "num_experts: 128"),
    (MIXTRAL_8X7B, "model", "num_local_experts: 8"),
    # priced as gated Llama layers these came out 31 % (Pythia), 30 % (Phi-2) too large
    (PYTHIA_6_9B, "model.config.model_type", "'gpt_neox'"),
    (PHI_2, "model.config.model_type", "'phi'"),
    (BERT_BASE, "model.config.model_type", "'bert'"),
    ({"model_type": "gemma3", "text_config": {"hidden_size": 2560}}, "model", "text_config"),
    # sizes past every published model: the planner ran for minutes (layers) or overflowed
    ({**LLAMA_2_7B, "num_hidden_layers": 10**6}, "model.config.num_hidden_layers", "1..1,024"),
    ({**LLAMA_2_7B, "hidden_size": 10**400, "num_attention_heads": 1,
      "num_key_value_heads": 1, "head_dim": 1}, "model.config.hidden_size", "401-digit"),
    ({**LLAMA_2_7B, "vocab_size": 10**19}, "model.config.vocab_size", "1..16,777,216"),
    ({**LLAMA_2_7B, "num_hidden_layers": -4}, "model.config.num_hidden_layers", "-4"),
    ({**LLAMA_3_1_8B, "rope_scaling": {"factor": 1e308}}, "model.config.rope_scaling.factor",
     "1024"),
    ({**LLAMA_3_1_8B, "rope_scaling": {"factor": 2.0, "original_max_position_embeddings":
                                       10**400}},
     "model.config.rope_scaling.original_max_position_embeddings", "401-digit"),
])
def test_unsupported_or_broken_configs_are_one_line_input_errors(cfg, field, says):
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict(cfg, "bad")
    assert e.value.field == field and says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("cfg,says", [
    (QWEN3_30B_A3B, "mixture-of-experts model (num_experts: 128)"),
    (PYTHIA_6_9B, "model.config.model_type: 'gpt_neox'"),
    ({**LLAMA_2_7B, "hidden_size": 10**400, "num_attention_heads": 1,
      "num_key_value_heads": 1, "head_dim": 1}, "model.config.hidden_size"),
    ({k: v for k, v in LLAMA_2_7B.items() if k != "hidden_size"}, "lacks hidden_size"),
    ({**LLAMA_2_7B, "num_hidden_layers": "32"}, "model.config.num_hidden_layers: '32'"),
    ("{'hidden_size': 4096,}", "is not valid JSON"),
    (None, "no config.json"),
])
def test_nereus_plan_refuses_with_one_line_and_exit_2(tmp_path, cfg, says):
    path = _write(tmp_path, cfg) if cfg is not None else str(tmp_path)
    r = CliRunner().invoke(app, ["plan", "--model", path, "--gpus", "16", "--algo", "ppo",
                                 "--json"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: ") and says in r.stderr, r.stderr


def test_every_family_names_its_class_and_only_computed_ones_are_written_back():
    """A Gemma config was read as a Llama one and written back as LlamaForCausalLM (silu, plain
    norms): a checkpoint saved from it would load in transformers as another function."""
    from nereus.spec.model import ARCHITECTURES, COMPUTED, FAMILIES, MODEL_PRESETS

    assert set(ARCHITECTURES) == set(FAMILIES) and COMPUTED <= set(FAMILIES)
    gemma = ModelSpec.from_hf_dict(GEMMA_2_9B, "g")
    assert gemma.model_type == "gemma2" and gemma.hf_class == "Gemma2ForCausalLM"
    with pytest.raises(InputError, match=r"^model\.model_type: 'gemma2': no config\.json"):
        gemma.to_hf_dict()
    for cfg in (LLAMA_3_1_8B, QWEN2_5_7B, QWEN2_5_0_5B, MISTRAL_7B):
        m = ModelSpec.from_hf_dict(cfg, "m")
        assert ModelSpec.from_hf_dict(m.to_hf_dict(), "m") == m, cfg["model_type"]
    for name in ("tiny-qwen3", "qwen3-14b", "tiny-qwen2"):
        m = MODEL_PRESETS[name]
        assert ModelSpec.from_hf_dict(m.to_hf_dict(), name) == m


def test_qwen2_counts_its_qkv_biases_to_the_parameter():
    """Published totals (the hub's safetensors index): Qwen2.5-0.5B 494,032,768 and
    Qwen2.5-7B 7,615,616,512 parameters, q/k/v biases included."""
    for cfg, total in ((QWEN2_5_0_5B, 494_032_768), (QWEN2_5_7B, 7_615_616_512)):
        m = ModelSpec.from_hf_dict(cfg, "q")
        assert m.qkv_bias and m.param_count() == total
    assert not ModelSpec.from_hf_dict(LLAMA_3_1_8B, "l").qkv_bias
    # the Instruct model's config.json differs from the base one in its window only
    from dataclasses import replace

    from nereus.spec.model import MODEL_PRESETS
    instruct = {**QWEN2_5_7B, "max_position_embeddings": 32768}
    assert replace(ModelSpec.from_hf_dict(instruct, "q"), name="qwen2.5-7b-instruct") == \
        MODEL_PRESETS["qwen2.5-7b-instruct"]


@pytest.mark.parametrize("cfg,window", [
    (MISTRAL_7B, 4096),                                   # Mistral-7B-v0.1
    ({**MISTRAL_7B, "sliding_window": None}, None),       # v0.3: null, no window
    ({k: v for k, v in MISTRAL_7B.items() if k != "sliding_window"}, 4096),  # the default
    (QWEN2_5_7B, None),                                   # use_sliding_window false
    # on, but from layer 28 of 28 (max_window_layers): no layer slides, as in transformers
    ({**QWEN2_5_7B, "use_sliding_window": True}, None),
    ({**QWEN2_5_7B, "use_sliding_window": True, "max_window_layers": 20}, 131072),
    (PHI_3_MINI_4K, 2047), (GEMMA_2_9B, 4096), (LLAMA_3_1_8B, None),
    ({**LLAMA_3_1_8B, "sliding_window": 4096}, None),     # LlamaConfig has no such field
], ids=["mistral-v0.1", "mistral-v0.3", "mistral-default", "qwen2.5", "qwen2.5-no-layer",
        "qwen2.5-window", "phi3", "gemma2", "llama", "llama-ignores-it"])
def test_the_sliding_window_is_read_as_the_family_reads_it(cfg, window):
    import transformers

    m = ModelSpec.from_hf_dict(cfg, "m")
    assert m.sliding_window == window
    hf = transformers.AutoConfig.for_model(**cfg)
    slides = any(t == "sliding_attention" for t in getattr(hf, "layer_types", None) or ()) \
        or (cfg["model_type"] in ("mistral", "phi3") and hf.sliding_window is not None)
    assert slides == (window is not None)
    # and the same layers slide as in transformers
    kinds = getattr(hf, "layer_types", None) or (
        ["sliding_attention" if window else "full_attention"] * cfg["num_hidden_layers"])
    assert [m.sliding_layers(range(i, i + 1)) == 1 for i in range(cfg["num_hidden_layers"])] \
        == [k == "sliding_attention" for k in kinds]
    if m.model_type in ("mistral", "qwen2") and window is not None:  # written back as read
        assert ModelSpec.from_hf_dict(m.to_hf_dict(), "m") == m


def test_a_config_with_both_rope_keys_is_read_as_transformers_reads_it():
    """transformers takes rope_scaling over rope_parameters where a config has both."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("rope_parameters is transformers 5's key: 4.x keeps it unread")
    cfg = {**LLAMA_3_1_8B, "rope_theta": None,
           "rope_scaling": {"rope_type": "linear", "factor": 2.0},
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    m = ModelSpec.from_hf_dict(cfg, "m")
    hf = transformers.AutoConfig.for_model(**cfg)
    assert m.rope_scaling is not None and m.rope_scaling.kind == "linear"
    assert hf.rope_parameters["rope_type"] == "linear"
    assert m.rope_theta == hf.rope_parameters["rope_theta"] == 10_000.0


@pytest.mark.parametrize("value", [0, "4096", 2 ** 40])
def test_a_bad_sliding_window_names_the_field(value):
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**MISTRAL_7B, "sliding_window": value}, "m")
    assert e.value.field == "model.config.sliding_window"


def test_a_model_spec_names_a_known_family_and_only_qwen3_norms_q_and_k():
    from dataclasses import replace

    from nereus.spec.model import MODEL_PRESETS
    llama = MODEL_PRESETS["tiny-llama"]
    with pytest.raises(InputError, match=r"^model\.model_type: unknown model_type 'gpt_neox'"):
        replace(llama, model_type="gpt_neox")
    with pytest.raises(InputError, match=r"^model\.qk_norm: True with model_type 'llama'"):
        replace(llama, qk_norm=True)
    assert replace(llama, qk_norm=True, model_type="qwen3").model_type == "qwen3"


def test_the_llama_3_1_config_reads_as_the_preset_with_its_rope_scaling():
    from dataclasses import replace

    from nereus.spec.model import LLAMA3_ROPE, MODEL_PRESETS

    m = ModelSpec.from_hf_dict(LLAMA_3_1_8B, "llama-3.1-8b")
    assert m.rope_scaling == LLAMA3_ROPE and m.rope_theta == 500_000.0
    assert m == replace(MODEL_PRESETS["llama-3.1-8b"], name="llama-3.1-8b")


@pytest.mark.parametrize("cfg", [LLAMA_3_1_8B, QWEN2_5_7B, MISTRAL_7B],
                         ids=["llama-3.1-8b", "qwen2.5-7b", "mistral-7b"])
def test_a_config_transformers_5_wrote_reads_as_the_older_one(cfg):
    """transformers 5 writes rope_theta and the scaling into ``rope_parameters``."""
    import transformers

    old = ModelSpec.from_hf_dict(cfg, "m")
    written = transformers.AutoConfig.for_model(**cfg).to_dict()
    if "rope_parameters" in written:  # transformers >= 5
        assert "rope_theta" not in written
    new = ModelSpec.from_hf_dict(written, "m")
    assert new == old and new.rope_theta == cfg["rope_theta"]


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_a_llama3_scaling_without_its_band_names_the_field(key):
    rope = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**LLAMA_3_1_8B, "rope_scaling": None, key: rope}, "l")
    assert e.value.field == f"model.config.{key}.low_freq_factor"
    rope |= {"low_freq_factor": 4.0}
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**LLAMA_3_1_8B, "rope_scaling": None, key: rope}, "l")
    assert e.value.field == f"model.config.{key}.high_freq_factor"


def _hub_cache(root, repo_id: str, cfg: dict) -> None:
    """A Hugging Face cache holding ``repo_id``'s config.json, laid out as huggingface_hub
    lays it out (refs/main names the snapshot)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg))


def test_a_hugging_face_id_is_read_from_the_local_cache(tmp_path, monkeypatch):
    """verl names its model by hub id; the planner reads that model's cached config.json and
    downloads nothing."""
    import huggingface_hub.constants

    from nereus.spec.model import get_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    _hub_cache(tmp_path, "Qwen/Qwen2.5-7B", QWEN2_5_7B)
    m = get_model("Qwen/Qwen2.5-7B")
    assert m.name == "Qwen2.5-7B" and m.param_count() == 7_615_616_512
    with pytest.raises(InputError) as e:  # not cached: says how to fetch it
        get_model("Qwen/Qwen2.5-72B")
    assert e.value.field == "model"
    assert "`hf download Qwen/Qwen2.5-72B config.json` first" in str(e.value)
    r = CliRunner().invoke(app, ["plan", "--model", "Qwen/Qwen2.5-7B", "--gpus", "16"])
    assert r.exit_code == 0, r.output
    assert "Qwen2.5-7B on 16 x h100" in r.stdout
    for bad in ("Org/a--b", "Org/a..b", "Org/name-", "Org/" + "x" * 97):  # hub's own rules
        with pytest.raises(InputError, match="^model: unknown model"):
            get_model(bad)


@pytest.mark.parametrize("cfg,window,first,every", [
    ({**GEMMA_2_9B, "layer_types": ["full_attention"] * 42}, None, 0, 1),
    ({**QWEN2_5_7B, "use_sliding_window": True,
      "layer_types": ["full_attention"] * 18 + ["sliding_attention"] * 10}, 131072, 18, 1),
    ({**QWEN2_5_7B, "use_sliding_window": False,
      "layer_types": ["sliding_attention"] * 28}, None, 0, 1),  # no window to slide in
], ids=["gemma2-all-full", "qwen-last-10", "qwen-window-off"])
def test_layer_types_in_config_json_are_taken_as_given(cfg, window, first, every):
    import transformers

    m = ModelSpec.from_hf_dict(cfg, "m")
    assert (m.sliding_window, m.window_from if window else 0, m.window_every) == \
        (window, first, every)
    hf = transformers.AutoConfig.for_model(**cfg)
    sliding = sum(t == "sliding_attention" for t in hf.layer_types) \
        if hf.sliding_window is not None else 0
    assert m.sliding_layers(range(cfg["num_hidden_layers"])) == sliding


def test_layer_types_nereus_cannot_keep_are_refused():
    types = ["sliding_attention", "full_attention", "full_attention"] * 14
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**GEMMA_2_9B, "layer_types": types}, "g")
    assert e.value.field == "model.config.layer_types" and "not a pattern" in str(e.value)
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**GEMMA_2_9B, "layer_types": ["full_attention"]}, "g")
    assert e.value.field == "model.config.layer_types" and "1 entries for 42" in str(e.value)


def test_a_window_pattern_is_validated_and_written_back_only_as_its_family_writes_it():
    from dataclasses import replace

    from nereus.spec.model import MODEL_PRESETS

    q = MODEL_PRESETS["qwen2.5-7b-instruct"]
    with pytest.raises(InputError, match=r"^model\.window_every"):
        replace(q, sliding_window=4096, window_every=3)
    with pytest.raises(InputError, match=r"^model\.window_from"):
        replace(q, sliding_window=4096, window_from=-1)
    for bad, field in (({"window_every": 2, "window_from": 4}, "model.window_every"),
                       ({"window_from": 40}, "model.window_from")):
        with pytest.raises(InputError) as e:
            replace(q, sliding_window=4096, **bad).to_hf_dict()
        assert e.value.field == field
    ok = replace(q, sliding_window=4096, window_from=20)
    assert ModelSpec.from_hf_dict(ok.to_hf_dict(), ok.name) == ok


def test_llama_3_2_keeps_its_published_context_window():
    """Llama 3.2-1B's max_position_embeddings (131,072) already is the window its llama3 RoPE
    (factor 32 over 8,192) reaches: it was multiplied again, to 262,144."""
    m = ModelSpec.from_hf_dict(LLAMA_3_2_1B, "llama-3.2-1b")
    assert m.max_position_embeddings == 131072
    assert m.rope_scaling is not None and m.rope_scaling.factor == 32.0
    assert ModelSpec.from_hf_dict(m.to_hf_dict(), m.name) == m


@pytest.mark.parametrize("rope,window", [
    # the factor stretches max_position_embeddings (vLLM's _get_and_verify_max_len)
    ({"rope_type": "linear", "factor": 2.0}, 8192),
    ({"type": "dynamic", "factor": 4.0}, 16384),
    # an original_max_position_embeddings is no base for linear or dynamic
    ({"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 2048}, 8192),
    # YaRN: from original_max_position_embeddings where given, else max_position_embeddings
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),
    ({"rope_type": "yarn", "factor": 4.0}, 16384),
    # never below max_position_embeddings
    ({"rope_type": "yarn", "factor": 1.5, "original_max_position_embeddings": 1024}, 4096),
    # longrope and su (Phi-3): max_position_embeddings is the extended window already
    ({"rope_type": "longrope", "factor": 32.0, "original_max_position_embeddings": 4096}, 4096),
    ({"type": "su", "factor": 32.0, "original_max_position_embeddings": 4096}, 4096),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 1024}, 4096),
], ids=["linear", "dynamic", "linear-original", "yarn-original", "yarn", "yarn-small",
        "longrope", "su", "llama3"])
def test_only_stretching_rope_variants_multiply_the_window(rope, window):
    cfg = {**LLAMA_2_7B, "max_position_embeddings": 4096, "rope_scaling": rope}
    assert ModelSpec.from_hf_dict(cfg, "l").max_position_embeddings == window


@pytest.mark.parametrize("cfg,field,says", [
    ({**LLAMA_3_1_8B, "attention_bias": True}, "model.config.attention_bias",
     ("true: Nereus counts and computes a 'llama' layer without these biases "
      "(allowed: false, or left out)")),
    ({**LLAMA_3_1_8B, "mlp_bias": True}, "model.config.mlp_bias", "(allowed: false, or left out)"),
    ({**LLAMA_3_1_8B, "hidden_act": "gelu"}, "model.config.hidden_act",
     "'gelu' is not the activation of a 'llama' layer"),
    ({**LLAMA_2_7B, "hidden_act": "relu"}, "model.config.hidden_act", "(allowed: silu)"),
    ({**MISTRAL_7B, "hidden_act": "gelu_pytorch_tanh"}, "model.config.hidden_act", "silu"),
    ({**QWEN2_5_7B, "hidden_act": "gelu"}, "model.config.hidden_act", "silu"),
    ({**PHI_3_MINI_4K, "hidden_act": "gelu"}, "model.config.hidden_act", "silu"),
    # Qwen3's attention_bias puts biases on q, k, v and o: none is counted
    ({**LLAMA_3_1_8B, "model_type": "qwen3", "attention_bias": True},
     "model.config.attention_bias", "'qwen3' layer"),
    ({**GEMMA_2_9B, "attention_bias": True}, "model.config.attention_bias", "'gemma2'"),
    # Gemma 2's MLP reads hidden_activation
    ({**GEMMA_2_9B, "hidden_activation": "silu"}, "model.config.hidden_activation",
     "(allowed: gelu_pytorch_tanh, gelu)"),
    ({**GEMMA_2_9B, "model_type": "gemma", "hidden_act": "silu"}, "model.config.hidden_act",
     "gelu_pytorch_tanh"),
    ({**LLAMA_3_1_8B, "attention_bias": "yes"}, "model.config.attention_bias", "'yes'"),
], ids=["llama-attention-bias", "llama-mlp-bias", "llama-gelu", "llama2-relu", "mistral-gelu",
        "qwen2-gelu", "phi3-gelu", "qwen3-attention-bias", "gemma2-attention-bias",
        "gemma2-silu", "gemma-silu", "not-a-switch"])
def test_a_layer_nereus_does_not_count_is_refused_not_read_as_llamas(cfg, field, says):
    """A Llama config with biases or another activation was read as a plain Llama (its
    biases left out of the count) and written back with silu and no biases."""
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict(cfg, "bad")
    assert e.value.field == field and says in str(e.value) and "\n" not in str(e.value)


def test_the_families_own_activations_and_biases_are_read():
    # every family's published activation, and biases left off or false
    for cfg in (LLAMA_3_1_8B, LLAMA_3_2_1B, LLAMA_2_7B, MISTRAL_7B, QWEN2_5_7B, GEMMA_2_9B,
                PHI_3_MINI_4K, {**LLAMA_3_1_8B, "hidden_act": None, "attention_bias": None}):
        ModelSpec.from_hf_dict(cfg, "m")
    # Gemma 1 configs say gelu, which GemmaConfig reads as gelu_pytorch_tanh
    for act in ("gelu", "gelu_pytorch_tanh"):
        g = ModelSpec.from_hf_dict({**GEMMA_2_9B, "model_type": "gemma", "hidden_act": act,
                                    "sliding_window": None}, "g")
        assert g.model_type == "gemma"
    # a key the family's class does not read is not checked: Gemma 2 reads hidden_activation,
    # Qwen2's q/k/v biases are no switch (always on, and counted), Phi-3 has no bias switch
    ModelSpec.from_hf_dict({**GEMMA_2_9B, "hidden_act": "silu"}, "g")
    q = ModelSpec.from_hf_dict({**QWEN2_5_0_5B, "attention_bias": True}, "q")
    assert q.qkv_bias and q.param_count() == 494_032_768
    ModelSpec.from_hf_dict({**PHI_3_MINI_4K, "attention_bias": True}, "p")


def test_a_llama_with_biases_is_refused_by_nereus_plan_with_one_line(tmp_path):
    path = _write(tmp_path, {**LLAMA_3_1_8B, "attention_bias": True, "mlp_bias": True})
    r = CliRunner().invoke(app, ["plan", "--model", path, "--gpus", "16", "--json"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: model.config.attention_bias: true"), r.stderr


@pytest.mark.parametrize("change, field, allowed", [
    ({"num_attention_heads": 30}, "num_attention_heads",
     "(allowed: a divisor of 4096, or a head_dim)"),
    ({"num_key_value_heads": 7}, "num_key_value_heads", "(allowed: 1, 2, 4, 8, 16, 32)"),
])
def test_heads_that_do_not_divide_say_what_would(change, field, allowed):
    """Both errors named the field but not what it allows, as every other error does."""
    with pytest.raises(InputError) as e:
        ModelSpec.from_hf_dict({**LLAMA_3_1_8B, **change}, "m")
    msg = str(e.value)
    assert msg.startswith(f"model.config.{field}: ") and msg.endswith(allowed), msg
