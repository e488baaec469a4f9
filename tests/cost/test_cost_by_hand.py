"""Cost-model figures checked against hand counts from the formulas of docs/cost-model.md.

Every expected value below is worked out from the published model configuration and the
device datasheet figures, not read back from the code. Unless a test says otherwise the job is
Llama-3.1-8B (h = q = 4096, k = 8 KV heads x 128 = 1024, f = 14336, L = 32, V = 128256, 32
heads, untied) on 16 H100s (2 nodes of 8; NVLink 450 GB/s and 2 us a ring step, network
50 GB/s and 8 us, HBM 3.35 TB/s, host link 64 GB/s, 989.4 TFLOP/s), prompt 512 + response
512 tokens (s = 1024 for time and memory), 512 prompts a step in 4 PPO mini-batches (U = 4
updates a step), bf16 parameters (B_p = 2), fp32 gradients (B_g = 4), Adam with fp32 master
weights (B_o = 12).
"""

import pytest

from nereus.cost.calibrate import Calibrator
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.spec import parse_job
from nereus.spec.workflow import StageKind

H, Q, K, F, L, V, HEADS = 4096, 4096, 1024, 14336, 32, 128256, 32
S = 1024          # tokens a sequence (prompt + response)
U = 4             # optimizer updates a step
PEAK = 989.4e12
# GEMM FLOPs per token per layer, forward: 2 (h (2q + 2k) + 3 h f)
#   = 2 (4096 * 10240 + 3 * 4096 * 14336) = 2 * 218_103_808
G = 436_207_616
# LM-head FLOPs per token: 2 h V
HEAD = 1_050_673_152
# Parameters on the fullest GPU at tp = 2, pp = 1: half of 32 layers' matrices
# (2 h^2 + 2 h k + 3 h f = 218_103_808 each), the embedding and the LM head (V h each), plus the
# norms whole (2 h a layer and the final h): (32 * 218_103_808 + 2 * 525_336_576) / 2
# + 32 * 8192 + 4096 = 4_014_997_504 + 266_240
N_TP2 = 4_015_263_744


def job(model="llama-3.1-8b", prompt=512, response=512, gpus=16):
    return parse_job({"model": model, "algo": "ppo", "gpus": gpus,
                      "workload": {"prompt_len": prompt, "response_len": response}})


@pytest.fixture(scope="module")
def cm():
    return CostModel(job())


def op(e, term, name):
    got = [o for o in e.ops if o.term == term and o.name == name]
    assert len(got) == 1, [(o.term, o.name) for o in e.ops]
    return got[0]


def test_training_compute_flops_match_the_megatron_count(cm):
    """actor_train tp=1 pp=1 b=1 a=8 (U a = 32 micro-batches on the path).
    GEMMs per micro-batch: 3 passes x s L G + 3 s x 2hV
      = 3 * 1024 * 32 * 436_207_616 + 3 * 1024 * 1_050_673_152.
    Attention per micro-batch: 3 passes x L x (4 s^2 q) / 2 (causal)
      = 3 * 32 * 2 * 1024^2 * 4096 = 824_633_720_832."""
    e = cm.estimate("actor_train", Candidate(Layout(1, 1), 16, 1, 8))
    gemm = op(e, "compute", "GEMMs (layers + head)")
    assert gemm.count == 32
    assert gemm.flops == 3 * S * L * G + 3 * S * HEAD
    assert gemm.ideal_s == pytest.approx(32 * gemm.flops / PEAK, rel=1e-12)
    attn = op(e, "compute", "attention")
    assert attn.flops == 824_633_720_832
    assert attn.ideal_s == pytest.approx(32 * 824_633_720_832 / PEAK, rel=1e-12)


def test_training_bubble_is_pp_minus_one_slots_per_update(cm):
    """actor_train tp=1 pp=4 a=8: per update a = 8 micro-batch slots of work and p - 1 = 3
    idle slots, so the bubble GEMMs run U (p - 1) = 12 times against U a = 32 (ratio 3/8)."""
    e = cm.estimate("actor_train", Candidate(Layout(1, 4), 4, 1, 8))
    work = op(e, "compute", "GEMMs (layers + head)")
    idle = op(e, "bubble", "GEMMs (layers + head)")
    assert (work.count, idle.count) == (32, 12)
    assert idle.ideal_s / work.ideal_s == pytest.approx(3 / 8, rel=1e-12)


