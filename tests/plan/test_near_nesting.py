"""A near placement that lays a unit where an in-place Merge or Split leaves it
(``near._nested_order``).

Split and Merge give TP rank t to sub-unit ``t % m_tp`` (``plan.nesting``), so two tp=4 units on
GPUs 0-3 and 4-7 merge in place into a tp=8 unit on (0, 4, 1, 5, 2, 6, 3, 7), and a tp=8 unit on
0-7 splits into (0, 2, 4, 6) and (1, 3, 5, 7). The search lays TP groups as runs of ascending
ids: on those the transition splits, copies and merges the whole state. The target is taken as
the controller and ``nereus transition`` take it: of the search's placement and the near ones
no slower per step, the one with the cheapest transition (``cheapest_to_reach``)."""

from pathlib import Path

import pytest

from nereus.commands.transition import jobs_from_specs
from nereus.control.admission import cheapest_to_reach
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel
from nereus.plan import near
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.near import placed_near_no_slower
from nereus.plan.types import Plan, StagePlan
from nereus.plan.validate import validate_plan
from nereus.spec.job import JobSpec, parse_job
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule
from nereus.transition.validate import validate

TRAIN = "actor_train"
HALVES = ((0, 1, 2, 3), (4, 5, 6, 7))
WHOLE = (tuple(range(8)),)


def _job(gpus: int) -> JobSpec:
    return parse_job({"model": "llama-3.1-8b", "gpus": gpus,
                      "cluster": {"device": "h100-sxm-80gb"},
                      "workload": {"response_len": 2048, "response_len_max": 2048}})


def _plan(job: JobSpec, train: StageLayoutSpec) -> Plan:
    """8B PPO on one node of 8 H100s, every stage on all 8 GPUs (the search's plan at 2K
    tokens, generation at tp=2), actor training as ``train``."""
    specs = {"actor_gen": StageLayoutSpec(2, 1, 4), "reference_infer": StageLayoutSpec(1, 1, 8),
             "reward_infer": StageLayoutSpec(1, 8, 1), "critic_infer": StageLayoutSpec(1, 8, 1),
             "critic_train": StageLayoutSpec(1, 8, 1), TRAIN: train}
    plan = evaluate_plan(job, specs)
    assert validate_plan(job, plan) == []
    return plan


def _reached(job: JobSpec, cur: Plan, tgt: Plan) -> tuple[Plan, Schedule]:
    """The target as ``nereus transition`` takes it (``commands.transition._nearest``)."""
    nears = placed_near_no_slower(job, CostModel(job), tgt, cur)
    planned = [(p, plan_transition(job, cur, p)) for p in [tgt, *nears]]
    return cheapest_to_reach(planned, lambda ps: ps[1], lambda ps: ps[0].step_latency_s)


def _ops(sched: Schedule) -> list[tuple[str, str]]:
    return [(p.op, p.stage) for p in sched.primitives]


@pytest.mark.parametrize(("before", "after", "op", "laid"), [
    # (4, 1) x 2 -> (8, 1): 2.6 s and 524 GiB moved as the search lays it, nothing in place
    (StageLayoutSpec(4, 1, 2, HALVES), StageLayoutSpec(8, 1, 1, WHOLE), "Merge",
     ((0, 4, 1, 5, 2, 6, 3, 7),)),
    # (8, 1) -> (4, 1) x 2: 3.4 s as laid, one Split (its all-gathers) in place
    (StageLayoutSpec(8, 1, 1, WHOLE), StageLayoutSpec(4, 1, 2, HALVES), "Split",
     ((0, 2, 4, 6), (1, 3, 5, 7))),
], ids=["merge", "split"])
def test_a_tp_change_on_the_same_gpus_is_one_primitive_in_place(before, after, op, laid):
    job = _job(8)
    cur, tgt = _plan(job, before), _plan(job, after)
    searched = plan_transition(job, cur, tgt)
    assert searched.feasible and len(searched.primitives) > 1
    chosen, sched = _reached(job, cur, tgt)
    assert chosen.stage(TRAIN).replicas == laid
    assert chosen.step_latency_s <= tgt.step_latency_s * (1 + near.SAME_STEP)
    assert validate_plan(job, chosen) == []
    assert sched.feasible and _ops(sched) == [(op, TRAIN)]
    assert validate(job, cur, chosen, sched) == []
    assert sched.estimated_s < searched.estimated_s / 10


