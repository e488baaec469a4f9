"""Colocated weight sync when generation spans more GPUs than training: the extra generation
GPUs hold no training shard and receive their whole shard, on the node fabric when they share a
node with training GPUs, over the network when not."""

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel, SyncReceivers, least_overlap
from nereus.cost.ops import OpClass
from nereus.spec import parse_job
from nereus.spec.model import MODEL_PRESETS, Head
from nereus.spec.sharding import layer_range, layout_problem


def _job(gpus, per_node=8, execution="sync", algo="ppo"):
    return parse_job({"model": "llama-3.1-8b", "algo": algo, "execution": execution,
                      "gpus": gpus, "cluster": {"devices_per_node": per_node},
                      "workload": {"response_len": 1024, "prompts_per_step": 64}})


def _full_bytes(job) -> float:
    return job.model.param_count(Head.LM) * job.workload.param_bytes


def test_generation_gpus_on_a_node_without_training_receive_their_shard_over_the_network():
    """The planner's plan for PPO on 2 x 8 H100s used to be actor_gen tp=4 dp=4 (16 GPUs) with
    actor_train tp=4 pp=2 dp=1 (8 GPUs) and price the sync as colocated (7.5 ms on NVLink).
    The second node's 8 generation GPUs hold no actor shard: each receives full/4 (4 GB) over
    the network."""
    job = _job(16)
    cm = CostModel(job)
    train = Candidate(Layout(4, 2), 1, 1, 16)
    gen = Candidate(Layout(4, 1), 4, 16, 1)
    assert cm.sync_receivers(train.gpus, gen.gpus) == SyncReceivers(8, 0, 8)
    e = cm.weight_sync(train, gen)
    (wire,) = [o for o in e.ops if o.cls is OpClass.ALLGATHER_INTER]
    assert not any(o.cls is OpClass.ALLGATHER_INTRA for o in e.ops)
    assert wire.bytes == pytest.approx(_full_bytes(job) / 4, rel=1e-12)
    assert wire.ideal_s == pytest.approx(_full_bytes(job) / 4 / job.cluster.device.inter_node_bw)
    colocated = cm.weight_sync(train.layout, gen.layout)  # counts unknown: every GPU holds one
    assert colocated.latency_s == pytest.approx(0.007449, rel=1e-3)
    assert e.latency_s > 20 * colocated.latency_s
    assert any("8 of 16 generation GPUs hold no training shard" in n for n in e.notes)


def test_generation_gpus_beside_training_on_its_node_receive_their_shard_on_the_fabric():
    """Same layouts on one node: with as many training as generation GPUs nothing moves; with
    half as many, the other half receives its whole shard over NVLink."""
    job = _job(8)
    cm = CostModel(job)
    gen = Candidate(Layout(4, 1), 2, 32, 1)
    same = cm.weight_sync(Candidate(Layout(4, 1), 2, 1, 8), gen)
    assert same.latency_s == 0 and "already resident" in same.notes[0]
    half = cm.weight_sync(Candidate(Layout(4, 1), 1, 1, 16), gen)
    assert cm.sync_receivers(4, 8) == SyncReceivers(4, 4, 0)
    (wire,) = [o for o in half.ops if o.cls is OpClass.ALLGATHER_INTRA]
    assert wire.bytes == pytest.approx(_full_bytes(job) / 4, rel=1e-12)
    assert half.latency_s > 0


@pytest.mark.parametrize("train,gen,expected", [
    (4, 16, (4, 4, 8)), (8, 24, (8, 0, 16)), (12, 24, (12, 4, 8)), (16, 8, (8, 0, 0)),
    (24, 24, (24, 0, 0)), (1, 3, (1, 2, 0)),
])
def test_receivers_fill_the_training_nodes_first(train, gen, expected):
    assert CostModel(_job(24)).sync_receivers(train, gen) == SyncReceivers(*expected)


