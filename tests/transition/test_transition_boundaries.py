"""Checks added by a mutation audit of the transition layer: the T_sub rule (gcd per
dimension, the larger on a tie) and a transition that fits a GPU's capacity exactly."""

from __future__ import annotations

from nereus.cost.candidate import Layout
from nereus.cost.efficiency import Efficiencies
from nereus.plan.types import Plan
from nereus.transition.cost import TransitionCost
from nereus.transition.emu import phi
from nereus.transition.global_dag import build_dag
from nereus.transition.nesting import common_layout
from nereus.transition.planner import transition_dag
from nereus.transition.primitives import Extend, Merge, Split
from nereus.transition.schedule import list_schedule
from nereus.transition.sizes import StateSizes

from transition_testlib import job8b, sp, tiny_job


def test_common_layout_is_the_gcd_in_each_dimension() -> None:
    # by hand: gcd(4, 2) = 2, gcd(4, 6) = 2; gcd(1, 1) = 1, gcd(4, 6) = 2; gcd(8, 4) = 4,
    # gcd(2, 3) = 1 (min instead of gcd would give pp 4, 4 and 2)
    assert common_layout(Layout(4, 4), Layout(2, 6)) == Layout(2, 2)
    assert common_layout(Layout(1, 4), Layout(1, 6)) == Layout(1, 2)
    assert common_layout(Layout(8, 2), Layout(4, 3)) == Layout(4, 1)


def test_a_tie_in_bytes_moved_goes_through_the_larger_t_sub() -> None:
    """(4, 1) x 2 on GPUs 0-3, 4-7 -> (2, 2) on [0, 1, 2, 8]. T_sub candidates: (2, 1) and
    (1, 1). By hand, with the nesting mapping (j = t % m_tp for a tp split, j = r % m_pp for a
    pp split): through (2, 1) the pieces are (0, 2), (1, 3), (4, 6), (5, 7) and the slots
    (0, 1), (2, 8): nothing resident, so both units count as split (2 x (2 - 1) = 2) plus
    2 slots to fill = 4; through (1, 1) slots 0, 1, 2 are resident in unit 0 and 8 is not:
    1 x (4 - 1) = 3 plus 1 = 4. A tie: the larger T_sub, (2, 1), is taken."""
    job = job8b(16)
    cur = Plan((sp("actor_gen", 4, 1, [range(4), range(4, 8)]),))
    tgt = Plan((sp("actor_gen", 2, 2, [[0, 1, 2, 8]]),))
    dag, _ = transition_dag(job, cur, tgt)
    assert dag.feasible, dag.problem
    splits = [p for p in dag.primitives if isinstance(p, Split)]
    merges = [p for p in dag.primitives if isinstance(p, Merge)]
    assert splits and merges
    assert {p.sub for p in splits} == {Layout(2, 1)}
    assert {e.layout for m in merges for e in m.emus} == {Layout(2, 1)}


def test_a_move_that_fills_a_gpu_exactly_is_feasible() -> None:
    """reward_infer (1, 1) from GPU 0 to GPU 1 with a capacity of exactly one unit's bytes:
    GPU 0 holds the source (s bytes), the Extend brings GPU 1 from 0 to s = capacity, which
    fits (the rule is usage <= capacity), then the source is destroyed."""
    job = tiny_job(8)
    cur = Plan((sp("reward_infer", 1, 1, [[0]]),))
    tgt = Plan((sp("reward_infer", 1, 1, [[1]]),))
    sizes = StateSizes(job)
    (unit,) = phi(job, cur)["reward_infer"]
    cap = max(sizes.of(unit))
    cost = TransitionCost(job.cluster, sizes, Efficiencies(device=job.cluster.device.name))
    dag = build_dag(job, cur, tgt, cost, cap)
    assert dag.feasible, dag.problem
    assert sorted(p.op for p in dag.primitives) == ["Destroy", "Extend"]
    s = list_schedule(dag, cost)
    assert s.feasible
    assert max(s.peak_bytes().values()) == cap
    ext = next(p for p in s.primitives if isinstance(p.primitive, Extend))
    assert ext.primitive.targets == (1,)
