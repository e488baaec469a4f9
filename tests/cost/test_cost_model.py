import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.plan.candidates import enumerate_candidates
from nereus.spec import parse_job


def job(resp=2048, gpus=16, model="llama-3.1-8b", algo="ppo"):
    return parse_job({"model": model, "algo": algo, "gpus": gpus,
                      "workload": {"response_len": resp}})


@pytest.fixture(scope="module")
def cm():
    return CostModel(job())


def test_weight_and_optimizer_memory_match_a_hand_count_and_explain_names_the_terms(cm):
    """actor_train at tp=2, pp=2: the fullest GPU is a last-stage one (the LM head's half is
    as large as the embedding's half, and it also holds the final norm). Counted by hand from
    Llama-3.1-8B's config (hidden 4096, 8 KV heads of 128, MLP 14336, 32 layers, vocab
    128256): 16 layers' matrices and half the LM head split over 2 TP ranks, the norms whole;
    bf16 weights (2 bytes a parameter), fp32 master weights and two Adam moments (12)."""
    e = cm.estimate("actor_train", Candidate(Layout(2, 2), 4, 1, 32))
    assert e.source == "estimated"
    h, kv, ffn, vocab = 4096, 8 * 128, 14336, 128256
    matrices = 2 * h * h + 2 * h * kv + 3 * h * ffn  # q, o; k, v; gate, up, down
    last_stage = (16 * matrices + vocab * h) // 2 + 16 * 2 * h + h  # + layer and final norms
    assert last_stage == 2_007_633_920
    assert e.memory["parameters"] == 2 * last_stage
    assert e.memory["optimizer state"] == 12 * last_stage
    text = e.explain()
    for term in ("compute", "tp_comm", "dp_sync", "bubble", "optimizer", "parameters",
                 "optimizer state", "activations"):
        assert term in text


def test_vectorized_evaluation_equals_single_estimates(cm):
    """The planner prices candidates in bulk; explain() prices one: same numbers."""
    for stage in ("actor_gen", "reference_infer", "actor_train"):
        cands = enumerate_candidates(cm, cm.job.workflow.stage(stage), 16)[:60]
        ev = cm.evaluate(stage, cands)
        for i, c in enumerate(cands):
            e = cm.estimate(stage, c)
            assert ev.latency[i] == pytest.approx(e.latency_s, rel=1e-12)
            assert ev.peak[i] == pytest.approx(e.peak_mem_bytes, abs=8)


@given(st.sampled_from(["actor_gen", "reference_infer", "actor_train", "critic_train"]),
       st.integers(0, 10_000), st.integers(256, 4096), st.integers(1, 4096))
@settings(max_examples=60)
def test_memory_rises_with_response_length(stage, pick, short, extra):
    small, large = CostModel(job(short)), CostModel(job(short + extra))
    cands = enumerate_candidates(small, small.job.workflow.stage(stage), 16)
    c = cands[pick % len(cands)]
    a, b = small.estimate(stage, c), large.estimate(stage, c)
    if stage == "actor_gen":
        # generation fills what memory allows with KV cache; what it needs per sequence rises
        assert large.kv_bytes_per_token(c.layout) * (512 + short + extra) > \
            small.kv_bytes_per_token(c.layout) * (512 + short)
        assert b.latency_s >= a.latency_s
    else:
        assert b.peak_mem_bytes >= a.peak_mem_bytes
        assert b.memory["activations"] > a.memory["activations"]


def test_recomputation_trades_memory_for_time(cm):
    plain = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 16))
    rc = cm.estimate("actor_train", Candidate(Layout(2, 1), 8, 1, 16, recompute=True))
    assert rc.memory["activations"] < plain.memory["activations"]
    assert rc.latency_s > plain.latency_s


def test_efficiency_scales_its_class_inversely(cm):
    c = Candidate(Layout(1, 1), 16, 1, 8)
    base = cm.estimate("reference_infer", c)
    faster = CostModel(cm.job, Efficiencies({OpClass.GEMM: 0.9})).estimate("reference_infer", c)
    gemm_base = sum(o.ideal_s for o in base.ops if o.cls is OpClass.GEMM)
    assert base.latency_s - faster.latency_s == pytest.approx(gemm_base / 0.45 - gemm_base / 0.9)


