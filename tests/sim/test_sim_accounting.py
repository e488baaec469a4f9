"""What a mutation audit of the simulator found untested: the ground truth's transitions under
the hidden (and drifting) efficiencies, the noise on the weight sync, what a restart and a
rebuild charge, how transitions and restarts are counted, the mean step latency, the static
policy growing back only at a restart, the oracle restarting after a pause, admission telling
Nereus from replan-without-admission, and the trace generators' ranges (all numbers
simulated)."""

from dataclasses import replace
from itertools import accumulate

import numpy as np
import pytest

from nereus.control.controller import Action
from nereus.control.restart import checkpoint_write_s, restart_cost
from nereus.control.targets import fill, rebuild_s, survive
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.plan.overlap import step_latency
from nereus.plan.search import best_plan
from nereus.sim import traces as T
from nereus.sim.plancache import PlanCache
from nereus.sim.policies import Act, make_policies
from nereus.sim.scenarios import builtin, run_scenario, simulator
from nereus.sim.simulator import _Runner
from nereus.sim.truth import Truth
from nereus.spec.cluster import GpuPool
from nereus.transition.planner import plan_transition

FULL, NODE0 = tuple(range(16)), tuple(range(8))
# half of each node: the spread plan keeps a replica of every training stage there, and no
# whole replica of reward_infer or critic_infer (each spans a whole node)
HALVES = (0, 1, 2, 3, 12, 13, 14, 15)
PAUSE_S = 300.0


# ------------------------------------------------------------------ the ground truth
@pytest.fixture(scope="module")
def two_plans():
    """The stationary scenario's truth and two plans of 16 GPUs with different layouts."""
    sc = builtin("stationary", steps=8)
    sim = simulator(sc)
    mean, longest = sc.lengths.at(3)
    job = sim.truth.job_at(FULL, mean, longest)
    spread = PlanCache()(job, CostModel(job, sim.truth.hidden), True)
    packed = best_plan(job, sim.truth.hidden)
    assert [s.replicas for s in spread.stages] != [s.replicas for s in packed.stages]
    return sc, sim, spread, packed


def test_a_transition_takes_its_schedule_under_the_hidden_efficiencies(two_plans):
    """The truth's L_tran is the schedule planned with the hidden efficiencies, not the
    defaults the policies start from; slower hidden efficiencies make the move slower."""
    _, sim, spread, packed = two_plans
    tr = sim.truth
    job = tr.job.with_pool(GpuPool(tr.job.cluster, FULL))
    got = tr.transition(spread, packed, FULL, 0).estimated_s
    assert got == pytest.approx(plan_transition(job, spread, packed, tr.hidden).estimated_s)
    defaults = plan_transition(job, spread, packed, Efficiencies(device=tr.hidden.device))
    assert got != pytest.approx(defaults.estimated_s, rel=1e-3)
    slow = Efficiencies({c: v / 2 for c, v in tr.hidden.values.items()}, tr.hidden.device)
    slower = Truth(tr.job, slow, T.DriftTrace(), 0.0).transition(spread, packed, FULL, 0)
    assert slower.estimated_s > 1.5 * got


def test_a_transition_inside_a_drift_period_takes_the_drifted_efficiencies(two_plans):
    """Every op class at half its efficiency for steps 5-9: a move then takes longer, and the
    same move before and after the period takes what it took (the truth's cache of schedules
    keys on the efficiencies)."""
    _, sim, spread, packed = two_plans
    tr = sim.truth
    drift = T.DriftTrace(tuple(T.DriftPeriod(5, 10, c, 0.5) for c in tr.hidden.values))
    truth = Truth(tr.job, tr.hidden, drift, 0.0)
    before, during, after = (truth.transition(spread, packed, FULL, k).estimated_s
                             for k in (0, 6, 12))
    assert during > 1.5 * before
    assert after == pytest.approx(before)


def test_the_weight_sync_carries_the_steps_noise_too(two_plans):
    """A step is its stages and its weight sync, each times its own noise draw."""
    sc, sim, _, packed = two_plans
    truth = Truth(sim.truth.job, sim.truth.hidden, T.DriftTrace(), 0.05)
    mean, longest = sc.lengths.at(3)
    wf, groups = truth.job.workflow, packed.all_groups()
    for k in range(4):
        step_s, stage, p = truth.run_step(packed, FULL, k, mean, longest)
        assert p.sync_s > 0 and truth.factor(k, "weight_sync") != pytest.approx(1, abs=1e-3)
        assert step_s == pytest.approx(
            step_latency(wf, groups, stage, p.sync_s * truth.factor(k, "weight_sync")),
            rel=1e-12)
        assert step_s != pytest.approx(step_latency(wf, groups, stage, p.sync_s), rel=1e-6)