def test_forward_bubble_is_pp_minus_one_slots(cm):
    """reference_infer tp=1 pp=4 b=4 a=32: one pass; a = 32 slots of work and p - 1 = 3 idle,
    each slot 4 s (L/4) G + 4 s 2hV FLOPs = 4096 * 8 * 436_207_616 + 4096 * 1_050_673_152."""
    e = cm.estimate("reference_infer", Candidate(Layout(1, 4), 4, 4, 32))
    work = op(e, "compute", "GEMMs (layers + head)")
    idle = op(e, "bubble", "GEMMs (layers + head)")
    assert (work.count, idle.count) == (32, 3)
    assert idle.flops == 4 * S * 8 * G + 4 * S * HEAD


def test_tp_and_pp_collectives_per_micro_batch(cm):
    """actor_train tp=2 pp=2 a=8, one node (intra). TP: 4 all-reduces per layer (2 forward,
    2 backward) x 16 layers x 32 micro-batches = 2048, 6 per layer with recomputation = 3072;
    each moves 2(n-1)/n = 1 x b s h B_p = 1024 * 4096 * 2 = 8_388_608 bytes in 2(n-1) = 2
    ring steps (4096 and 6144 latency steps of 2 us). PP: 2 p2p a micro-batch = 64 of
    8_388_608 bytes."""
    for rc, calls in ((False, 2048), (True, 3072)):
        e = cm.estimate("actor_train", Candidate(Layout(2, 2), 4, 1, 8, rc))
        ar = op(e, "tp_comm", "tp allreduce (attention out, mlp out)")
        assert (ar.cls, ar.count, ar.bytes) == (OpClass.ALLREDUCE_INTRA, calls, 8_388_608)
        assert ar.ideal_s == pytest.approx(calls * 8_388_608 / 450e9, rel=1e-12)
        lat = op(e, "tp_comm", "tp allreduce (attention out, mlp out) (latency)")
        assert lat.count == 2 * calls
        assert lat.ideal_s == pytest.approx(2 * calls * 2e-6, rel=1e-12)
    p2p = op(e, "pp_comm", "pp activation send/recv")
    assert (p2p.cls, p2p.count, p2p.bytes) == (OpClass.P2P_INTRA, 64, 8_388_608)


def test_no_pipeline_traffic_at_pp_1(cm):
    """pp = 1 has no pipeline hop: no pp_comm term at all."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 2))
    assert "pp_comm" not in e.terms
    assert not [o for o in e.ops if o.name.startswith("pp activation")]


def test_a_pipeline_over_two_nodes_hops_on_the_network(cm):
    """tp=4 pp=4 fills 16 GPUs, blocks 0-1 on node 0 and 2-3 on node 1 (TP innermost): the
    hop between blocks 1 and 2 crosses nodes, so the p2p is priced at 50 GB/s, although pp = 4
    alone would fit a node."""
    e = cm.estimate("actor_train", Candidate(Layout(4, 4), 1, 1, 32))
    p2p = op(e, "pp_comm", "pp activation send/recv")
    assert p2p.cls is OpClass.P2P_INTER
    assert p2p.ideal_s == pytest.approx(p2p.count * S * H * 2 / 50e9, rel=1e-12)


def test_dp_gradient_allreduce_ring_and_link(cm):
    """tp=2 pp=1 dp=8: one DP group (a TP rank across the 8 replicas) holds GPUs 0, 2, ..., 14
    on both nodes, so it runs on the network even though dp = 8 would fit a node. Per update
    one all-reduce of N B_g = 4_015_263_744 * 4 bytes over 8 ranks: 2(n-1)/n = 7/4 of it on the
    wire, 2(n-1) = 14 steps of 8 us; 4 updates a step."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 2))
    ar = op(e, "dp_sync", "gradient allreduce")
    wire = 7 / 4 * N_TP2 * 4
    assert ar.cls is OpClass.ALLREDUCE_INTER
    assert (ar.count, ar.bytes) == (U, pytest.approx(wire, rel=1e-12))
    assert ar.ideal_s == pytest.approx(U * wire / 50e9, rel=1e-12)
    lat = op(e, "dp_sync", "gradient allreduce (latency)")
    assert lat.count == U * 14
    assert lat.ideal_s == pytest.approx(U * 14 * 8e-6, rel=1e-12)


def test_one_replica_syncs_no_gradients(cm):
    """dp = 1: nothing to all-reduce across replicas, and the model is untied: no dp_sync."""
    e = cm.estimate("actor_train", Candidate(Layout(8, 2), 1, 1, 32))
    assert "dp_sync" not in e.terms