def test_weight_sync_depends_on_both_layouts(cm):
    same = cm.weight_sync(Layout(2, 1), Layout(2, 1))
    assert same.latency_s == 0 and "already resident" in same.notes[0]
    a = cm.weight_sync(Layout(4, 2), Layout(1, 1))
    b = cm.weight_sync(Layout(2, 1), Layout(1, 1))
    assert a.latency_s > b.latency_s > 0


def test_generation_batch_is_bounded_by_kv_memory():
    long = CostModel(job(8192))
    e = long.estimate("actor_gen", Candidate(Layout(1, 1), 2, 256, 1))
    assert e.fits
    assert e.memory["kv cache"] < 256 * long.kv_bytes_per_token(Layout(1, 1)) * (512 + 8192)
    assert any("decode batch" in n for n in e.notes)


def test_tp_inter_node_costs_more():
    c = Candidate(Layout(8, 1), 2, 1, 32)
    intra = CostModel(job()).estimate("reference_infer", c)
    narrow = parse_job({"model": "llama-3.1-8b", "gpus": 16, "cluster": {"devices_per_node": 4}})
    inter = CostModel(narrow).estimate("reference_infer", c)
    assert inter.terms["tp_comm"] > intra.terms["tp_comm"]
    assert any(o.cls is OpClass.ALLREDUCE_INTER for o in inter.ops)
    assert not np.isnan(inter.latency_s)


def test_a_calibrated_memory_scale_shrinks_the_decode_batch_not_the_fit():
    """Measured memory 20 % above the estimate: the KV cache left for decoding shrinks, so
    generation still fits within the headroom (it used to overflow by the scale)."""
    from nereus.cost.estimate import HEADROOM
    from nereus.cost.model import CostModel
    from nereus.spec import parse_job
    from nereus.spec.workflow import StageKind

    job = parse_job({"model": "llama-3.1-8b", "gpus": 8,
                     "workload": {"response_len": 8192, "prompts_per_step": 1024}})
    cand = enumerate_candidates(CostModel(job), job.workflow.stage("actor_gen"), 8)
    cand = next(c for c in cand if (c.tp, c.pp, c.dp) == (4, 2, 1))
    plain = CostModel(job).estimate("actor_gen", cand)
    scaled = CostModel(job, memory_scale={StageKind.GENERATE: 1.2}).estimate("actor_gen", cand)
    limit = HEADROOM * job.cluster.device.memory_bytes
    assert plain.peak_mem_bytes <= limit and scaled.peak_mem_bytes <= limit * (1 + 1e-9)
    assert scaled.memory["kv cache"] < plain.memory["kv cache"]
    assert scaled.latency_s > plain.latency_s


def test_prefill_pays_the_pipeline_fill():
    """A prefill of c chunks over pp blocks takes c + pp - 1 chunk slots of one block's share:
    with one chunk, deeper pipelines are not faster (the blocks run in turn)."""
    from nereus.cost.model import PREFILL_CHUNK_TOKENS

    small = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
                       "workload": {"response_len": 1024, "prompts_per_step": 8,
                                    "responses_per_prompt": 1, "prompt_len": 512}})
    cm = CostModel(small)

    def prefill_gemm_s(pp, dp):
        e = cm.estimate("actor_gen", Candidate(Layout(1, pp), dp, 8 // dp, 1))
        # the path: the blocks' own turns (term prefill) and the fill's (term bubble)
        return sum(o.ideal_s for o in e.ops if o.name == "prefill GEMMs")

    assert 8 * 512 <= PREFILL_CHUNK_TOKENS  # one chunk
    assert prefill_gemm_s(4, 1) == pytest.approx(prefill_gemm_s(1, 1), rel=1e-9)


# ---- weight sync under asynchronous execution -------------------------------------------------

def _sync_job(execution: str, gpus: int = 16, per_node: int = 8, algo: str = "grpo"):
    return parse_job({"model": "llama-3.1-8b", "algo": algo, "execution": execution,
                      "gpus": gpus, "cluster": {"devices_per_node": per_node}})


LAYOUTS = [Layout(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4)]


@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS),
       st.sampled_from([(8, 8), (16, 8), (16, 4), (32, 8)]))
