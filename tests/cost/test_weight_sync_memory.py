"""Memory of the colocated weight sync: between training and generation a GPU holds its
training parameters (the sync reads them) and its generation shard (the sync writes it), plus
one gathered tensor, but no gradients, optimizer state or KV cache. That moment is priced by
neither stage's peak, and can exceed both."""

import math

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import SYNC_GATHER_COPIES, CostModel
from nereus.spec import parse_job
from nereus.spec.model import MODEL_PRESETS, Head
from nereus.spec.sharding import max_shard_numel, padded_vocab, shard_numel
from nereus.spec.workflow import StageKind

GiB = 1024**3


def _job(model="llama-3.3-70b", gpus=128, execution="sync"):
    return parse_job({"model": model, "algo": "ppo", "execution": execution, "gpus": gpus,
                      "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
                      "workload": {"prompts_per_step": 512, "prompt_len": 512,
                                   "response_len": 2048, "response_len_max": 2048,
                                   "ppo_mini_batches": 4}})


def test_the_sync_peak_counts_the_training_parameters_beside_the_incoming_shard():
    """The 70B PPO example's pool (128 H100s): training tp=2 pp=16 with recomputation fits
    (50.2 GiB), generation tp=2 pp=1 fits (71.3 GiB of 71.7 allowed: its KV cache takes what
    the weights leave). Between them each GPU holds 4.96 GiB of training parameters and the
    65.7 GiB generation shard it receives, plus the gathered embedding (2 x 1.96 GiB) and the
    workspace: 76.6 GiB, over the limit. The sync's estimate said it held nothing."""
    job = _job()
    cost = CostModel(job)
    limit = HEADROOM * cost.device.memory_bytes
    train = Candidate(Layout(2, 16), 4, 1, 32, recompute=True)
    gen = Candidate(Layout(2, 1), 64, 8, 1)
    t, g = cost.estimate("actor_train", train), cost.estimate("actor_gen", gen)
    assert t.fits and g.fits
    sync = cost.weight_sync(train, gen)
    m, w = job.model, job.workload
    assert sync.memory == {
        "training parameters": max_shard_numel(m, Head.LM, 2, 16) * w.param_bytes,
        "generation weights": max_shard_numel(m, Head.LM, 2, 1) * w.param_bytes,
        "gather buffer": SYNC_GATHER_COPIES * padded_vocab(m, 2) * m.hidden_size * w.param_bytes,
        "workspace": 2 * GiB,
    }
    assert sync.peak_mem_bytes / GiB == pytest.approx(76.59, abs=0.01)
    assert sync.peak_mem_bytes > max(t.peak_mem_bytes, g.peak_mem_bytes)
    assert not sync.fits
    # without any gather buffer it still does not fit: the verdict does not hang on that count
    assert sync.peak_mem_bytes - sync.memory["gather buffer"] > limit
    # the stages' own peaks hold what the sync does not: gradients, optimizer state, KV cache
    assert {"gradients", "optimizer state"} <= set(t.memory) and "kv cache" in g.memory


@pytest.mark.parametrize("model,lay", [
    ("llama-3.1-8b", [Layout(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8)]),
    ("tiny-qwen3", [Layout(tp, pp) for tp in (1, 2, 4) for pp in (1, 2, 4)]),  # tied head
    ("qwen3-14b", [Layout(tp, pp) for tp in (1, 4) for pp in (1, 4, 5, 8, 10)]),
])
def test_the_fullest_gpu_holds_the_fullest_shard_of_each_layout(model, lay):
    """The sync's memory adds the fullest training and the fullest generation shard. The rank
    mapping (GPU k holds training position k mod size_t, generation position k mod size_g)
    puts them together: element by element over a period of GPUs, the largest sum is that."""
    m = MODEL_PRESETS[model]
    for lt in lay:
        for lg in lay:
            st, sg = lt.size, lg.size
            most = max(shard_numel(m, Head.LM, lt.tp, lt.pp, k % st % lt.tp, k % st // lt.tp)
                       + shard_numel(m, Head.LM, lg.tp, lg.pp, k % sg % lg.tp, k % sg // lg.tp)
                       for k in range(math.lcm(st, sg)))
            assert most == (max_shard_numel(m, Head.LM, lt.tp, lt.pp)
                            + max_shard_numel(m, Head.LM, lg.tp, lg.pp)), (lt, lg)


def test_every_receiver_kind_reports_the_fullest_gpu_of_the_sync():
    """Generation on 16 GPUs, training on 8: the sync is priced by the GPUs that hold no
    training shard (they receive more), but its memory is the GPUs that hold both."""
    cost = CostModel(_job("llama-3.1-8b", 16))
    train, gen = Candidate(Layout(4, 2), 1, 1, 128), Candidate(Layout(4, 1), 4, 128, 1)
    sync = cost.weight_sync(train, gen)
    assert any("hold no training shard" in n for n in sync.notes)
    assert sync.memory == cost.weight_sync_memory(train.layout, gen.layout)
    assert sync.memory["training parameters"] > 0


def test_equal_layouts_gather_nothing_and_the_training_peak_covers_them():
    """Same layout on both sides: each generation shard is the training shard on its GPU,
    copied whole; the GPU holds two copies of its parameters, under the training peak (which
    adds gradients and optimizer state)."""
    cost = CostModel(_job("llama-3.1-8b", 16))
    lay = Layout(4, 1)
    train = Candidate(lay, 4, 1, 32)
    sync = cost.weight_sync(train, Candidate(lay, 4, 128, 1))
    assert sync.latency_s == 0 and sync.memory["gather buffer"] == 0
    assert sync.memory["training parameters"] == sync.memory["generation weights"]
    assert sync.peak_mem_bytes < cost.estimate("actor_train", train).peak_mem_bytes


def test_memory_calibration_scales_each_side_as_its_stage():
    job = _job("llama-3.1-8b", 16)
    plain = CostModel(job).weight_sync_memory(Layout(2, 2), Layout(4, 1))
    scaled = CostModel(job, memory_scale={StageKind.TRAIN: 1.5, StageKind.GENERATE: 0.5}
                       ).weight_sync_memory(Layout(2, 2), Layout(4, 1))
    assert scaled["training parameters"] == int(1.5 * plain["training parameters"])
    assert scaled["generation weights"] == int(0.5 * plain["generation weights"])
    assert scaled["gather buffer"] == plain["gather buffer"]


def test_asynchronous_generation_holds_no_sync_memory_here():
    """Asynchronous execution: generation has GPUs of its own; nothing of training sits
    beside the incoming shard."""
    cost = CostModel(parse_job({"model": "llama-3.1-8b", "algo": "grpo", "execution": "async",
                                "gpus": 16, "cluster": {"devices_per_node": 8}}))
    assert cost.weight_sync_memory(Layout(2, 2), Layout(4, 1)) == {}
    assert cost.weight_sync(Layout(2, 2), Layout(4, 1)).memory == {}