def test_tied_embedding_gradient_is_reduced_between_first_and_last_block():
    """tiny-qwen3 (tied, V = 250, h = 64) tp=1 pp=2: per update one all-reduce over the 2
    blocks of the V/t h B_g = 250 * 64 * 4 = 64_000-byte gradient, 2(n-1)/n = 1 of it on the
    wire; 4 updates a step."""
    e = CostModel(job("tiny-qwen3", 64, 64)).estimate(
        "actor_train", Candidate(Layout(1, 2), 8, 1, 16))
    ar = op(e, "dp_sync", "tied embedding grad (first<->last block)")
    assert (ar.count, ar.bytes) == (U, 64_000)


def test_optimizer_traffic_and_offload_bytes(cm):
    """tp=2 pp=1: Adam reads and writes the bf16 parameter (2 x 2), reads the fp32 gradient
    (4), reads and writes the fp32 master (2 x 4) and both fp32 moments (16): 32 bytes a
    parameter, per update, over 3.35 TB/s. Offload: reload and offload N (B_p + B_o) =
    N (2 + 12) bytes over the 64 GB/s host link."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 2))
    opt = op(e, "optimizer", "optimizer step")
    assert (opt.count, opt.bytes) == (U, 32 * N_TP2)
    assert opt.ideal_s == pytest.approx(U * 32 * N_TP2 / 3.35e12, rel=1e-12)
    host = op(e, "offload", "reload + offload params and optimizer state")
    assert host.bytes == 2 * 14 * N_TP2
    assert host.ideal_s == pytest.approx(2 * 14 * N_TP2 / 64e9, rel=1e-12)


def test_training_memory_terms_at_tp2(cm):
    """tp=2 pp=1 b=1 a=2, no recomputation. Parameters N B_p, gradients N B_g, optimizer
    N 12. Activations per token per layer on a TP rank: 4 h B_p = 32_768 replicated +
    (2 q B_p + 3 f B_p + 4 heads) / t = 102_528 / 2 + K and V 2 k B_p / t = 4096 / 2:
    86_080. One block of 32 layers holds min(p, a) = 1 micro-batch of 1024 tokens:
    32 * 1024 * 86_080 = 2_820_669_440; the last block adds 8 bytes a logit on its V/t
    columns: 8 * 1024 * 128_256 / 2 = 525_336_576, total 3_346_006_016."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 2))
    assert e.memory["parameters"] == 2 * N_TP2
    assert e.memory["gradients"] == 4 * N_TP2
    assert e.memory["optimizer state"] == 12 * N_TP2
    assert e.memory["activations"] == 3_346_006_016
    assert e.memory["workspace"] == 2 * 1024**3


def test_training_activations_at_tp1_last_block(cm):
    """tp=1 pp=1 b=1 a=8: per token per layer 32_768 + 102_528 + 4096 = 139_392 bytes;
    32 layers x 1024 tokens = 4_567_597_056, plus 8 * 1024 * 128_256 = 1_050_673_152 of
    logits: 5_618_270_208."""
    e = cm.estimate("actor_train", Candidate(Layout(1, 1), 16, 1, 8))
    assert e.memory["activations"] == 5_618_270_208


def test_first_block_holds_min_pp_a_micro_batches(cm):
    """tp=2 pp=4 b=1 a=2: 8 layers a block, 86_080 bytes a token a layer: one micro-batch is
    8 * 1024 * 86_080 = 705_167_360. The first block holds min(p, a) = 2 of them
    (1_410_334_720); the last one plus 525_336_576 of logits (1_230_503_936): the first
    is the fullest."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 4), 2, 1, 2))
    assert e.memory["activations"] == 1_410_334_720


def test_recomputation_keeps_layer_inputs_plus_one_layer():
    """tp=8 pp=2 b=1 a=4, full recomputation. A layer input, whole on every TP rank:
    1024 * 4096 * 2 = 8_388_608 bytes; 16 layers: 134_217_728 per micro-batch. One layer's
    full activations at tp = 8: 32_768 + 102_528 / 8 + 4096 / 8 = 46_096 bytes a token,
    47_202_304 for 1024 tokens. First block: min(p, a) = 2 micro-batches of inputs + one layer
    = 315_637_760. Last block: one micro-batch + one layer + 8 * 1024 * 128_256 / 8 =
    131_334_144 of logits = 312_754_176. Without recomputation the last block would hold
    16 * 47_202_304 + 131_334_144 = 886_571_008."""
    cm = CostModel(job())
    e = cm.estimate("actor_train", Candidate(Layout(8, 2), 1, 1, 4, True))
    assert e.memory["activations"] == 315_637_760
    e = cm.estimate("actor_train", Candidate(Layout(8, 2), 1, 1, 4, False))
    # the first block holds 2 micro-batches of 16 layers: 2 * 16 * 47_202_304
    assert e.memory["activations"] == 1_510_473_728


def test_recomputation_last_block_when_it_is_the_fullest(cm):
    """tp=2 pp=4 b=1 a=8 with recomputation: layer inputs 8 * 1024 * 4096 * 2 = 67_108_864 a
    micro-batch; one layer 1024 * 86_080 = 88_145_920; first block 4 * 67_108_864 +
    88_145_920 = 356_581_376; last block 67_108_864 + 88_145_920 + 525_336_576 of logits =
    680_591_360, the larger."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 4), 1, 1, 8, True))
    assert e.memory["activations"] == 680_591_360