@settings(max_examples=60, deadline=None)
def test_async_weight_sync_never_costs_less_than_colocated(train, gen, pool):
    """Generation on GPUs of its own has no local overlap to reuse and, on a pool of several
    nodes, crosses the network: for the same layouts it never costs less than colocated sync."""
    gpus, per_node = pool
    colocated = CostModel(_sync_job("sync", gpus, per_node)).weight_sync(train, gen)
    disjoint = CostModel(_sync_job("async", gpus, per_node)).weight_sync(train, gen)
    assert disjoint.latency_s >= colocated.latency_s
    assert disjoint.latency_s > 0  # even the same layout moves every shard


def test_async_weight_sync_moves_each_generation_gpu_its_whole_shard_over_the_network():
    """Async on two nodes: each generation GPU receives full/(tp_g pp_g) bytes on the
    inter-node link (colocated, the same layouts move nothing; it used to be priced alike)."""
    from nereus.spec.model import Head

    job = _sync_job("async", gpus=16, per_node=8)
    cm = CostModel(job)
    full = job.model.param_count(Head.LM) * job.workload.param_bytes
    dev = job.cluster.device
    for train, gen in [(Layout(2, 1), Layout(2, 1)), (Layout(4, 2), Layout(1, 1)),
                       (Layout(1, 1), Layout(4, 1))]:
        e = cm.weight_sync(train, gen)
        wire = [o for o in e.ops if o.cls is OpClass.ALLGATHER_INTER]
        assert len(wire) == 1 and not any(o.cls.value.endswith("intra") for o in e.ops)
        assert wire[0].bytes == pytest.approx(full / gen.size, rel=1e-12)
        assert wire[0].ideal_s == pytest.approx(full / gen.size / dev.inter_node_bw, rel=1e-12)
        hops = max(2, train.size) - 1
        assert e.ideal_by_class()[OpClass.LATENCY_INTER] == pytest.approx(
            hops * dev.inter_latency_s)
    assert CostModel(_sync_job("sync", 16, 8)).weight_sync(Layout(2, 1), Layout(2, 1)).ops == ()


def test_async_weight_sync_stays_on_the_node_fabric_when_the_pool_is_one_node():
    from nereus.spec.model import Head

    job = _sync_job("async", gpus=8, per_node=8)
    e = CostModel(job).weight_sync(Layout(2, 1), Layout(2, 1))
    full = job.model.param_count(Head.LM) * job.workload.param_bytes
    (wire,) = [o for o in e.ops if o.cls is OpClass.ALLGATHER_INTRA]
    assert wire.bytes == pytest.approx(full / 2, rel=1e-12)


