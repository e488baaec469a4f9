"""What the simulator charges a policy, on one small run that meets a GPU loss inside the first
step, a move, a pause, and an out-of-memory crash on a length jump (all numbers simulated)."""

from dataclasses import replace
from itertools import accumulate

import pytest

from nereus.control.telemetry import Telemetry
from nereus.sim import traces as T
from nereus.sim.plancache import PlanCache
from nereus.sim.policies import ControllerPolicy, OraclePolicy, make_policies
from nereus.sim.scenarios import builtin, simulator
from nereus.sim.simulator import OOM_LOST_FRACTION

STEPS, JUMP, PAUSE_S = 12, 9, 300.0
FULL, NODE0 = tuple(range(16)), tuple(range(8))


def _scenario():
    """The stationary scenario for 12 steps (seed 1, whose noise on the move is not near 1):
    node 1 leaves 30 % into step 0 and is back after step 2; the pool is empty for 300 s early
    in step 5; step 9's longest response is 16,000 tokens, which a plan for 2,000 cannot
    hold."""
    sc = builtin("stationary", seed=1, steps=STEPS)
    lt = sc.lengths.head(STEPS)
    jumped = tuple(16000 if k == JUMP else x for k, x in enumerate(lt.longest))
    sc = replace(sc, lengths=T.LengthTrace(lt.mean, jumped, "test: a length jump"),
                 name="accounting", steps=STEPS)
    ends = list(accumulate(simulator(sc).nominal))  # the full pool's clock
    av = T.Availability((0.0, 0.3 * ends[0], ends[2] + 1.0, ends[4] + 1.0,
                         ends[4] + 1.0 + PAUSE_S),
                        (FULL, NODE0, FULL, (), FULL), "test: a loss, a return, a pause")
    return replace(sc, availability=av)


@pytest.fixture(scope="module")
def run():
    """The run, with every step a ground truth ran that did not fit the device and every
    transition schedule it priced, recorded; a second Nereus ("twin") runs beside the first."""
    sc = _scenario()
    sim = simulator(sc)
    crashed, moved = [], []
    real_step, real_transition = sim.truth.run_step, sim.truth.transition

    def run_step(plan, pool, k, mean, longest):
        out = real_step(plan, pool, k, mean, longest)
        if not sim.truth.fits(out[2]):
            crashed.append((k, out[0]))
        return out

    def transition(source, target, pool, k):
        sched = real_transition(source, target, pool, k)
        moved.append((k, sched))
        return sched

    sim.truth.run_step, sim.truth.transition = run_step, transition
    lines = []
    pols = make_policies(["static", "nereus", "oracle"], sim.truth, sc.lengths, sc.control,
                         on_log=lambda name, line: lines.append((name, line)))
    pols.append(ControllerPolicy("twin", sim.truth, PlanCache(), sc.control))
    res = sim.run(pols, sc.name)
    return sc, sim, res.results, crashed, moved, lines


def test_the_run_meets_what_these_tests_are_about(run):
    _, sim, results, crashed, moved, _ = run
    assert sim.events[0].changes and sim.events[0].changes[0][2] == NODE0
    n = results["nereus"]
    kinds = {(e.step, e.kind) for e in n.events}
    assert (0, "loss") in kinds and (JUMP, "oom") in kinds
    assert any(e.kind == "move" for e in n.events) and moved
    assert [k for k, _ in crashed] == [JUMP, JUMP]  # Nereus and its twin, once each


def test_tokens_per_second_leave_paused_time_out(run):
    """Every policy pauses the same 300 s, and throughput is response tokens over the time
    the job held GPUs: the run's time without them."""
    _, _, results, _, _, _ = run
    for name, r in results.items():
        assert r.paused_s == pytest.approx(PAUSE_S), name
        assert r.total_s == pytest.approx(sum(row.busy_s + row.paused_s for row in r.rows))
        assert r.busy_s == pytest.approx(r.total_s - PAUSE_S), name
        assert r.tokens_per_s == pytest.approx(r.tokens / r.busy_s), name
        assert r.tokens_per_s > r.tokens / r.total_s * 1.01, name