def test_receivers_count_the_pool_share_of_partly_used_nodes():
    """A pool of 6 GPUs on node 0 and 4 on node 1: training on 4 GPUs fills node 0's 6 first."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": [0, 1, 2, 3, 4, 5, 8, 9,
                                                                      10, 11],
                     "cluster": {"devices_per_node": 8, "nodes": 2}})
    cm = CostModel(job)
    assert cm.sync_receivers(4, 10) == SyncReceivers(4, 2, 4)
    assert cm.sync_receivers(8, 10) == SyncReceivers(8, 2, 0)


def test_the_search_table_equals_the_estimates():
    """The search prices every generation layout at once; explain() prices one pair: same
    seconds, bit for bit (the brute-force comparison relies on it)."""
    for execution in ("sync", "async"):
        cm = CostModel(_job(16, execution=execution, algo="grpo"))
        gens = [Layout(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4)]
        for train in (Layout(1, 1), Layout(4, 2), Layout(8, 4)):
            table = cm.weight_sync_table(train, gens)
            for i, g in enumerate(gens):
                assert list(table[i]) == [e.latency_s for e in cm.weight_sync_parts(train, g)]


def test_async_sync_does_not_depend_on_the_gpu_counts():
    cm = CostModel(_job(16, execution="async", algo="grpo"))
    train, gen = Candidate(Layout(2, 1), 1, 1, 64), Candidate(Layout(2, 1), 8, 8, 1)
    assert cm.weight_sync(train, gen) == cm.weight_sync(train.layout, gen.layout)


LAYOUTS = [Layout(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4)]
COUNTS = [1, 2, 4, 8, 16, 32]


@given(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS), st.sampled_from(COUNTS),
       st.sampled_from(COUNTS), st.sampled_from(COUNTS), st.sampled_from([(32, 8), (32, 4)]))
@settings(max_examples=80, deadline=None)
def test_sync_grows_with_the_generation_gpus(lt, lg, t, g, h, pool):
    """Nondecreasing in the generation GPU count (the search prunes generation candidates with
    more GPUs and no lower latency), never below the colocated price, receivers add up."""
    gpus, per_node = pool
    cm = CostModel(_job(gpus, per_node))
    if lt.size * t > gpus or lg.size * max(g, h) > gpus:
        return
    t_dp, g1, g2 = max(1, t // lt.size), max(1, min(g, h) // lg.size), max(1, max(g, h) // lg.size)
    train = Candidate(lt, t_dp, 1, 1)
    a = cm.weight_sync(train, Candidate(lg, g1, 1, 1))
    b = cm.weight_sync(train, Candidate(lg, g2, 1, 1))
    assert b.latency_s >= a.latency_s
    assert a.latency_s >= cm.weight_sync(lt, lg).latency_s
    rec = cm.sync_receivers(train.gpus, lg.size * g2)
    assert sum(rec) == lg.size * g2 and rec.colocated == min(train.gpus, lg.size * g2)


def _brute_least_overlap(tt, pt, tg, pg, model=MODEL_PRESETS["llama-3.3-70b"], gpus=None):
    """Per GPU k of a colocated sync, the weights both shards hold, counted element by element
    on a matrix of layers x column blocks: rows split into pp blocks as the sharding format
    splits layers (``layer_range``), columns into tp slices of lcm(tt, tg) blocks. The smallest
    over the GPUs that hold both: the first ``gpus``, or a period of the rank mapping."""
    cols, layers = math.lcm(tt, tg), model.num_layers
    ts, gs = tt * pt, tg * pg
    least = None
    for k in range(math.lcm(ts, gs) if gpus is None else gpus):
        t, g = k % ts, k % gs
        rows_t, rows_g = layer_range(model, pt, t // tt), layer_range(model, pg, g // tg)
        cols_t = range(t % tt * cols // tt, (t % tt + 1) * cols // tt)
        cols_g = range(g % tg * cols // tg, (g % tg + 1) * cols // tg)
        both = Fraction(len(set(rows_t) & set(rows_g)) * len(set(cols_t) & set(cols_g)),
                        layers * cols)
        least = both if least is None else min(least, both)
    return least


@pytest.mark.parametrize("tt,pt,tg,pg", [(a, b, c, d) for a in (1, 2, 4, 8) for b in (1, 2, 4)
                                         for c in (1, 2, 4, 8) for d in (1, 2, 4)])
def test_the_sync_prices_the_gpu_whose_shards_overlap_least(tt, pt, tg, pg):
    got = least_overlap(tt, pt, tg, pg)
    assert got == pytest.approx(float(_brute_least_overlap(tt, pt, tg, pg)), abs=1e-15)
    # never more than the nested overlap the formula used to assume
    assert got <= 1 / (max(tt, tg) * max(pt, pg)) + 1e-12


def test_least_overlap_is_exact_for_every_pp_that_divides_the_layers():
    """The reviewer suspected pp=3 over 32 layers, or layers that pp does not divide. Those
    layouts never reach the sync: ``layout_problem`` refuses a pp that does not divide the
    layers, and the planner enumerates powers of two (``plan.candidates``), so every block
    is whole and equal. Against the element count, the formula is exact for the planner's pp
    up to 16 over Llama-3.3-70B's 80 layers and for the pp a user layout may bring that are
    not powers of two (5 and 10 over 80 layers and over Qwen3-14B's 40)."""
    assert layout_problem(MODEL_PRESETS["llama-3.1-8b"], 1, 3) is not None
    for name, pps in (("llama-3.3-70b", (1, 2, 4, 5, 8, 10, 16)), ("qwen3-14b", (1, 5, 8, 10))):
        model = MODEL_PRESETS[name]
        for tt, pt, tg, pg in itertools.product((1, 2, 4, 8), pps, (1, 2, 4, 8), pps):
            if tt * pt > 64 or tg * pg > 64:
                continue
            want = _brute_least_overlap(tt, pt, tg, pg, model)
            assert least_overlap(tt, pt, tg, pg) == pytest.approx(float(want), abs=1e-15), (
                name, tt, pt, tg, pg)


def test_only_the_gpus_that_hold_both_shards_set_the_overlap():
    """Where the two stages' GPU counts end before a period of the rank mapping does, only
    the first min(T, G) GPUs hold both shards. For power-of-two layouts (the planner's) their
    least overlap is the period's, so the search's per-layout table stays exact; for pp = 5 it
    is not."""
    model = MODEL_PRESETS["llama-3.3-70b"]
    for tt, pt, tg, pg in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), repeat=2):
        for dt, dg in itertools.product((1, 2, 4), repeat=2):
            both = min(tt * pt * dt, tg * pg * dg)
            assert least_overlap(tt, pt, tg, pg, both) == least_overlap(tt, pt, tg, pg)
            assert least_overlap(tt, pt, tg, pg, both) == pytest.approx(
                float(_brute_least_overlap(tt, pt, tg, pg, model, both)), abs=1e-15)
    for tt, pt, tg, pg in itertools.product((1, 4), (4, 5, 10), repeat=2):
        for dt, dg in itertools.product((1, 2, 3), repeat=2):
            both = min(tt * pt * dt, tg * pg * dg)
            assert least_overlap(tt, pt, tg, pg, both) == pytest.approx(
                float(_brute_least_overlap(tt, pt, tg, pg, model, both)), abs=1e-15)