@pytest.mark.parametrize("prompts", [8, 64])
def test_prefill_tp_allreduces_follow_the_pipelined_chunks(prompts):
    """Prefill's critical path is (chunks + pp - 1) block turns of num_layers / pp layers each
    (its GEMMs are priced so); every layer all-reduces twice, so the TP all-reduces on the path
    are 2 x num_layers / pp x (chunks + pp - 1). They were counted for ``chunks`` turns only:
    one chunk over pp=4 blocks paid for a quarter of the layers it crosses."""
    from nereus.cost.model import PREFILL_CHUNK_TOKENS

    j = parse_job({"model": "llama-3.1-8b", "gpus": 16,
                   "workload": {"prompts_per_step": prompts, "prompt_len": 512}})
    cm = CostModel(j)
    layers = j.model.num_layers
    chunks = max(1, -(-prompts * 512 // PREFILL_CHUNK_TOKENS))
    gemm = {}
    for pp in (1, 2, 4):
        e = cm.estimate("actor_gen", Candidate(Layout(2, pp), 1, prompts, 1))
        (ar,) = [o for o in e.ops if o.term == "prefill" and o.cls is OpClass.ALLREDUCE_INTRA]
        fill = sum(o.count for o in e.ops
                   if o.term == "bubble" and o.cls is OpClass.ALLREDUCE_INTRA)
        # a block's own turns, and the pipeline's fill it waits through (a bubble: its timers
        # file that as waiting, so calibration leaves it out)
        assert ar.count == pytest.approx(2 * layers / pp * chunks)
        assert fill == pytest.approx(2 * layers / pp * (pp - 1))
        gemm[pp] = sum(o.ideal_s for o in e.ops if o.name == "prefill GEMMs")
    if chunks == 1:  # one chunk crosses every block in turn: same GEMM and all-reduce path
        assert gemm[1] == pytest.approx(gemm[4], rel=1e-9)


def test_collectives_are_priced_from_the_one_alpha_beta_table(cm):
    """``cost.comm`` held a second, scalar copy of the ring formulas that nothing called; the
    cost model now prices every collective from ``cost.comm``'s tables."""
    from nereus.cost.comm import STEPS, WIRE_FRACTION

    m, w = cm.job.model, cm.job.workload
    c = Candidate(Layout(4, 1), 4, 2, 16)
    e = cm.estimate("actor_train", c)
    (ar,) = [o for o in e.ops if o.name == "tp allreduce (attention out, mlp out)"]
    (lat,) = [o for o in e.ops if o.name == "tp allreduce (attention out, mlp out) (latency)"]
    message = c.micro_batch * w.seq_len_mean * m.hidden_size * w.param_bytes
    assert ar.bytes == pytest.approx(float(WIRE_FRACTION["allreduce"](np.float64(4))) * message)
    assert lat.count == pytest.approx(ar.count * float(STEPS["allreduce"](np.float64(4))))
    from nereus.cost import comm
    assert not hasattr(comm, "collective")


@pytest.mark.parametrize("model", ["llama-3.1-8b", "tiny-qwen3"])
def test_decode_streams_every_weight_but_the_input_embedding_once(model):
    """At tp=1 pp=1 a decode iteration reads the layers, the final norm and the LM head; of
    the input embedding only one row per sequence (untied 8B: 16.06 GB priced before, 15.01 GB
    streamed). A tied model reads the shared matrix as its head. Counted on the sharding
    format's shards (padded vocabulary included)."""
    from nereus.spec.model import Head
    from nereus.spec.sharding import EMBED, max_shard_numel, shard_plan

    job = parse_job({"model": model, "gpus": 1, "algo": "ppo"})
    m = job.model
    one = np.array([1.0])
    got = float(CostModel(job)._streamed_numel(Head.LM, one, one)[0])
    embed = sum(s.numel for s in shard_plan(m, Head.LM, 1, 1, 0, 0) if s.name == EMBED)
    want = max_shard_numel(m, Head.LM, 1, 1) - (0 if m.tie_embeddings else embed)
    assert got == want
    # pp=2: the last block (half the layers, the norm and the head) is what streams
    got2 = float(CostModel(job)._streamed_numel(Head.LM, one, np.array([2.0]))[0])
    last = sum(s.numel for s in shard_plan(m, Head.LM, 1, 2, 0, 1))
    assert got2 == last


def test_decode_streams_replicated_kv_heads_past_tp_equal_kv_heads():
    """The 70B model has 8 KV heads: at tp=16 each rank streams a whole KV head's K and V
    projections, not half of one (a review found the stream 2 % short)."""
    from nereus.cost import work
    from nereus.spec.model import Head

    job = parse_job({"model": "llama-3.3-70b", "gpus": 16, "algo": "ppo"})
    m = job.model
    cost = CostModel(job)
    t16 = float(cost._streamed_numel(Head.LM, np.array([16.0]), np.array([1.0]))[0])
    even = (m.num_layers * m.layer_params() + m.embedding_params()) / 16 + m.hidden_size
    replicated = m.num_layers * m.hidden_size * 2 * m.kv_dim * (1 / 8 - 1 / 16)
    assert t16 == pytest.approx(even + replicated, rel=2e-3)
    assert work.kv_share(m.num_kv_heads, 16.0) == 1 / 8

def test_kv_projections_stop_shrinking_at_one_head_per_tp_rank():
    """Past tp = KV heads each rank keeps a whole KV head (the sharding format replicates
    them): per-rank GEMM FLOPs and K/V activations stop dividing there."""
    from nereus.cost import work
    from nereus.spec.model import get_model

    m = get_model("llama-3.3-70b")  # 8 KV heads
    full = 2.0 * work.layer_matmul_params(m)  # one token through one layer, whole
    assert float(work.gemm_flops_per_token_per_rank(m, 8.0)) == pytest.approx(full / 8)
    h = m.hidden_size
    replicated_kv = 2.0 * h * 2 * m.kv_dim * (1 / 8 - 1 / 16)  # K and V at tp=16: 1/8, not 1/16
    assert float(work.gemm_flops_per_token_per_rank(m, 16.0)) == pytest.approx(
        full / 16 + replicated_kv)
    act = work.layer_activation_bytes(m, 2)
    assert act.per_rank(16.0) - act.per_rank(8.0) == pytest.approx(
        (act.split + act.kv) / 16 - (act.split + act.kv) / 8 + act.kv * (1 / 8 - 1 / 16))


def test_decode_flops_count_attention_over_the_mean_context():
    """The compute side of decode's roofline: a token's query attends over the prompt and half
    the response in every layer, 4·ctx·q_dim FLOPs a layer, beside the GEMMs and the head."""
    from nereus.cost import work
    from nereus.spec.model import Head

    job = parse_job({"model": "llama-3.1-8b", "gpus": 8, "algo": "ppo",
                     "cluster": {"device": "a100-sxm-80gb"},
                     "workload": {"prompt_len": 256, "response_len": 768,
                                  "response_len_max": 768, "prompts_per_step": 512}})
    cost = CostModel(job)
    est = cost.estimate("actor_gen", Candidate(Layout(2, 1), 1, 512, 1))  # compute-bound
    row = next(op for op in est.ops if op.name.startswith("decode GEMMs + attention"))
    m, ctx = job.model, 256 + 768 / 2
    per_token = ((work.gemm_flops_per_token_per_rank(m, 2.0)
                  + work.attention_flops(m, 1.0, ctx, causal=False) / 2) * m.num_layers
                 + work.head_flops_per_token(m, Head.LM) / 2)
    # FLOPs per iteration over the sequences that run in it: a whole number of tokens' work
    tokens = row.flops / per_token
    assert tokens == pytest.approx(round(tokens), rel=1e-6) and tokens >= 1


def test_recomputation_reruns_the_layers_not_the_lm_head():
    """Full recomputation adds one forward of the layers (the engine checkpoints each layer);
    the LM head, whose input the loss keeps, still makes forward + 2x backward."""
    from nereus.cost import work
    from nereus.spec.model import Head

    job = parse_job({"model": "llama-3.1-8b", "gpus": 8, "algo": "ppo"})
    cost = CostModel(job)

    def gemm_flops(rc: bool) -> float:
        est = cost.estimate("actor_train", Candidate(Layout(2, 2), 1, 1, 32, rc))
        return next(op.flops for op in est.ops
                    if op.term == "compute" and op.name.startswith("GEMMs"))

    m = job.model
    tokens = float(job.workload.seq_len_mean)  # b = 1
    body = tokens * work.gemm_flops_per_token_per_rank(m, 2.0) * m.num_layers / 2
    head = tokens * work.head_flops_per_token(m, Head.LM) / 2
    assert gemm_flops(False) == pytest.approx(3 * (body + head))
    assert gemm_flops(True) == pytest.approx(4 * body + 3 * head)


# Mistral-7B-v0.1's config.json: every layer attends within 4,096 tokens
MISTRAL_7B_V01 = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "vocab_size": 32000}


def _windowed_pair(tmp_path, resp: int) -> tuple[CostModel, CostModel]:
    import json
    from dataclasses import replace

    path = tmp_path / "mistral"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(MISTRAL_7B_V01))
    windowed = parse_job({"model": str(path), "gpus": 8, "workload": {
        "response_len": resp, "prompt_len": 512, "prompts_per_step": 8}})
    whole = replace(windowed, model=replace(windowed.model, sliding_window=None))
    return CostModel(windowed), CostModel(whole)


