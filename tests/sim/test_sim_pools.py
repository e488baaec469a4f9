"""Pools no plan fits are waited out like empty ones; a planned restart saves the work."""

from dataclasses import replace

import pytest

from nereus.control.controller import Action
from nereus.sim.policies import Act
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
    runner.since_ckpt = [40.0, 40.0]
    runner._restart(3, Act(Action.RESTART, None, after_failure=True), pool)
    assert runner._acc["lost_s"] == 80.0 and runner.since_ckpt == [40.0, 40.0]
    runner._restart(4, Act(Action.RESTART, None, after_failure=False), pool)
    assert runner.since_ckpt == []
    runner._restart(5, Act(Action.RESTART, None, after_failure=True), pool)
    assert runner._acc["lost_s"] == 80.0  # nothing more lost after the planned restart