def test_a_pp5_training_layout_is_priced_by_the_gpus_that_generate():
    """A user layout for Qwen3-14B (40 layers): training tp=4 pp=5 on 20 GPUs, generation tp=4
    pp=4 on 16. GPU 15 trains layers 24-31 and generates layers 30-39, the same quarter of
    each matrix: it holds 2 of its 10 layers and receives the rest, full/16 - full/80. It was priced
    as a whole shard, full/16, because GPUs 16-19 pair training's last block with generation's
    first in a period of the mapping -- but they hold no generation shard (25 % too dear)."""
    job = parse_job({"model": "qwen3-14b", "algo": "grpo", "gpus": 32,
                     "cluster": {"devices_per_node": 8}})
    cost = CostModel(job)
    train = Candidate(Layout(4, 5), 1, 1, cost.stage_batch("actor_train"))
    gen = Candidate(Layout(4, 4), 1, cost.stage_batch("actor_gen"), 1)
    assert cost.sync_receivers(train.gpus, gen.gpus) == SyncReceivers(16, 0, 0)
    e = cost.weight_sync(train, gen)
    (wire,) = [o for o in e.ops if o.cls in (OpClass.ALLGATHER_INTER, OpClass.ALLGATHER_INTRA)]
    assert wire.bytes == pytest.approx(_full_bytes(job) * (1 / 16 - 1 / 80), rel=1e-12)
    # bare layouts: every pairing of a period counts, as before
    assert least_overlap(4, 5, 4, 4) == 0.0
    assert cost.weight_sync(train.layout, gen.layout).latency_s > e.latency_s


def test_training_tp2_pp2_into_generation_tp4_pp1_is_not_free_on_every_gpu():
    """Reviewer's case: GPU 1 trains the second half of each matrix of the first layers and
    generates the second quarter of every matrix: it holds nothing it needs and receives its
    whole shard (a quarter of the weights), not a quarter minus an eighth."""
    cost = CostModel(_job(8))
    holding, beside, _ = cost.weight_sync_parts(Layout(2, 2), Layout(4, 1))
    # the GPU that holds a training shard waits as long as one beside it that holds none
    assert holding.latency_s > 0
    assert holding.latency_s == pytest.approx(beside.latency_s)
    # in order, TP slices only line up when the TP degrees are equal: tp 2 pp 1 into tp 2
    # pp 2 finds every generation shard inside the training shard on its GPU
    holding, beside, _ = cost.weight_sync_parts(Layout(2, 1), Layout(2, 2))
    assert holding.latency_s == 0.0 and beside.latency_s > 0
