"""Pools no plan fits are waited out like empty ones; a planned restart saves the work; work
redone after a failure runs on the plan the job restarts on; a policy that waits where a plan
fits holds its GPUs (all numbers simulated)."""

from dataclasses import replace

import pytest

from nereus.control.controller import Action
from nereus.sim.policies import Act, StaticPolicy, make_policies
from nereus.sim.scenarios import builtin, run_scenario
from nereus.sim.simulator import Simulator, _Runner
from nereus.sim.traces import Availability, stationary
from nereus.sim.truth import Truth

SPLIT = (0, 1, 8, 9)  # four GPUs across two nodes: TP cannot stay inside a node


@pytest.fixture(scope="module")
def scenario():
    sc = builtin("stationary", steps=20)
    av = Availability((0.0, 100.0, 1500.0), (tuple(range(16)), SPLIT, tuple(range(16))),
                      "16 GPUs, then two from each node, then 16 again")
    return replace(sc, availability=av, lengths=stationary(20, 2600.0, 0.0, 1.5, 0))


def test_a_pool_no_plan_fits_is_waited_out(scenario):
    sc = scenario
    sim = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                    sc.availability, sc.restart, sc.steps)
    assert not sim.usable(SPLIT) and sim.usable((0, 1, 2, 3))
    assert any(ev.pause_s > 0 or any(gap > 0 for _, gap, _ in ev.changes)
               for ev in sim.events)
    res = run_scenario(sc, ["static", "nereus"], workers=1)
    for r in res.results.values():
        assert len(r.rows) == sc.steps
        assert sum(row.paused_s for row in r.rows) > 0
        assert all(row.pool_gpus == 16 for row in r.rows)


def test_a_planned_restart_leaves_no_work_to_lose(scenario):
    sc = scenario
    sim = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                    sc.availability, sc.restart, sc.steps)
    runner = _Runner(None, sim)  # type: ignore[arg-type]
    pool = tuple(range(16))
    plan = StaticPolicy(sim.truth, sc.lengths).plan_for(pool)
    runner.since_ckpt = [1, 2]
    runner._restart(3, Act(Action.RESTART, plan, after_failure=True), pool)
    redo = runner._acc["lost_s"]
    assert redo > 0 and runner.since_ckpt == [1, 2]  # redone, and still unsaved
    runner._restart(4, Act(Action.RESTART, plan, after_failure=False), pool)
    assert runner.since_ckpt == []
    runner._restart(5, Act(Action.RESTART, plan, after_failure=True), pool)
    assert runner._acc["lost_s"] == redo  # nothing more lost after the planned restart


def test_work_redone_after_a_failure_runs_on_the_plan_the_job_restarts_on():
    """Node 1 leaves three steps after a checkpoint: static restarts on node 0 and does steps
    10-12 again there, at node 0's speed (they took about 40 s each on 16 GPUs; the loss at
    550 s of the nominal clock falls in step 13)."""
    sc = builtin("stationary", steps=16)
    sc = replace(sc, availability=Availability((0.0, 550.0), (tuple(range(16)), tuple(range(8))),
                                               "node 1 leaves"))
    sim = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                    sc.availability, sc.restart, sc.steps)
    res = sim.run(make_policies(["static"], sim.truth, sc.lengths, sc.control))
    s = res.results["static"]
    loss = next(e for e in s.events if e.kind == "loss")
    restart = next(e for e in s.events if e.kind == "restart")
    assert loss.step == restart.step == 13
    after = next(r for r in s.rows if r.step == 13)
    before = sum(r.step_s for r in s.rows if 10 <= r.step <= 12)
    plan = StaticPolicy(sim.truth, sc.lengths).plan_for(tuple(range(8)))
    redo = sum(sim.truth.run_step(plan, tuple(range(8)), j, *sc.lengths.at(j))[0]
               for j in (10, 11, 12))
    assert after.lost_s == pytest.approx(loss.seconds + redo)
    assert redo > 1.3 * before  # half the GPUs: the redone steps are slower
    assert after.plan_gpus == 8


class _WaitsOnce(StaticPolicy):
    """Static, except that at step 5 it finds no plan for the (usable) pool once."""

    name = "waits-once"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.waited = False

    def decide(self, tel, upcoming):
        if upcoming[0] == 5 and not self.waited and tel.pool:
            self.waited = self.stopped = True
            return Act(Action.WAIT)
        return super().decide(tel, upcoming)


def test_waiting_on_a_pool_a_plan_fits_is_time_the_job_held_gpus():
    """Paused time (an empty or unusable pool) is the same for every policy and left out of
    tokens/s; a policy that finds no plan where one fits holds its GPUs meanwhile."""
    sc = builtin("stationary", steps=8)
    sim = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                    sc.availability, sc.restart, sc.steps)
    res = sim.run([StaticPolicy(sim.truth, sc.lengths), _WaitsOnce(sim.truth, sc.lengths)])
    base, waits = res.results["static"], res.results["waits-once"]
    assert any(e.kind == "wait" and e.step == 5 for e in waits.events)
    assert waits.paused_s == base.paused_s == 0.0
    assert waits.busy_s >= base.busy_s + sim.nominal[5]
    assert waits.tokens_per_s < base.tokens_per_s


def test_a_pause_while_a_policy_waits_is_paused_as_for_every_policy():
    """The pool empties half way through step 5, while one policy waits there for a plan: the
    pause is the same for every policy (it is not the policy's doing). It was dropped with the
    step's other pool changes: the waiting policy's run was 500 s shorter, none of it paused."""
    sc = builtin("stationary", steps=8)
    probe = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                      sc.availability, sc.restart, sc.steps)
    mid = sum(probe.nominal[:5]) + probe.nominal[5] / 2
    av = Availability((0.0, mid, mid + 500.0), (tuple(range(16)), (), tuple(range(16))),
                      "the pool empties for 500 s in step 5")
    sim = Simulator(probe.truth, sc.lengths, av, sc.restart, sc.steps)
    assert sim.events[5].changes == ((pytest.approx(0.5), pytest.approx(500.0),
                                       tuple(range(16))),)
    res = sim.run([StaticPolicy(sim.truth, sc.lengths), _WaitsOnce(sim.truth, sc.lengths)])
    base, waits = res.results["static"], res.results["waits-once"]
    assert any(e.kind == "wait" and e.step == 5 and e.seconds == sim.nominal[5]
               for e in waits.events)
    assert waits.paused_s == base.paused_s == pytest.approx(500.0)