def test_a_sliding_window_caps_the_kv_cache_and_its_reads(tmp_path):
    """Past the window a sliding layer keeps and reads only the window's keys and values:
    Mistral v0.1 with 512 + 8,192 tokens holds 4,096 of them per layer, not 8,704; within the
    window the estimate is the whole-attention one."""
    c = Candidate(Layout(1, 1), 1, 8, 1)  # 8 sequences: every one fits, the batch is all of them
    short = [cm.estimate("actor_gen", c) for cm in _windowed_pair(tmp_path, 2048)]
    assert short[0].memory == short[1].memory and short[0].latency_s == short[1].latency_s
    windowed, whole = (cm.estimate("actor_gen", c) for cm in _windowed_pair(tmp_path, 8192))
    assert windowed.memory["kv cache"] == pytest.approx(
        whole.memory["kv cache"] * 4096 / (512 + 8192), rel=1e-12)
    assert windowed.terms["decode"] < whole.terms["decode"]
    mib = [float(n.split("KV cache ")[1].split(" MiB")[0]) for e in (windowed, whole)
           for n in e.notes if "KV cache" in n]
    assert mib[0] == pytest.approx(mib[1] * 4096 / 8704, abs=0.1)


def test_sliding_layers_per_pipeline_block():
    """Gemma 2 slides every other layer from the first; Qwen from max_window_layers on."""
    from dataclasses import replace

    from nereus.spec.model import MODEL_PRESETS

    base = MODEL_PRESETS["llama-3.1-8b"]
    gemma = replace(base, num_layers=42, sliding_window=4096, window_every=2)
    assert [gemma.sliding_layers(range(b * 21, (b + 1) * 21)) for b in range(2)] == [11, 10]
    qwen = replace(base, num_layers=28, sliding_window=4096, window_from=20)
    assert [qwen.sliding_layers(range(b * 14, (b + 1) * 14)) for b in range(2)] == [0, 8]
    assert base.sliding_layers(range(32)) == 0
    # the block that counts holds the most full-attention layers
    cm = CostModel(replace(job(), model=gemma))
    full, slide = cm._layer_kinds(np.array([1.0, 2.0, 3.0]))
    assert full.tolist() == [21, 11, 7] and slide.tolist() == [21, 10, 7]