def test_a_grown_pool_merges_the_actor_in_place(tmp_path: Path):
    """``nereus transition`` from 8B PPO on 16 H100s to 32: actor training goes from (2, 2) x 2
    on GPUs 0-3 and 4-7 to (4, 2) x 2. Its first replica, on 0-7, is their Merge in place
    (0.013 s) where the search's order (0..7) split, copied and merged them (L_tran 4.98 s in
    all before, 3.82 s after)."""
    files = []
    for gpus in (16, 32):
        path = tmp_path / f"j{gpus}.yaml"
        path.write_text(f"model: llama-3.1-8b\ngpus: {gpus}\ncluster: {{device: h100-sxm-80gb}}\n")
        files.append(path)
    job, cur, tgt, sched = jobs_from_specs(*files, None)
    assert cur.stage(TRAIN).replicas == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert tgt.stage(TRAIN).layout == Layout(4, 2)
    assert sched is not None and sched.feasible
    assert (0, 4, 1, 5, 2, 6, 3, 7) in tgt.stage(TRAIN).replicas
    merged = ((0, 4, 1, 5, 2, 6, 3, 7), HALVES)
    assert merged in [(p.primitive.outputs[0].gpus, tuple(e.gpus for e in p.primitive.inputs))
                      for p in sched.primitives if p.stage == TRAIN and p.op == "Merge"]
    into_first = [p for p in sched.primitives if p.stage == TRAIN and p.op == "Extend"
                  and set(p.primitive.outputs[0].gpus) <= set(range(8))]
    assert not into_first  # nothing is copied onto the GPUs the current units hold
    assert sched.estimated_s < plan_transition(job, cur, _ascending(tgt)).estimated_s


def _ascending(tgt: Plan) -> Plan:
    """``tgt`` with actor training's replicas in ascending order, as the search lays them."""
    sp = tgt.stage(TRAIN)
    reps = tuple(tuple(sorted(r)) for r in sp.replicas)
    return Plan(tuple(StagePlan(s.stage, s.candidate, reps, s.latency_s, s.peak_mem_bytes)
                      if s.stage == TRAIN else s for s in tgt.stages),
                tgt.step_latency_s, tgt.source, tgt.terms, tgt.groups)


def _stage(name: str, tp: int, pp: int, replicas) -> StagePlan:
    return StagePlan(name, Candidate(Layout(tp, pp), len(replicas), 1, 1), tuple(replicas))


def test_a_merge_that_would_put_tp_across_nodes_is_not_laid():
    """Two (2, 2) units on GPUs 0-3 (node 0) and 8-11 (node 1) into one (4, 2) unit on the
    same GPUs: their Merge in place would lay TP groups (0, 8, 1, 9) and (2, 10, 3, 11) across
    both nodes; the placed order (0-3, 8-11: a pipeline stage per node) stays."""
    job = _job(16)
    cur = Plan((_stage(TRAIN, 2, 2, [(0, 1, 2, 3), (8, 9, 10, 11)]),))
    placed = ((0, 1, 2, 3, 8, 9, 10, 11),)
    target = _stage(TRAIN, 4, 2, placed)
    assert near._nested_order(placed, cur, target, job.cluster) == placed
    # on one node the same Merge is laid: its TP groups (0, 4, 1, 5), (2, 6, 3, 7) stay in it
    cur = Plan((_stage(TRAIN, 2, 2, HALVES),))
    assert near._nested_order(WHOLE, cur, _stage(TRAIN, 4, 2, WHOLE), job.cluster) == \
        ((0, 4, 1, 5, 2, 6, 3, 7),)


def test_a_split_lays_only_the_replicas_its_pieces_cover():
    """A (8, 1) unit on 0-7 into (2, 1) replicas laid (0, 1), (2, 3), (8, 9), (10, 11): the
    Split pieces are (0, 4), (1, 5), (2, 6), (3, 7); none lies inside GPUs 0-3 alone, so the
    replicas stay as placed (a Split of part of a unit is no Split in place)."""
    job = _job(16)
    cur = Plan((_stage(TRAIN, 8, 1, WHOLE),))
    placed = ((0, 1), (2, 3), (8, 9), (10, 11))
    assert near._nested_order(placed, cur, _stage(TRAIN, 2, 1, placed), job.cluster) == placed
    placed = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
    assert near._nested_order(placed, cur, _stage(TRAIN, 2, 1, placed), job.cluster) == \
        ((0, 4), (1, 5), (2, 6), (3, 7), (8, 9))
