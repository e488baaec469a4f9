"""A near placement that keeps a replica's GPU order (``near._kept_order``) is priced, validated
and reached as the same plan with its GPUs in ascending order would be.

A kept order need not be ascending ([3, 2, 1, 0], or [8..15, 0..7] for a unit over two nodes).
Two rules read more than the set of GPUs: the weight sync's price (``least_overlap``: generation
is laid over the training GPUs rank by rank, so a generation GPU holds the training shard of the
same position) and TP groups inside a node (a TP group is a run of ``tp`` consecutive ids)."""

from pathlib import Path

import pytest

from nereus.cost.model import CostModel, least_overlap, placed_overlap
from nereus.files import read_yaml
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.near import placed_near
from nereus.plan.placement import tp_groups_off_node
from nereus.plan.search import Planner, best_plan
from nereus.plan.types import Plan, StagePlan
from nereus.plan.validate import validate_plan
from nereus.spec.job import JobSpec, parse_job
from nereus.transition.planner import plan_transition
from nereus.transition.validate import validate

from plan_testlib import divisors_only

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN, GEN = "actor_train", "actor_gen"
QUADS = tuple(tuple(range(k, k + 4)) for k in range(0, 16, 4))


def _job(gpus: int, length: int) -> JobSpec:
    data = dict(read_yaml(EXAMPLES / "llama-3.1-8b-ppo.yaml", "config"), gpus=gpus)
    data["workload"] = dict(data.get("workload") or {}, response_len=length,
                            response_len_max=length)
    return parse_job(data)


def _reordered(plan: Plan, stage: str, order) -> Plan:
    """``plan`` with each replica of ``stage`` laid in ``order(replica)``."""
    return Plan(tuple(StagePlan(s.stage, s.candidate, tuple(tuple(order(r)) for r in s.replicas),
                                s.latency_s, s.peak_mem_bytes) if s.stage == stage else s
                      for s in plan.stages),
                plan.step_latency_s, plan.source, plan.terms, plan.groups)


def _sorted(job: JobSpec, plan: Plan) -> Plan:
    """The same plan with every replica's GPUs in ascending order, priced afresh."""
    return evaluate_plan(job, {sp.stage: StageLayoutSpec(
        sp.tp, sp.pp, sp.dp, tuple(tuple(sorted(r)) for r in sp.replicas),
        sp.candidate.micro_batch, sp.candidate.grad_accum, sp.candidate.recompute)
        for sp in plan.stages})


def _placed_overlap(plan: Plan) -> float:
    t, g = plan.stage(TRAIN), plan.stage(GEN)
    return placed_overlap(t.layout, t.replicas, g.layout, g.replicas)


def _tp_groups_off_node(job: JobSpec, plan: Plan) -> int:
    return sum(tp_groups_off_node(sp.replicas, sp.tp, job.cluster) for sp in plan.stages)


def _agrees_with_sorted(job: JobSpec, cur: Plan, near: Plan) -> None:
    """Price, validity and transition of ``near`` agree with its sorted twin's."""
    twin = _sorted(job, near)
    assert validate_plan(job, near) == validate_plan(job, twin) == []
    assert near.step_latency_s == pytest.approx(twin.step_latency_s, rel=1e-12)
    assert dict(near.terms) == pytest.approx(dict(twin.terms), rel=1e-12)
    assert [(s.stage, s.candidate, s.latency_s, s.peak_mem_bytes) for s in near.stages] == \
        [(s.stage, s.candidate, s.latency_s, s.peak_mem_bytes) for s in twin.stages]
    # the sync runs as priced: each generation GPU holds the training shard the rank-by-rank
    # layout (``least_overlap``) says it holds, as in the sorted twin
    t, g = near.stage(TRAIN), near.stage(GEN)
    priced = least_overlap(t.tp, t.pp, g.tp, g.pp)
    assert _placed_overlap(near) == pytest.approx(_placed_overlap(twin))
    assert _placed_overlap(near) >= priced - 1e-12
    assert _tp_groups_off_node(job, near) == _tp_groups_off_node(job, twin) == 0
    for target in (near, twin):
        sched = plan_transition(job, cur, target)
        assert sched.feasible, sched.reason
        assert validate(job, cur, target, sched) == []