def test_every_second_an_event_reports_is_charged_to_its_step(run):
    """A move, a restart (its redone steps included), a loss of GPUs inside a step, a crash
    and a wait each report what they cost; the row of the step they came before carries the
    same seconds as transition, restart, lost or paused time."""
    _, _, results, _, _, _ = run
    for name, r in results.items():
        assert {e.kind for e in r.events} >= {"loss", "wait"}, name
        for row in r.rows:
            charged = row.transition_s + row.restart_s + row.lost_s + row.paused_s
            reported = sum(e.seconds for e in r.events if e.step == row.step)
            assert charged == pytest.approx(reported), (name, row.step)


def test_an_out_of_memory_crash_costs_half_the_step_it_ran(run):
    """The crash loses ``OOM_LOST_FRACTION`` of the step the truth ran when it crashed, and
    that time is lost work of the step's row."""
    _, _, results, crashed, _, _ = run
    n = results["nereus"]
    (oom,) = [e for e in n.events if e.kind == "oom"]
    assert oom.step == JUMP
    crash_s = crashed[0][1]
    assert crash_s > 0 and oom.seconds == pytest.approx(OOM_LOST_FRACTION * crash_s)
    row = next(r for r in n.rows if r.step == JUMP)
    assert row.lost_s >= oom.seconds


def test_a_transition_costs_its_schedule_times_the_steps_noise(run):
    """The truth's schedule gives L_tran; the run charges it times the step's factor for
    "transition", the same draw for every policy."""
    _, sim, results, _, moved, _ = run
    for name in ("nereus", "twin"):
        moves = [e for e in results[name].events if e.kind == "move"]
        assert moves, name
        for e in moves:
            sched = next(s for k, s in moved if k == e.step)
            factor = sim.truth.factor(e.step, "transition")
            assert factor != pytest.approx(1.0, abs=1e-3)  # the noise is on
            assert e.seconds == pytest.approx(sched.estimated_s * factor)
            row = next(r for r in results[name].rows if r.step == e.step)
            assert row.transition_s == pytest.approx(e.seconds)


def test_two_policies_on_the_same_plans_see_the_same_noisy_times(run):
    """Noise is drawn from (seed, step, stage), not from a stream the policies share: a twin
    of Nereus, run in the same lockstep after it, measures every step as it does."""
    _, _, results, _, _, _ = run
    n, twin = results["nereus"], results["twin"]
    assert [replace(r, policy="twin") for r in n.rows] == list(twin.rows)
    assert len({round(r.step_s, 6) for r in n.rows}) == len(n.rows)  # and the times vary


def test_the_oracle_plans_for_the_step_it_is_about_to_run(run):
    """The oracle knows the coming step's lengths: it moves onto a plan for the 16,000-token
    step before it runs, and never crashes. Deciding on the step just run (2,000 tokens) ran
    a plan that cannot hold the jump."""
    sc, sim, results, _, _, _ = run
    o = results["oracle"]
    assert not [e for e in o.events if e.kind == "oom"]
    assert any(e.kind == "move" and e.step == JUMP for e in o.events)
    truth = sim.truth
    oracle = OraclePolicy(truth, PlanCache())
    before = sc.lengths.at(JUMP - 1)
    oracle.start(FULL, *before)
    act = oracle.decide(Telemetry(JUMP - 1, *before, FULL, source="simulated"),
                        (JUMP, *sc.lengths.at(JUMP)))
    assert truth.fits(truth.price(act.plan, FULL, JUMP, *sc.lengths.at(JUMP)))
    lagging = oracle._best(FULL, JUMP - 1, *before)
    assert not truth.fits(truth.price(lagging, FULL, JUMP, *sc.lengths.at(JUMP)))


def test_the_first_steps_telemetry_is_labelled_simulated(run):
    """GPUs lost inside the first step reach the policy before any step has ended: that
    telemetry too is the simulator's, and the decision's line says so."""
    _, _, _, _, _, lines = run
    first = next(line for name, line in lines if name == "nereus")
    assert first.startswith("step 0 ") and "pool_loss" in first
    assert "] (simulated)" in first and "(measured)" not in first