def test_forward_memory_counts_two_boundary_buffers_per_micro_batch_in_flight(cm):
    """reference_infer tp=1 pp=2 b=1 a=4: one layer's live tensors 2 h B_p + (2 q + 2 f) B_p +
    2 k B_p = 16_384 + 73_728 + 4096 = 94_208 bytes a token (96_468_992 for 1024); boundary
    buffers 2 min(p, a) b s h B_p = 2 * 2 * 1024 * 4096 * 2 = 33_554_432; logits
    8 * 1024 * 128_256 = 1_050_673_152. Total 1_180_696_576."""
    e = cm.estimate("reference_infer", Candidate(Layout(1, 2), 8, 1, 4))
    assert e.memory["activations"] == 1_180_696_576


def test_kv_cache_bytes_per_token(cm):
    """2 (K and V) x L/p layers x max(1, kv_heads / t) heads x 128 x 2 bytes:
    tp=1 pp=1: 2 * 32 * 8 * 128 * 2 = 131_072; tp=2 pp=2: 2 * 16 * 4 * 128 * 2 = 32_768;
    tp=16 pp=1 (one KV head replicated per rank): 2 * 32 * 1 * 128 * 2 = 16_384."""
    assert cm.kv_bytes_per_token(Layout(1, 1)) == 131_072
    assert cm.kv_bytes_per_token(Layout(2, 2)) == 32_768
    assert cm.kv_bytes_per_token(Layout(16, 1)) == 16_384


def test_the_fit_may_go_far_below_the_prior_down_to_the_least_efficiency():
    """50 rows of GEMM work ideal 1 s, measured 100 s, all in one step (weight 1). The relative
    least squares with the ridge toward the prior x0 = 1/0.45 at its floor (0.02/0.5)^2 (the
    fading ridge 0.02/51 is below it): lam^2 = 0.0016 / x0^2 = 0.000324, rows a = 1/100,
    b = 1, so x = (50 * 0.01 + 0.000324 x0) / (50 * 0.0001 + 0.000324) = 94.0496...:
    efficiency 0.010633 (well above the 1e-6 clip, below any 0.1-ish clamp)."""
    cal = Calibrator(prior=Efficiencies(device="h100-sxm-80gb"))
    for _ in range(50):
        cal.observe_op(OpClass.GEMM, 1.0, 100.0)
    x0 = 1 / 0.45
    lam2 = 0.0016 / x0**2
    x = (50 * 0.01 + lam2 * x0) / (50 * 1e-4 + lam2)
    assert cal.efficiencies()[OpClass.GEMM] == pytest.approx(1 / x, rel=1e-9)
    assert cal.efficiencies()[OpClass.GEMM] == pytest.approx(0.010633, rel=1e-4)


def test_memory_scale_is_the_mean_of_the_last_twenty_ratios():
    """Ratios 1.0 and 2.0 average to 1.5; after 20 more of 1.2 only those count: 1.2."""
    cal = Calibrator()
    cal.observe_memory(StageKind.TRAIN, 100, 100)
    cal.observe_memory(StageKind.TRAIN, 100, 200)
    assert cal.memory_scale()[StageKind.TRAIN] == pytest.approx(1.5)
    for _ in range(20):
        cal.observe_memory(StageKind.TRAIN, 100, 120)
    assert cal.memory_scale()[StageKind.TRAIN] == pytest.approx(1.2)