def test_a_sliding_window_caps_attention_flops(tmp_path):
    """Each query of a sliding layer sees at most the window: causal over s > w tokens,
    w^2/2 + (s - w) w pairs instead of s^2/2; one decode query, w keys. Within the window,
    or without one, the whole-attention count."""
    from nereus.cost import work
    from nereus.spec.model import MODEL_PRESETS

    m = MODEL_PRESETS["llama-3.1-8b"]
    q = m.q_dim
    assert work.attention_flops(m, 8192, 8192, True, 4096) == 4.0 * q * (4096 ** 2 / 2 + 4096 ** 2)
    assert work.attention_flops(m, 2048, 2048, True, 4096) == work.attention_flops(m, 2048, 2048,
                                                                                   True)
    assert work.attention_flops(m, 1, 6000, False, 4096) == 4.0 * q * 4096
    c = Candidate(Layout(1, 1), 1, 1, 8)
    windowed, whole = (cm.estimate("actor_train", c) for cm in _windowed_pair(tmp_path, 8192))
    assert windowed.latency_s < whole.latency_s
    short = [cm.estimate("actor_train", c) for cm in _windowed_pair(tmp_path, 2048)]
    assert short[0].latency_s == short[1].latency_s


def test_a_decode_step_holds_the_mean_of_the_capped_context():
    """Contexts from 512 to 8,704 tokens under a 4,096 window: min(x, 4096) averages 3,312."""
    from nereus.cost.model import _within

    assert _within(4096, 512 + 4096, 512.0) == 3312.0
    assert _within(4096, 2000, 512.0) == 2000  # contexts 512..3,488: never past the window
    assert _within(4096, 6000, 5000.0) == 4096  # always past it
    assert _within(4096, 6000) == 4096 and _within(4096, 100) == 100


def test_explain_keeps_its_columns_aligned_whatever_the_op_names(cm):
    """An op name longer than the name column ("tp allreduce (attention out, mlp out)
    (latency)") pushed its class and count right of every other row's."""
    e = cm.estimate("actor_gen", Candidate(Layout(4, 1), 4, 128, 1))
    ops = [ln for ln in e.explain().splitlines() if ln.startswith("      ") and " x" in ln]
    assert any(len(op.name) > 34 for op in e.ops), [op.name for op in e.ops]
    assert len({ln.index(" x") for ln in ops}) == 1, ops
    assert len({ln.index(" s (ideal") for ln in ops}) == 1, ops
