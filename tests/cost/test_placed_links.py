"""Collectives priced on the links given GPU ids use (``Links``), not on what sizes suggest."""

from dataclasses import replace

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel, Links
from nereus.cost.ops import OpClass
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.types import contiguous_replicas
from nereus.spec import parse_job

# 16 GPUs on two nodes of 8: GPUs 0-7 on node 0, 8-15 on node 1
JOB = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
                 "cluster": {"devices_per_node": 8}})
TP4 = Candidate(Layout(4, 1), 1, 2, 64)  # one tp=4 replica of actor_train (batch 128)


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(JOB)


def test_links_follow_the_rank_order_of_a_replica(cm):
    """Index pp_rank * tp + tp_rank: a TP group is a run of tp ids, a pipeline hop joins the
    same TP rank of consecutive blocks, a DP group is one index across the replicas."""
    assert cm.placed_links(Layout(4, 1), [(0, 1, 2, 3)]) == Links((), (), (), ())
    assert cm.placed_links(Layout(4, 1), [(6, 7, 8, 9)]).tp == (6, 7, 8, 9)
    # tp=2 pp=2 on [6, 7, 8, 9]: TP groups [6, 7] and [8, 9] stay inside nodes, the hop
    # 6 -> 8 (and the first/last-block pair) crosses
    lk = cm.placed_links(Layout(2, 2), [(6, 7, 8, 9)])
    assert (lk.tp, lk.pp, lk.embed) == ((), (6, 8), (6, 8))
    # two replicas, one per node: every DP group crosses, nothing else does
    lk = cm.placed_links(Layout(2, 2), [(0, 1, 2, 3), (8, 9, 10, 11)])
    assert (lk.tp, lk.pp, lk.embed, lk.dp) == ((), (), (), (0, 8))
    # pipeline across nodes, DP inside them (Megatron's usual multi-node order)
    lk = cm.placed_links(Layout(4, 2), [(0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)])
    assert (lk.tp, lk.pp, lk.dp) == ((), (0, 8), ())


def test_a_tp_group_across_nodes_pays_the_inter_node_allreduce(cm):
    """tp=4 on [6, 7, 8, 9] against [0, 1, 2, 3]: every op but the TP all-reduces is the same,
    and those cost what the network's bandwidth and step latency make of the same bytes."""
    aligned = cm.estimate("actor_train", TP4, 0, cm.placed_links(TP4.layout, [(0, 1, 2, 3)]))
    across = cm.estimate("actor_train", TP4, 0, cm.placed_links(TP4.layout, [(6, 7, 8, 9)]))
    tp_ops = ("tp allreduce", "vocab-parallel")
    same = [o for o in aligned.ops if not o.name.startswith(tp_ops)]
    assert same == [o for o in across.ops if not o.name.startswith(tp_ops)]
    dev, eff = JOB.cluster.device, cm.eff
    extra = 0.0
    for a, x in zip(aligned.ops, across.ops):
        if not a.name.startswith(tp_ops):
            continue
        assert (a.name, a.count, a.bytes) == (x.name, x.count, x.bytes)
        if a.cls is OpClass.LATENCY_INTRA:
            assert x.cls is OpClass.LATENCY_INTER
            assert x.ideal_s == pytest.approx(a.ideal_s * dev.inter_latency_s / dev.intra_latency_s)
        else:
            assert (a.cls, x.cls) == (OpClass.ALLREDUCE_INTRA, OpClass.ALLREDUCE_INTER)
            assert x.ideal_s == pytest.approx(a.ideal_s * dev.intra_node_bw / dev.inter_node_bw)
        extra += x.ideal_s / eff[x.cls] - a.ideal_s / eff[a.cls]
    assert extra > 1.0  # seconds per step: the network is an order slower than NVLink
    assert across.latency_s - aligned.latency_s == pytest.approx(extra)
    assert across.terms["tp_comm"] > aligned.terms["tp_comm"]
    assert any("TP group [6, 7, 8, 9] spans nodes" in n for n in across.notes)
    assert not any("spans nodes" in n for n in aligned.notes)


@pytest.mark.parametrize("stage", ["actor_gen", "reference_infer", "actor_train",
                                   "critic_train"])
def test_node_aligned_placements_price_exactly_as_sizes_do(cm, stage):
    """The planner's rule (sizes) stands for contiguous placements from GPU 0: every candidate
    placed so prices bit for bit as without ``links``."""
    cands = enumerate_candidates(cm, JOB.workflow.stage(stage), 16)
    assert cands
    for c in cands:
        links = cm.placed_links(c.layout, contiguous_replicas(0, JOB.pool.ids, c))
        placed, sized = cm.estimate(stage, c, 0, links), cm.estimate(stage, c)
        assert placed.latency_s == sized.latency_s and placed.ops == sized.ops, c


def test_kinds_left_to_sizes_price_as_sizes(cm):
    """A ``Links`` field left None is priced by sizes: only the placed kinds move."""
    across = cm.placed_links(Layout(2, 2), [(0, 1, 2, 3), (8, 9, 10, 11)])  # DP across only
    c = Candidate(Layout(2, 2), 2, 1, 64)
    sized = cm.estimate("actor_train", c)
    assert cm.estimate("actor_train", c, 0, replace(across, dp=None)).latency_s == sized.latency_s
    assert cm.estimate("actor_train", c, 0, across).terms["dp_sync"] > sized.terms["dp_sync"]
    assert cm.estimate("actor_train", c, 0, Links()).latency_s == sized.latency_s


def test_the_weight_sync_follows_where_the_replicas_sit(cm):
    """A training replica across nodes gathers the generation shards over the network."""
    train, gen = Candidate(Layout(4, 1), 4, 2, 16), Candidate(Layout(2, 1), 8, 64, 1)
    aligned = [tuple(range(i, i + 4)) for i in range(0, 16, 4)]
    shifted = [tuple((i + 2 + k) % 16 for k in range(4)) for i in range(0, 16, 4)]
    gens = [tuple(range(i, i + 2)) for i in range(0, 16, 2)]
    assert cm.placed_sync_intra(aligned, gens) and not cm.placed_sync_intra(shifted, gens)
    sized = cm.weight_sync(train, gen)
    assert cm.weight_sync(train, gen, intra=True).latency_s == sized.latency_s
    across = cm.weight_sync(train, gen, intra=False)
    assert across.latency_s > sized.latency_s
    assert all(o.cls in (OpClass.ALLGATHER_INTER, OpClass.LATENCY_INTER) for o in across.ops)
    assert any("spans nodes" in n for n in across.notes)
