"""The static policy within verl's plan space: its plans, and where it runs static's plan
because verl's space has none for the whole trace (all numbers simulated)."""

from dataclasses import replace

import pytest

from nereus.sim.policies import StaticPolicy, VerlStaticPolicy, make_policies
from nereus.sim.scenarios import builtin
from nereus.sim.simulator import Simulator
from nereus.sim.traces import stationary
from nereus.sim.truth import Truth
from nereus.spec.workflow import Execution


def _truth(response_len: float, steps: int = 20):
    sc = builtin("stationary", steps=steps)
    sc = replace(sc, lengths=stationary(steps, response_len, 0.0, 1.5, 0))
    return sc, Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed)


def test_on_a_full_pool_every_stage_shares_all_gpus_and_is_no_faster_than_static():
    sc, truth = _truth(2600.0)
    pool = tuple(range(16))
    verl = VerlStaticPolicy(truth, sc.lengths).plan_for(pool)
    full = StaticPolicy(truth, sc.lengths).plan_for(pool)
    assert verl is not None and full is not None
    assert all(sorted(sp.gpus) == list(pool) for sp in verl.stages)
    assert verl.stage("actor_gen").candidate.pp == 1
    assert verl.stage("critic_infer").layout == verl.stage("critic_train").layout
    price = [truth.price(p, pool, 0, *sc.lengths.at(0)).step_s for p in (verl, full)]
    assert price[0] >= price[1] * (1 - 1e-9)


def test_where_verl_has_no_plan_it_runs_statics_and_says_so():
    """8,000-token responses (12,000 the longest) on 7 GPUs: verl's space fits neither 4 nor
    any other count of them, static's best runs on 6."""
    sc, truth = _truth(8000.0)
    seven, twelve = tuple(range(7)), tuple(range(12))
    verl = VerlStaticPolicy(truth, sc.lengths)
    plan = verl.plan_for(seven)
    assert plan is not None
    assert plan.stages == StaticPolicy(truth, sc.lengths).plan_for(seven).stages
    assert verl.fallback_pools == {seven}
    on_twelve = verl.plan_for(twelve)  # verl's own plan, on one whole node
    assert on_twelve is not None and sorted(on_twelve.gpus()) == list(range(8))
    assert verl.fallback_pools == {seven}


def test_it_runs_by_name_and_is_not_faster_than_static():
    sc, truth = _truth(2600.0, steps=6)
    sim = Simulator(truth, sc.lengths, sc.availability, sc.restart, sc.steps)
    res = sim.run(make_policies(["static", "static_verl"], truth, sc.lengths, sc.control))
    s, v = res.results["static"], res.results["static_verl"]
    assert len(v.rows) == len(s.rows) == 6
    assert v.tokens_per_s <= s.tokens_per_s * (1 + 1e-9)
    assert v.tokens_per_s == pytest.approx(s.tokens_per_s, rel=0.2)


def test_an_asynchronous_job_is_refused_rather_than_run_as_static():
    """verl's hybrid engine has no asynchronous plan: every pool would fall back to static's
    plan, and the run would print static's figures under another name."""
    from nereus.errors import InputError

    sc, _ = _truth(2600.0, steps=3)
    job = replace(sc.job, workflow=replace(sc.job.workflow, execution=Execution.ASYNC))
    truth = Truth(job, sc.hidden, sc.drift, sc.noise, sc.seed)
    with pytest.raises(InputError, match="asynchronous"):
        make_policies(["static_verl"], truth, sc.lengths, sc.control)


def test_the_command_refuses_it_for_an_asynchronous_scenario_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from nereus.cli import app

    (tmp_path / "run.yaml").write_text(
        "name: mine\n"
        "job: {model: llama-3.1-8b, gpus: 16, execution: async}\n"
        "steps: 3\n"
        "lengths: {growth: {start: 500, end: 800}}\n")
    r = CliRunner().invoke(app, ["simulate", "--config", str(tmp_path / "run.yaml"),
                                 "--policies", "static,static_verl"])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --policies: static_verl"), r.output