@pytest.fixture(scope="module")
def ppo24():
    """8B PPO on 24 GPUs: actor training and generation both tp=4 on GPUs 0-15, 4 each, in
    the space where every DP divides its batch (the best plan now generates on all 24, dp=6,
    beside training of another layout)."""
    jobs = {n: _job(24, n) for n in (2048, 8192)}
    plans = {n: Planner(j, keep=divisors_only(j)).best() for n, j in jobs.items()}
    for p in plans.values():
        assert p.stage(TRAIN).replicas == p.stage(GEN).replicas == QUADS
    return jobs, plans


@pytest.mark.parametrize("stage", [TRAIN, GEN])
@pytest.mark.parametrize("length", [2048, 8192])
def test_a_kept_reversed_unit_keeps_the_weight_sync_as_priced(ppo24, stage, length):
    """The current actor units of one stage run on [3, 2, 1, 0], [7, 6, 5, 4], ... Kept as it
    is beside the other stage laid [0, 1, 2, 3], GPU 3 would train TP slice 0 and generate
    slice 3: nothing it holds is what it needs, so the sync priced at 0 s (same layout, shards
    in place) would move every generation GPU's whole quarter of the weights."""
    jobs, plans = ppo24
    job, cur = jobs[length], _reordered(plans[2048], stage, lambda r: r[::-1])
    assert _placed_overlap(cur) == 0.0  # the current plan itself runs its sync misaligned
    nears = placed_near(job, CostModel(job), plans[length], cur)
    for near in nears:
        _agrees_with_sorted(job, cur, near)
    if stage == TRAIN:
        # the heavier unit (θ and ω) stays as it is, and generation follows its order
        assert any(near.stage(TRAIN).replicas == cur.stage(TRAIN).replicas for near in nears)
        for near in nears:
            if near.stage(TRAIN).replicas == cur.stage(TRAIN).replicas:
                assert near.stage(GEN).replicas == tuple(r[::-1] for r in QUADS)
    else:
        # generation gives its order up to training's, the searched plan's (so no placement
        # differs from the plan and none comes back: the old code returned the misaligned one)
        assert not any(near.stage(GEN).replicas == cur.stage(GEN).replicas for near in nears)


def test_a_unit_over_two_nodes_keeps_an_order_that_starts_on_the_second():
    """8B PPO on 32 GPUs: actor training is one tp=4 pp=4 unit over GPUs 0-15 (two nodes),
    generation tp=4 on the same GPUs. A current unit laid [8..15, 0..7] (pipeline stages 0-1
    on node 1) is kept: its TP groups stay in their nodes, and a generation GPU still holds its
    own TP slice of a quarter of the layers, so the sync is what the sorted plan's is."""
    job = _job(32, 512)
    plan = best_plan(job)
    assert plan.stage(TRAIN).replicas == (tuple(range(16)),)
    cur = _reordered(plan, TRAIN, lambda r: (*r[8:], *r[:8]))
    assert validate_plan(job, cur) == []
    nears = placed_near(job, CostModel(job), plan, cur)
    assert nears
    for near in nears:
        assert near.stage(TRAIN).replicas == cur.stage(TRAIN).replicas
        _agrees_with_sorted(job, cur, near)


def test_a_current_order_with_tp_groups_across_nodes_is_not_kept():
    """The same unit laid with each TP group over both nodes ([0, 1, 8, 9], [2, 3, 10, 11],
    ...): the current plan breaks the rule that TP stays inside a node; the near placement
    lays the unit afresh rather than keep that order (its price assumes TP inside a node),
    while reward inference (tp=1 pp=8, each unit inside a node) keeps its reversed order."""
    job = _job(32, 512)
    plan = best_plan(job)
    cur = _reordered(plan, TRAIN, lambda r: tuple(g for k in range(0, 8, 2)
                                                  for g in (*r[k:k + 2], *r[k + 8:k + 10])))
    cur = _reordered(cur, "reward_infer", lambda r: r[::-1])
    assert cur.stage(TRAIN).replicas[0][:4] == (0, 1, 8, 9)
    assert any("spans nodes" in p for p in validate_plan(job, cur))
    nears = placed_near(job, CostModel(job), plan, cur)
    assert nears
    for near in nears:
        assert near.stage(TRAIN).replicas == plan.stage(TRAIN).replicas
        assert near.stage("reward_infer").replicas == cur.stage("reward_infer").replicas
        _agrees_with_sorted(job, cur, near)