# ------------------------------------------------------------------ restarts and rebuilds
def test_a_restart_charges_start_up_and_load_and_a_planned_one_its_save(two_plans):
    """After a failure: start-up plus the checkpoint load; planned: also the checkpoint it
    writes first (the same write a periodic checkpoint costs)."""
    sc, sim, _, packed = two_plans
    job = sim.truth.job_at(FULL, *sc.lengths.at(3))
    rc = restart_cost(job, sc.restart, after_failure=True, lost_steps=0)
    assert rc.startup_s == sc.restart.startup_s > 0 and rc.load_s > 0
    failed = _Runner(None, sim)  # type: ignore[arg-type]
    failed._restart(3, Act(Action.RESTART, packed, after_failure=True), FULL)
    assert failed._acc["restart_s"] == pytest.approx(rc.startup_s + rc.load_s)
    planned = _Runner(None, sim)  # type: ignore[arg-type]
    planned._restart(3, Act(Action.RESTART, packed, after_failure=False), FULL)
    write = checkpoint_write_s(job, sc.restart)
    assert write > 0
    assert planned._acc["restart_s"] == pytest.approx(rc.startup_s + rc.load_s + write)


def test_a_move_that_rebuilds_a_stage_with_no_replica_left_pays_for_the_rebuild(two_plans):
    """On half of each node the spread plan keeps both training stages but no replica of
    reward_infer (frozen: read again) or critic_infer (a copy of θ: given again by
    critic_train): the move pays its schedule and the rebuild, each times its noise."""
    sc, sim, spread, _ = two_plans
    tr, k = sim.truth, 3
    survivors, lost, rebuilt = survive(spread, HALVES, tr.job.workflow)
    assert survivors is not None and not lost
    assert set(rebuilt) == {"reward_infer", "critic_infer"}
    target = best_plan(tr.job_at(HALVES, *sc.lengths.at(k)), tr.hidden)
    runner = _Runner(None, sim)  # type: ignore[arg-type]
    runner.plan = spread
    assert runner._apply(k, Act(Action.MOVE, target), HALVES)
    (move,) = runner.events
    sched = tr.transition(fill(survivors, target), target, HALVES, k)
    rebuild = rebuild_s(tr.job_at(HALVES, *sc.lengths.at(k)), target, rebuilt, sc.restart)
    assert rebuild > 10 * sched.estimated_s
    assert move.kind == "move" and move.seconds == pytest.approx(
        sched.estimated_s * tr.factor(k, "transition") + rebuild * tr.factor(k, "rebuild"))
    assert runner._acc["transition_s"] == pytest.approx(move.seconds)


# ------------------------------------------------------------------ one run, every policy
@pytest.fixture(scope="module")
def loss_return_pause():
    """14 steps of the stationary scenario: node 1 leaves half way through step 4, is back in
    step 8, and the pool empties for 300 s inside step 10 (after the checkpoint of step 9)."""
    sc = builtin("stationary", steps=14)
    ends = list(accumulate(simulator(sc).nominal))
    av = T.Availability((0.0, ends[3] + 0.5 * (ends[4] - ends[3]), ends[7] + 1.0,
                         ends[9] + 1.0, ends[9] + 1.0 + PAUSE_S),
                        (FULL, NODE0, FULL, (), FULL), "test: a loss, a return, a pause")
    sc = replace(sc, availability=av, name="loss-return-pause")
    return sc, simulator(sc), run_scenario(sc, workers=1).results


def test_every_policy_restarts_from_the_checkpoint_after_a_pause(loss_return_pause):
    """The state on the GPUs is gone while the pool is empty: every policy, the oracle too,
    restarts when GPUs return, paying start-up and load (nothing to redo: step 9 wrote the
    checkpoint)."""
    sc, sim, results = loss_return_pause
    assert sc.restart.checkpoint_interval_steps == 10
    rc = restart_cost(sim.truth.job_at(FULL, *sc.lengths.at(10)), sc.restart, lost_steps=0)
    for name, r in results.items():
        assert r.paused_s == pytest.approx(PAUSE_S), name
        restarts = [e for e in r.events if e.kind == "restart" and e.step == 10]
        assert len(restarts) == 1, name
        assert restarts[0].seconds == pytest.approx(rc.startup_s + rc.load_s), name
        row = next(row for row in r.rows if row.step == 10)
        assert row.restart_s == pytest.approx(rc.startup_s + rc.load_s), name


