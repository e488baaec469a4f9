"""The spec layer's figures against their published sources: the models' config.json files as
published on the Hugging Face hub, vendor datasheets, transformers' config defaults, and values
derived by hand. None of the expected values below is computed by Nereus."""

import pytest

from nereus.spec import parse_job
from nereus.spec.device import DEVICE_PRESETS, GB, GiB, MiB, gib
from nereus.spec.model import MODEL_PRESETS, ModelSpec
from nereus.spec.workflow import Execution, get_workflow

# Hugging Face hub config.json files (fields that only tokenizers or generation read left out)
# meta-llama/Llama-3.3-70B-Instruct
LLAMA_3_3_70B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 8192, "intermediate_size": 28672,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "vocab_size": 128256}
# Qwen/Qwen3-14B
QWEN3_14B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 17408,
    "max_position_embeddings": 40960, "max_window_layers": 40, "model_type": "qwen3",
    "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
    "vocab_size": 151936}
# Qwen/Qwen3-32B
QWEN3_32B = {
    **QWEN3_14B, "intermediate_size": 25600, "max_window_layers": 64,
    "num_attention_heads": 64, "num_hidden_layers": 64}


@pytest.mark.parametrize("name,cfg", [("llama-3.3-70b", LLAMA_3_3_70B),
                                      ("qwen3-14b", QWEN3_14B), ("qwen3-32b", QWEN3_32B)])
def test_presets_are_their_published_config_json(name, cfg):
    """Every field, exactly: the parameter-count test allows 0.5 %, which a vocabulary of
    128,000 instead of 128,256 passes."""
    assert ModelSpec.from_hf_dict(cfg, name) == MODEL_PRESETS[name]


def test_a_qwen_window_left_without_max_window_layers_starts_at_layer_28():
    """Qwen2Config's and Qwen3Config's default max_window_layers is 28 (transformers): with
    use_sliding_window, layers 28..31 of 32 slide."""
    cfg = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "use_sliding_window": True, "sliding_window": 4096}
    m = ModelSpec.from_hf_dict(cfg, "m")
    assert (m.sliding_window, m.window_from, m.window_every) == (4096, 28, 1)
    assert m.sliding_layers(range(32)) == 4


def test_h100_sxm_datasheet_figures():
    """NVIDIA H100 SXM5 80GB datasheet: 989.4 TFLOP/s dense BF16 (1,979 with sparsity), HBM3
    3.35 TB/s, NVLink 4 900 GB/s both directions; ConnectX-7 NDR 400 Gb/s per GPU; PCIe Gen5
    x16 64 GB/s. Memory: the 80 GB part's total as CUDA reports it, 81,559 MiB
    (torch total_memory 85,520,809,984 B), below 80 GiB."""
    d = DEVICE_PRESETS["h100-sxm-80gb"]
    assert d.peak_flops == 989.4e12 and d.hbm_bw == 3.35e12
    assert d.memory_bytes == 85_520_809_984 and 80e9 < d.memory_bytes < 80 * GiB
    assert d.intra_node_bw == 900e9 / 2 and d.inter_node_bw == 400e9 / 8
    assert d.host_bw == 64e9 and d.devices_per_node == 8


def test_a100_sxm_datasheet_figures():
    """NVIDIA A100 SXM4 80GB datasheet: 312 TFLOP/s dense BF16, HBM2e 2,039 GB/s, NVLink 3
    600 GB/s both directions; DGX A100: one HDR 200 Gb/s InfiniBand port per GPU; PCIe Gen4
    x16 32 GB/s."""
    d = DEVICE_PRESETS["a100-sxm-80gb"]
    assert d.peak_flops == 312e12 and d.hbm_bw == 2.039e12 and d.memory_bytes == 80 * GiB
    assert d.intra_node_bw == 600e9 / 2 and d.inter_node_bw == 200e9 / 8
    assert d.host_bw == 32e9


def test_mi250x_datasheet_figures_per_gcd():
    """AMD Instinct MI250X datasheet, per OAM: 383 TFLOP/s peak BF16, 128 GB HBM2e at
    3.2768 TB/s; ROCm shows each of its two GCDs as a device, so half of each."""
    d = DEVICE_PRESETS["mi250x"]
    assert d.peak_flops == 383e12 / 2 and d.hbm_bw == 3.2768e12 / 2
    assert d.memory_bytes == 128 * GiB // 2
    assert d.inter_node_bw == 4 * 25 * GB / 8  # Frontier: 4 Slingshot-11 NICs for 8 GCDs


@pytest.mark.parametrize("nbytes,text", [
    (GiB, "1.0 GiB"),              # from 1 GiB up: one decimal
    (80 * GiB, "80.0 GiB"),
    (1.25 * GiB, "1.2 GiB"),       # 1.25 rounds half to even
    (GiB / 2, "0.5 GiB"),          # below: three significant digits
    (5 * MiB, "0.00488 GiB"),      # 5 / 1024 = 0.0048828...
])
def test_gib_formats_by_hand(nbytes, text):
    assert gib(nbytes) == text


@pytest.mark.parametrize("algo", ["ppo", "grpo", "remax"])
def test_async_execution_is_kept_and_has_no_colocated_sync(algo):
    sync, asyn = get_workflow(algo, "sync"), get_workflow(algo, "async")
    assert sync.execution is Execution.SYNC and asyn.execution is Execution.ASYNC
    assert sync.colocated_sync() == ("actor_train", "actor_gen")
    assert asyn.colocated_sync() is None
    assert asyn.weight_sync() == ("actor_train", "actor_gen")


@pytest.mark.parametrize("gpus,nodes,per_node,by_node", [
    (2, 1, 2, {0: (0, 1)}),                               # fewer than a node: one node of 2
    (12, 2, 8, {0: tuple(range(8)), 1: (8, 9, 10, 11)}),  # ceil(12 / 8) = 2 nodes of 8
])
def test_a_gpu_count_gets_the_smallest_cluster_of_h100_nodes(gpus, nodes, per_node, by_node):
    """A pool that is not a multiple of the node size (8 H100s per node) builds; the cluster
    is the fewest whole nodes that hold it."""
    job = parse_job({"model": "tiny-llama", "gpus": gpus})
    assert (job.cluster.num_nodes, job.cluster.devices_per_node) == (nodes, per_node)
    assert job.pool.size == gpus and job.pool.by_node() == by_node