def test_static_uses_returned_gpus_only_at_its_next_restart(loss_return_pause):
    """Static restarts on node 0 when node 1 leaves (start-up, load and steps 0-3 redone), runs
    there while node 1 is back, and takes the whole pool at the restart after the pause."""
    sc, sim, results = loss_return_pause
    s = results["static"]
    assert [e.step for e in s.events if e.kind == "restart"] == [4, 10]
    assert s.restarts == 2 and s.transitions == 0
    gpus = {row.step: row.plan_gpus for row in s.rows}
    assert [gpus[k] for k in range(14)] == [16] * 4 + [8] * 6 + [16] * 4
    rc = restart_cost(sim.truth.job_at(NODE0, *sc.lengths.at(4)), sc.restart, lost_steps=0)
    row = next(row for row in s.rows if row.step == 4)
    assert row.restart_s == pytest.approx(rc.startup_s + rc.load_s)


def test_transitions_count_every_move_free_or_paid(loss_return_pause):
    """The oracle's free moves are transitions (of 0 s); the others' paid moves are too, and a
    row counts the moves before it."""
    _, _, results = loss_return_pause
    o, n = results["oracle"], results["nereus"]
    assert o.transition_s == 0 and o.transitions >= 1
    assert n.transition_s > 0 and n.transitions >= 1
    for name, r in results.items():
        moves = [e for e in r.events if e.kind == "move"]
        assert r.transitions == len(moves) == sum(row.transitions for row in r.rows), name
        for row in r.rows:
            assert row.transitions == sum(1 for e in moves if e.step == row.step), name


def test_the_mean_step_latency_includes_what_came_between_the_steps(loss_return_pause):
    """Transitions, restarts, lost work and checkpoint writes count in the mean step latency;
    pauses do not."""
    _, _, results = loss_return_pause
    for name, r in results.items():
        n = len(r.rows)
        busy = sum(row.step_s + row.transition_s + row.restart_s + row.lost_s
                   + row.checkpoint_s for row in r.rows)
        assert r.mean_step_s == pytest.approx(busy / n), name
        assert r.mean_step_s == pytest.approx((r.total_s - r.paused_s) / n), name
        assert r.mean_step_s > sum(row.step_s for row in r.rows) / n + r.restart_s / n, name


# ------------------------------------------------------------------ admission
def test_replanning_without_admission_moves_more_often_than_nereus():
    """replan_always is the controller with admission off, Nereus with it on: on node churn
    with growing responses, admission turns down moves that do not pay (30 steps: 6 moves
    against 2, simulated)."""
    sc = builtin("churn", steps=30)
    sim = simulator(sc)
    pols = {p.name: p for p in make_policies(["replan_always", "nereus"], sim.truth,
                                              sc.lengths, sc.control)}
    assert sc.control.admission
    assert pols["nereus"].config.admission and not pols["replan_always"].config.admission
    res = sim.run(list(pols.values()), sc.name).results
    assert res["replan_always"].transitions > res["nereus"].transitions


# ------------------------------------------------------------------ trace generators
def test_growth_runs_from_start_to_end_and_longest_is_at_least_max_ratio_times_mean():
    flat = T.growth(1000, 500.0, 8000.0, noise=0.0, max_ratio=1.5)
    assert flat.mean[0] == 500.0 and flat.mean[-1] == 8000.0
    assert np.allclose(np.diff(flat.mean), 7500 / 999, atol=0.1)
    # the longest is ceil(1.5 x the mean) before the mean is rounded to 0.1 token
    assert all(m * 1.5 - 0.1 <= x < m * 1.5 + 1.1 for m, x in zip(flat.mean, flat.longest))
    for seed in range(3):
        for t in (T.growth(300, seed=seed), T.stationary(300, seed=seed)):
            assert all(x >= m * 1.5 - 0.1 for m, x in zip(t.mean, t.longest)), seed


def test_stationary_lengths_are_seeded():
    assert T.stationary(50, seed=1) == T.stationary(50, seed=1)
    assert T.stationary(50, seed=1).mean != T.stationary(50, seed=2).mean


def test_a_drift_period_ends_before_its_end_step():
    d = T.DriftTrace((T.DriftPeriod(5, 10, OpClass.GEMM, 0.5),))
    assert d.factors_at(4) == () and d.factors_at(10) == ()
    assert d.factors_at(5) == d.factors_at(9) == ((OpClass.GEMM, 0.5),)
    base = Efficiencies({OpClass.GEMM: 0.6})
    assert d.apply(base, 9)[OpClass.GEMM] == pytest.approx(0.3)
    assert d.apply(base, 10)[OpClass.GEMM] == pytest.approx(0.6)


def test_congestion_periods_take_every_length_in_their_range():
    spans = {p.end_step - p.start_step for p in T.congestion(1000, length=(7, 7)).periods}
    assert spans == {7}
    seen = {p.end_step - p.start_step for s in range(20)
            for p in T.congestion(1000, length=(3, 6), seed=s).periods}
    assert seen == {3, 4, 5, 6}


def _churn_events(av: T.Availability, per: int) -> list[tuple[float, int, int]]:
    """(time, nodes held before, nodes held after) of each change."""
    held = [len(p) // per for p in av.pools]
    return [(t, a, b) for t, a, b in zip(av.times[1:], held, held[1:])]


def test_node_churn_spreads_its_changes_over_each_block_with_even_odds():
    """Changes fall uniformly inside each block of ``hours``, and each takes a node away or
    gives one back with equal odds where both can happen."""
    block = 10 * 3600.0
    late = losses = both = total = 0
    for seed in range(5):
        av = T.node_churn(4, 8, hours=10, changes=12, min_nodes=1, seed=seed)
        for t, a, b in _churn_events(av, 8):
            total += 1
            late += (t % block) > block / 2
            if 1 < a < 4:
                both += 1
                losses += b < a
    assert total == 5 * 20 * 12
    assert 0.4 < late / total < 0.6
    assert both > 500 and 0.4 < losses / both < 0.6


def test_pauses_before_the_start_and_between_steps_are_paused_time():
    """The pool is empty for the first 200 s and again for 300 s between steps 2 and 3: both
    are paused time for every policy (left out of tokens/s), not time the job held GPUs."""
    sc = builtin("stationary", steps=5)
    t = 200.0
    for n in simulator(sc).nominal[:3]:
        t += n  # as the nominal clock adds it up: the pool empties as step 3 would start
    av = T.Availability((0.0, 200.0, t, t + PAUSE_S), ((), FULL, (), FULL), "test: two pauses")
    sc = replace(sc, availability=av, name="pauses")
    sim = simulator(sc)
    assert [ev.pause_s for ev in sim.events] == [200.0, 0, 0, pytest.approx(PAUSE_S), 0]
    assert not any(ev.changes for ev in sim.events)
    res = sim.run(make_policies(["static", "oracle"], sim.truth, sc.lengths, sc.control))
    for name, r in res.results.items():
        assert [row.paused_s for row in r.rows] == [200.0, 0, 0, pytest.approx(PAUSE_S), 0]
        assert r.busy_s == pytest.approx(r.total_s - 200.0 - PAUSE_S), name
        assert [e.step for e in r.events if e.kind == "restart"] == [3], name


def test_static_restarts_from_the_checkpoint_after_a_crash():
    """Static never moves: a crash (here the truth's memory refuses step 5 once) restarts it
    from the checkpoint onto its plan, the steps since the checkpoint redone."""
    sc = builtin("stationary", steps=8)
    sim = simulator(sc)
    real_step, real_fits = sim.truth.run_step, sim.truth.fits
    at, crashes = {"step": -1}, []

    def run_step(plan, pool, k, mean, longest):
        at["step"] = k
        return real_step(plan, pool, k, mean, longest)

    def fits(priced):
        if at["step"] == 5 and not crashes:
            crashes.append(priced)
            return False
        return real_fits(priced)

    sim.truth.run_step, sim.truth.fits = run_step, fits
    (pol,) = make_policies(["static"], sim.truth, sc.lengths, sc.control)
    r = sim.run([pol], sc.name).results["static"]
    assert crashes
    assert [(e.step, e.kind) for e in r.events] == [(5, "oom"), (5, "restart")]
    assert r.restarts == 1 and {row.plan_gpus for row in r.rows} == {16}
    row = next(row for row in r.rows if row.step == 5)
    assert row.restart_s > sc.restart.startup_s and row.lost_s > 0
