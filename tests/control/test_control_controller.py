"""The controller on the paper's default job with hand-made telemetry."""

import math
from dataclasses import replace

import pytest

from nereus.control.controller import Action, ControlConfig, Controller
from nereus.control.horizon import Horizons
from nereus.control.monitor import TriggerKind
from nereus.control.restart import RestartParams, checkpoint_bytes, restart_cost
from nereus.control.targets import reprice, survive
from nereus.control.telemetry import Telemetry
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import BUBBLE
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.plan.search import Planner, best_plan
from nereus.spec import GpuPool, parse_job

JOB = {"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
       "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
       "workload": {"response_len": 2000, "response_len_max": 3000}}
HIDDEN = Efficiencies({OpClass.GEMM: 0.6, OpClass.ATTENTION: 0.4, OpClass.DECODE: 0.7,
                       OpClass.ALLREDUCE_INTRA: 0.75, OpClass.ALLREDUCE_INTER: 0.4,
                       OpClass.HOST: 0.75, OpClass.OPTIMIZER: 0.65})


@pytest.fixture(scope="module")
def job():
    return parse_job(JOB)


def packed(job, cost, spread=False):
    """The search's packed plan (the spread one when asked), not the faster of the two: the
    node-loss tests need plans that leave a last copy with a node whichever is faster."""
    return Planner(job, cost=cost, spread=spread).best_placed()


@pytest.fixture(scope="module")
def plans(job):
    small = best_plan(job.with_pool(GpuPool(job.cluster, tuple(range(8)))))
    return {"best16": Planner(job).best_placed(), "best8": small}


def _at_length(job, mean):
    """``job`` planned for responses of ``mean`` tokens: the length reference it starts from."""
    return job.with_workload(job.workload.with_response_len(mean, job.workload.response_len_max))


class _Sched:
    """A stand-in schedule with a chosen L_tran (the transition layer is tested elsewhere)."""

    def __init__(self, seconds, feasible=True):
        self.estimated_s = seconds if feasible else math.inf
        self.feasible = feasible
        self.reason = "" if feasible else "GPU 0 lacks 1 GiB"


def _tel(job, plan, step, mean, pool=None, longest=None, eff=None):
    """Telemetry of ``plan`` at ``mean`` tokens: each stage as the cost model under ``eff``."""
    w = job.workload.with_response_len(int(mean), int(longest or mean * 1.5))
    cost = CostModel(job.with_workload(w), eff)
    p = reprice(job.with_workload(w), cost, plan).plan
    return Telemetry(step, float(mean), int(longest or mean * 1.5),
                     tuple(pool if pool is not None else job.pool.ids),
                     {s.stage: s.latency_s for s in p.stages},
                     {s.stage: s.peak_mem_bytes for s in p.stages})


def _drift_decision(job, plans, l_tran, gamma=0.5):
    """Start on the 8-GPU plan with 16 GPUs in the pool; a length crossing triggers."""
    lines = []
    c = Controller(job, plans["best8"], config=ControlConfig(gamma=gamma),
                   transition=lambda j, s, t, e: _Sched(l_tran), on_log=lines.append)
    d0 = c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    assert d0.action is Action.KEEP and not d0.reasons.triggers
    return c, c.on_boundary(_tel(job, plans["best8"], 1, 2700)), lines


def test_no_trigger_keeps_the_plan_and_learns(job, plans):
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    before = c.calibrator.samples
    d = c.on_boundary(_tel(job, plans["best16"], 0, 2000))
    assert d.action is Action.KEEP and d.plan is c.plan and d.reasons.triggers == ()
    assert c.calibrator.samples == before + len(plans["best16"].stages)
    assert d.source == "estimated" and "keep [no trigger]" in d.log_line()


def test_reasons_match_their_numbers_and_payback_is_admitted_at_its_boundary(job, plans):
    _, probe, _ = _drift_decision(job, plans, 1e9)
    r = probe.reasons
    assert probe.action is Action.KEEP
    assert [t.kind for t in r.triggers] == [TriggerKind.DRIFT]
    assert r.triggers[0].signal == "response_len" and r.horizon_steps == 1.0
    best = r.verdicts[0]
    assert best.label == "best" and not best.admitted and "rejected" in best.why
    delta = r.current_step_s - r.target_step_s
    assert delta > 0 and best.delta_l_s == pytest.approx(delta)
    assert best.payback_steps == pytest.approx(1e9 / delta)
    # L_tran exactly γ·H·ΔL is admitted; a hair more is not
    _, d, lines = _drift_decision(job, plans, 0.5 * 1.0 * delta)
    assert d.action is Action.MOVE and d.schedule is not None
    assert d.reasons.delta_l_s == pytest.approx(delta)
    assert d.reasons.l_tran_s == pytest.approx(0.5 * delta)
    assert d.reasons.payback_steps == pytest.approx(0.5)
    assert d.reasons.l_tran_s / d.reasons.delta_l_s <= d.reasons.gamma * d.reasons.horizon_steps
    line = lines[-1]
    assert "\n" not in line and line.startswith("step 1 move")
    assert f"ΔL={delta:.3g} s" in line and "H=1" in line and "(estimated)" in line
    _, d, _ = _drift_decision(job, plans, 0.5 * delta * (1 + 1e-6))
    assert d.action is not Action.MOVE or d.reasons.chosen != "best"


def test_the_log_line_labels_the_triggers_with_the_telemetrys_source(job, plans):
    """The line said "(estimated)" once, at its end, though the length and the pool in its
    triggers came from the telemetry (measured in a run, simulated in ``nereus simulate``):
    the triggers now carry the telemetry's source, the estimates keep "(estimated)"."""
    _, d, lines = _drift_decision(job, plans, 1.0)
    line = lines[-1]
    assert d.observed == "measured" and "\n" not in line
    assert line.startswith("step 1 move [response_len 2700 vs ref 2000 (+35.0%, past δ=30%)] "
                           "(measured) L "), line
    assert line.endswith("(estimated)") and line.count("(estimated)") == 1, line
    lines.clear()
    c = Controller(job, plans["best16"], on_log=lines.append)
    c.on_boundary(replace(_tel(job, plans["best16"], 0, 2000), source="simulated"))
    assert lines[-1] == "step 0 keep [no trigger] (estimated)"  # nothing read: no label
    d = c.on_boundary(replace(_tel(job, plans["best16"], 1, 2000, pool=tuple(range(8))),
                              source="simulated"))
    assert d.reasons.triggers[0].kind is TriggerKind.POOL_LOSS
    assert lines[-1].startswith(f"step 1 {d.action.value} [pool_loss: lost GPUs 8-15 (8), "
                                "the plan used all of them] (simulated) "), lines[-1]


def test_a_memory_trigger_beside_a_telemetry_trigger_is_labelled_estimated():
    """A memory trigger is the cost model's prediction: beside a pool change each trigger
    names its own source; alone it is labelled estimated; a trigger with no value (always,
    onward) none, so ``simulate --log`` still finds ``keep [always]``."""
    from nereus.control.controller import Decision, Reasons
    from nereus.control.monitor import Trigger
    loss = Trigger(TriggerKind.POOL_LOSS, "pool", True, 8.0, 16.0, None, "lost GPUs 8-15 (8)")
    mem = Trigger(TriggerKind.MEMORY, "memory", True, 9e10, 8e10, None,
                  "actor_gen predicted 83.8 GiB > 74.5 GiB allowed")
    both = Decision(Action.KEEP, None, reasons=Reasons(3, (loss, mem)), observed="simulated")
    assert both.log_line() == ("step 3 keep [pool_loss: lost GPUs 8-15 (8) (simulated); "
                               "memory: actor_gen predicted 83.8 GiB > 74.5 GiB allowed "
                               "(estimated)] (estimated)")
    alone = Decision(Action.KEEP, None, reasons=Reasons(3, (mem,)), observed="simulated")
    assert alone.log_line().startswith("step 3 keep [memory: actor_gen predicted 83.8 GiB > "
                                       "74.5 GiB allowed] (estimated) ")
    always = Decision(Action.KEEP, None, reasons=Reasons(3, (Trigger(TriggerKind.ALWAYS,
                                                                     "always", False),)),
                      observed="simulated")
    assert always.log_line() == "step 3 keep [always] (estimated)"


def test_an_efficiency_drift_is_labelled_estimated_from_the_telemetrys_times():
    """An efficiency is the calibrator's fit to the step's times, not a value the telemetry
    gave: its drift reads "estimated from simulated times" (or measured), beside a length
    drift that reads the telemetry's own source."""
    from nereus.control.controller import Decision, Reasons
    from nereus.control.monitor import Trigger
    eff = Trigger(TriggerKind.DRIFT, "eff.allreduce.intra", False, 0.2721, 0.5831, 0.2)
    length = Trigger(TriggerKind.DRIFT, "response_len", False, 2700.0, 2000.0, 0.3)
    alone = Decision(Action.KEEP, None, reasons=Reasons(4, (eff,)), observed="simulated")
    assert alone.log_line().startswith(
        "step 4 keep [eff.allreduce.intra 0.2721 vs ref 0.5831 (-53.3%, past δ=20%)] "
        "(estimated from simulated times) "), alone.log_line()
    both = Decision(Action.KEEP, None, reasons=Reasons(4, (length, eff)), observed="measured")
    assert both.log_line().startswith(
        "step 4 keep [response_len 2700 vs ref 2000 (+35.0%, past δ=30%) (measured); "
        "eff.allreduce.intra 0.2721 vs ref 0.5831 (-53.3%, past δ=20%) "
        "(estimated from measured times)] "), both.log_line()


def test_a_plan_that_cannot_run_shows_only_the_targets_node_loss_risk():
    """An urgent move off a plan that lost its GPUs printed ``node-loss risk 0->8.83``: the 0
    read as the old plan's risk, which it is not (it has no step to price). The risk is shown
    like the L, the target's alone; with a current plan both, as before."""
    from nereus.control.controller import Decision, Reasons
    lost = Reasons(176, target_step_s=51.57, target_risk_s=8.83)
    line = Decision(Action.MOVE, None, reasons=lost).log_line()
    assert "L_target 51.57 s node-loss risk 8.83 s/step" in line and "->" not in line
    both = Reasons(177, current_step_s=57.11, target_step_s=57.09, current_risk_s=9.32,
                   target_risk_s=18.6)
    assert "node-loss risk 9.32->18.6 s/step" in Decision(Action.KEEP, None,
                                                          reasons=both).log_line()
    none = Reasons(3, target_step_s=51.57)
    assert "risk" not in Decision(Action.MOVE, None, reasons=none).log_line()


def test_rejected_replan_resets_references_so_the_same_length_does_not_retrigger(job, plans):
    c, d, _ = _drift_decision(job, plans, 1e9)
    assert d.action is Action.KEEP and d.reasons.triggers
    again = c.on_boundary(_tel(job, plans["best8"], 2, 2700))
    assert again.reasons.triggers == ()
    later = c.on_boundary(_tel(job, plans["best8"], 3, 2700 * 1.31))
    assert [t.signal for t in later.reasons.triggers] == ["response_len"]
    assert later.reasons.horizon_steps == 2.0           # crossings at steps 1 and 3


def test_gamma_zero_never_moves_opportunistically(job, plans):
    _, d, _ = _drift_decision(job, plans, 0.0, gamma=0.0)
    assert d.action is Action.KEEP
    assert "γ = 0" in d.reasons.verdicts[0].why


def test_urgent_path_moves_from_the_intact_units_when_a_gpu_is_lost(job, plans):
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    gone = p.stage("actor_train").replicas[-1][-1]  # one of two actor replicas loses a GPU
    pool = tuple(g for g in range(16) if g != gone)
    survivors, lost, rebuilt = survive(p, pool, job.workflow)
    assert survivors is not None and not lost and not rebuilt
    d = c.on_boundary(_tel(job, p, 1, 2000, pool=pool))
    assert d.reasons.urgent
    assert any(t.kind is TriggerKind.POOL_LOSS and t.urgent for t in d.reasons.triggers)
    assert d.action is Action.MOVE and set(d.plan.gpus()) <= set(pool)
    assert d.schedule.feasible and d.reasons.l_tran_s == d.schedule.estimated_s
    assert d.reasons.current_step_s is None and d.reasons.target_step_s > 0
    assert c.plan is d.plan and c.pool == pool


@pytest.mark.parametrize("max_tries", [3, 6, 12])
def test_an_urgent_replan_prices_at_most_max_tries_schedules(job, plans, max_tries):
    """A GPU of actor training is lost and only moves that leave actor training where it is
    can run. The replan prices S* and its placements near the current GPUs, the move that
    carries no state, the other options fastest first, and -- for a stopgap -- the move on
    from it to S*: max_tries bounds them all (it priced 14 schedules under max_tries = 12)."""
    p = plans["best16"]
    calls = []

    def transition(j, source, target, e):
        calls.append((source, target))
        stays = target.stage("actor_train").replicas == source.stage("actor_train").replicas
        return _Sched(1.0, feasible=stays)

    c = Controller(job, p, config=ControlConfig(max_tries=max_tries), transition=transition,
                   on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    c.horizons = c.horizons.crossed("pool", 0).crossed("pool", 40)  # H_pool = 40: onward pays
    gone = p.stage("actor_train").replicas[-1][-1]
    pool = tuple(g for g in range(16) if g != gone)
    d = c.on_boundary(_tel(job, p, 1, 2000, pool=pool))
    assert d.reasons.urgent and len(calls) <= max_tries
    # the move in place is priced within every budget: it is what an urgent move falls back on
    assert ("re-batched in place", True) in [(v.label, v.feasible) for v in d.reasons.verdicts]
    if max_tries == 12:  # a stopgap, whose move on to S* was priced within the budget
        assert d.action is Action.MOVE and c.pending[0].kind is TriggerKind.ONWARD
        assert calls[-1][0] is d.plan and len(calls) == 12


@pytest.mark.parametrize("max_tries", [2, 12])
def test_an_opportunistic_replan_prices_at_most_max_tries_schedules(job, plans, max_tries):
    """No move can run: the replan prices S*'s placements near the current GPUs, then the
    fallbacks, and stops at max_tries (it priced 3 under max_tries = 2: all of S*'s
    placements came before the count)."""
    calls = []

    def transition(j, source, target, e):
        calls.append(target)
        return _Sched(0.0, feasible=False)

    c = Controller(job, plans["best8"], config=ControlConfig(max_tries=max_tries),
                   transition=transition, on_log=lambda s: None)
    c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    d = c.on_boundary(_tel(job, plans["best8"], 1, 2700))
    assert not d.reasons.urgent and d.action is Action.KEEP
    assert len(calls) == len(d.reasons.verdicts) == max_tries


def test_losing_the_last_copy_of_trained_state_restarts_from_the_checkpoint(job, plans):
    p = plans["best16"]
    critic = p.stage("critic_train")
    pool = tuple(g for g in range(16) if g not in critic.replicas[0])
    assert survive(p, pool, job.workflow)[:2] == (None, ("critic_train",))
    c = Controller(job, p, on_log=lambda s: None)
    d = c.on_boundary(_tel(job, p, 0, 2000, pool=pool))
    assert d.action is Action.RESTART and d.restart is not None
    assert "critic_train" in d.reasons.summary and d.reasons.restart_s == d.restart.seconds
    assert d.restart.lost_s > 0 and d.restart.save_s == 0      # after a failure
    assert set(d.plan.gpus()) <= set(pool)


def test_predicted_memory_violation_is_urgent(job, plans):
    p = plans["best16"]
    c = Controller(job, p, config=ControlConfig(restart_moves=False), on_log=lambda s: None)
    c.horizons = Horizons(ema={"response_len": 7.0, "pool": 3.0})
    d = c.on_boundary(_tel(job, p, 0, 6000, longest=24000))
    kinds = [t.kind for t in d.reasons.triggers]
    assert TriggerKind.MEMORY in kinds and d.reasons.urgent
    assert d.reasons.horizon_steps == 7.0  # memory runs out as responses grow: their horizon
    # urgent: payback waived, the least L_tran + H x L_step among the feasible options
    assert d.action is Action.MOVE
    feasible = [v for v in d.reasons.verdicts if v.feasible]
    chosen = next(v for v in feasible if v.admitted)
    assert all(chosen.l_tran_s + 7.0 * chosen.step_s <= v.l_tran_s + 7.0 * v.step_s
               for v in feasible)
    # among them the re-batched current layout (smaller micro-batches, recomputation), which
    # moves no state: what runs when no layout can move
    assert any(v.label == "re-batched in place" and v.l_tran_s == 0.0 for v in feasible)
    stuck = Controller(job, p, config=ControlConfig(restart_moves=False), on_log=lambda s: None,
                       transition=lambda j, s, t, e: _Sched(
                           0.0, feasible=all(a.layout == b.layout
                                             for a, b in zip(s.stages, t.stages))))
    stuck.horizons = c.horizons
    d = stuck.on_boundary(_tel(job, p, 0, 6000, longest=24000))
    assert d.action is Action.MOVE and d.reasons.chosen == "re-batched in place"
    assert d.reasons.l_tran_s == 0.0
    for a, b in zip(p.stages, d.plan.stages):
        assert (a.layout, a.replicas) == (b.layout, b.replicas)
    assert any(a.candidate != b.candidate for a, b in zip(p.stages, d.plan.stages))


def test_an_empty_pool_waits_and_the_return_of_gpus_restarts(job, plans):
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    d = c.on_boundary(Telemetry(0, 2000.0, 3000, ()))
    assert d.action is Action.WAIT and d.plan is None and c.stopped
    d = c.on_boundary(Telemetry(0, 2000.0, 3000, tuple(range(16))))
    assert d.action is Action.RESTART and not c.stopped and d.restart.lost_s > 0
    # the log splits the estimate as simulate's table splits restart and lost (redo) time
    rc = d.restart
    assert (f"restart={rc.seconds:.0f} s (start-up {rc.startup_s:.0f} + load {rc.load_s:.0f} "
            f"+ redo {rc.lost_s:.0f} s)") in d.log_line()


def test_the_pool_emptying_and_coming_back_are_crossings_of_h_pool(job, plans):
    """H_pool learns from every change of the pool, the waits and resumes included."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    full = tuple(range(16))
    for step, pool in ((4, tuple(range(8))), (10, ()), (12, full), (14, ())):
        c.on_boundary(Telemetry(step, 2000.0, 3000, pool))
    assert c.horizons.last_crossing["pool"] == 14
    assert c.horizons.of("pool") == pytest.approx(0.25 * 6 + 0.25 * 2 + 0.5 * 2)


def test_replan_without_admission_moves_whenever_faster(job, plans):
    c = Controller(job, plans["best8"], config=ControlConfig(admission=False),
                   transition=lambda j, s, t, e: _Sched(1e6), on_log=lambda s: None)
    d = c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.ALWAYS]
    assert d.action is Action.MOVE and d.reasons.l_tran_s == 1e6


def test_calibrated_stage_latency_within_10_percent_after_10_steps(job, plans):
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    for k in range(10):
        c.on_boundary(_tel(job, p, k, 2000 + 10 * k, eff=HIDDEN))
    w = job.workload.with_response_len(2100, 3150)
    truth = reprice(job, CostModel(job.with_workload(w), HIDDEN), p).plan
    pred = reprice(job, CostModel(job.with_workload(w), c.calibrator.efficiencies()), p).plan
    for t, q in zip(truth.stages, pred.stages):
        assert abs(q.latency_s - t.latency_s) / t.latency_s < 0.10, t.stage


def test_restart_cost_terms(job):
    params = RestartParams(startup_s=100.0, storage_read_bw_per_node=1e9,
                           storage_write_bw_per_node=5e8, checkpoint_interval_steps=10)
    nbytes = checkpoint_bytes(job)
    # actor and critic: θ (bf16) + fp32 master + two fp32 moments; reference and reward: θ
    m = job.model
    from nereus.spec.model import Head
    expect = (m.param_count(Head.LM) + m.param_count(Head.SCALAR)) * 14 \
        + (m.param_count(Head.LM) + m.param_count(Head.SCALAR)) * 2
    assert nbytes == expect
    rc = restart_cost(job, params, step_s=50.0)
    assert rc.load_s == pytest.approx(nbytes / 2e9)      # two nodes read in parallel
    assert rc.lost_s == 5 * 50.0 and rc.save_s == 0
    planned = restart_cost(job, params, step_s=50.0, after_failure=False)
    trained = (m.param_count(Head.LM) + m.param_count(Head.SCALAR)) * 14  # written first
    assert planned.lost_s == 0 and planned.save_s == pytest.approx(trained / 1e9)
    assert planned.seconds == pytest.approx(100.0 + nbytes / 2e9 + trained / 1e9)
    assert "restart" in planned.explain()


def test_a_running_transition_defers_opportunistic_replans(job, plans):
    c = Controller(job, plans["best8"], transition=lambda j, s, t, e: _Sched(0.0),
                   on_log=lambda s: None)
    c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    busy = replace(_tel(job, plans["best8"], 1, 2700), transition_running=True)
    d = c.on_boundary(busy)
    assert d.action is Action.KEEP and "deferred" in d.reasons.summary
    assert [t.signal for t in d.reasons.triggers] == ["response_len"]
    d = c.on_boundary(_tel(job, plans["best8"], 2, 2700))
    assert d.action is Action.MOVE
    assert [t.signal for t in d.reasons.triggers] == ["response_len"]


def test_a_running_transition_defers_a_memory_replan_too(job, plans):
    """A predicted memory violation while a transition runs waits for its end: the plan it
    would be checked against is the transition's target, whose layout does not exist yet (the
    controller replanned from it at once, and credited the step to the target's candidates)."""
    p = plans["best16"]
    c = Controller(job, p, config=ControlConfig(restart_moves=False), on_log=lambda s: None)
    busy = replace(_tel(job, p, 0, 6000, longest=24000), transition_running=True)
    d = c.on_boundary(busy)
    assert d.action is Action.KEEP and "deferred" in d.reasons.summary
    assert TriggerKind.MEMORY in [t.kind for t in d.reasons.triggers]
    assert c.plan is p
    d = c.on_boundary(_tel(job, p, 1, 6000, longest=24000))
    assert TriggerKind.MEMORY in [t.kind for t in d.reasons.triggers] and d.reasons.urgent
    assert d.action is Action.MOVE


def test_a_deferred_memory_trigger_is_checked_again_not_listed_as_urgent(job, plans):
    """Memory is predicted anew at every boundary, as pool changes are counted anew: a
    violation that waited for a transition and no longer holds (the longest response left the
    window) is not listed at the replan, where it would be an urgent trigger of a replan that
    ``Reasons.urgent`` says is not urgent."""
    p = plans["best16"]
    c = Controller(job, p, config=ControlConfig(length_window=1),
                   transition=lambda j, s, t, e: _Sched(1.0), on_log=lambda s: None)
    d = c.on_boundary(replace(_tel(job, p, 0, 6000, longest=24000), transition_running=True))
    assert "deferred" in d.reasons.summary
    assert [t.kind for t in d.reasons.triggers if t.urgent] == [TriggerKind.MEMORY]
    d = c.on_boundary(_tel(job, p, 1, 2000, longest=3000))
    assert not d.reasons.urgent
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.DRIFT]  # the crossing waited
    assert all(t.urgent == d.reasons.urgent for t in d.reasons.triggers)


def test_no_feasible_transition_prices_a_planned_restart_under_eq2(job, plans):
    fast = RestartParams(startup_s=1.0, storage_read_bw_per_node=1e12,
                         storage_write_bw_per_node=1e12)
    for moves, expect in ((True, Action.RESTART), (False, Action.KEEP)):
        c = Controller(job, plans["best8"],
                       config=ControlConfig(restart=fast, restart_moves=moves),
                       transition=lambda j, s, t, e: _Sched(0.0, feasible=False),
                       on_log=lambda s: None)
        c.on_boundary(_tel(job, plans["best8"], 0, 2000))
        d = c.on_boundary(_tel(job, plans["best8"], 1, 2700))
        assert d.action is expect
        if expect is Action.RESTART:
            assert d.restart.save_s > 0 and d.restart.lost_s == 0      # planned
            assert d.reasons.payback_steps <= d.reasons.gamma * d.reasons.horizon_steps


def _churn(job, plans, config):
    """Node 1 goes and comes back, then node 0: the second return is replanned with a known
    loss rate (one every 20 steps)."""
    from nereus.plan.exposure import exposed_fraction
    c = Controller(job, plans["best16"], config=config, planner=packed,
                   transition=lambda j, s, t, e: _Sched(1.0), on_log=lambda s: None)
    full, node0, node1 = tuple(range(16)), tuple(range(8)), tuple(range(8, 16))
    decisions = []
    for step, pool in ((0, node0), (10, full), (20, node1), (30, full)):
        decisions.append(c.on_boundary(_tel(job, c.plan, step, 2000, pool=pool)))
    assert c.horizons.of("pool_loss") == 20.0
    return decisions, exposed_fraction(decisions[-1].plan, job.cluster)


def test_once_nodes_come_and_go_the_best_target_spreads_replicas_over_nodes(job, plans):
    decisions, exposed = _churn(job, plans, ControlConfig())
    first_return, last = decisions[1], decisions[-1]
    assert "spreads replicas" not in first_return.reasons.summary  # one loss: no rate yet
    assert last.action in (Action.MOVE, Action.RESTART) and exposed == 0.0
    assert "spreads replicas over nodes" in last.reasons.summary
    assert "a loss every 20 steps" in last.reasons.summary


def test_an_emptied_pool_is_no_node_loss_in_the_loss_rate(job, plans):
    """Every GPU goes and comes back, then node 1 goes and comes back: one node loss, so no
    loss rate yet, and the return is not replanned to spread replicas. The emptied pool took
    every plan's state alike (spread or not); once it counted as a loss, the one node loss
    made a rate of one every 20 steps and the return spread replicas over nodes."""
    c = Controller(job, plans["best16"], planner=packed,
                   transition=lambda j, s, t, e: _Sched(1.0), on_log=lambda s: None)
    full, node0 = tuple(range(16)), tuple(range(8))
    for step, pool in ((0, full), (10, ()), (10, full), (30, node0), (40, full)):
        d = c.on_boundary(_tel(job, c.plan, step, 2000, pool=pool))
    assert "pool_loss" not in c.horizons.ema and c.horizons.last_crossing["pool_loss"] == 30
    assert c.horizons.of("pool") == pytest.approx(15.0)  # every change of the pool counts
    assert d.reasons.current_risk_s == d.reasons.target_risk_s == 0.0
    assert "spreads" not in d.reasons.summary


def test_spreading_is_off_with_spread_on_churn_false(job, plans):
    decisions, exposed = _churn(job, plans, ControlConfig(spread_on_churn=False))
    assert exposed > 0 and "spreads" not in decisions[-1].reasons.summary


def test_the_payback_rule_counts_the_node_loss_risk_on_both_sides(job, plans):
    """On a plan that loses a last copy with either node, once losses come every 20 steps: a
    length trigger prices the spread target against the current plan's risk too, and the
    decision's ΔL is the difference of the risk-inclusive latencies it reports."""
    from nereus.plan.exposure import exposed_fraction
    assert exposed_fraction(plans["best16"], job.cluster) > 0
    c = Controller(job, plans["best16"], transition=lambda j, s, t, e: _Sched(1.0),
                   planner=packed, on_log=lambda s: None)
    c.horizons = c.horizons.crossed("pool_loss", 0).crossed("pool_loss", 20)
    c.on_boundary(_tel(job, c.plan, 21, 2000))
    d = c.on_boundary(_tel(job, c.plan, 22, 2700))
    r = d.reasons
    assert [t.signal for t in r.triggers] == ["response_len"]
    assert r.current_risk_s > 0 and r.target_risk_s == 0.0
    # the risk repays the move: the spread target is at most a little faster (its weight sync
    # finds every generation GPU on a node with training GPUs)
    assert r.current_risk_s > 100 * max(0.0, r.current_step_s - r.target_step_s)
    assert d.action is Action.MOVE and exposed_fraction(d.plan, job.cluster) == 0.0
    assert r.delta_l_s == pytest.approx(r.current_step_s + r.current_risk_s
                                        - r.target_step_s - r.target_risk_s)
    assert f"node-loss risk {r.current_risk_s:.3g}->0 s/step" in d.log_line()
    off = Controller(job, plans["best16"], config=ControlConfig(spread_on_churn=False),
                     transition=lambda j, s, t, e: _Sched(1.0), planner=packed,
                     on_log=lambda s: None)
    off.horizons = c.horizons
    off.on_boundary(_tel(job, off.plan, 21, 2000))
    r = off.on_boundary(_tel(job, off.plan, 22, 2700)).reasons
    assert r.current_risk_s == r.target_risk_s == 0.0 and "node-loss" not in r.summary


def _risk_replan(job, plans, loss_every, planner=packed):
    """On the packed 16-GPU plan (a node takes a last copy) with a pool loss every
    ``loss_every`` steps: the decision of a length trigger."""
    c = Controller(job, plans["best16"], transition=lambda j, s, t, e: _Sched(1.0),
                   planner=planner, on_log=lambda s: None)
    c.horizons = c.horizons.crossed("pool_loss", 0).crossed("pool_loss", loss_every)
    c.on_boundary(_tel(job, c.plan, loss_every + 1, 2000))
    return c.on_boundary(_tel(job, c.plan, loss_every + 2, 2700))


def test_the_node_loss_risk_is_the_restart_cost_spread_over_h_loss(job, plans):
    """(1 / H_loss) x exposed share x restart: losses half as often halve the risk of the same
    plan at the same lengths."""
    every20 = _risk_replan(job, plans, 20).reasons
    every40 = _risk_replan(job, plans, 40).reasons
    assert every20.current_step_s == pytest.approx(every40.current_step_s)
    assert every20.current_risk_s > 0
    assert every20.current_risk_s == pytest.approx(2.0 * every40.current_risk_s)


def test_a_spread_plan_that_keeps_the_node_loss_risk_is_not_taken_for_s_star(job, plans):
    """A planner whose "spread" plan is the packed one: it is no faster and carries the same
    risk, so S* stays the plan searched without spreading, with no note that it spreads
    replicas (weighing the spread plan without its own risk took it, and said so)."""
    def unspread(job, cost, spread=False):
        return packed(job, cost)

    d = _risk_replan(job, plans, 20, planner=unspread)
    r = d.reasons
    assert r.current_risk_s > 0 and r.target_risk_s == pytest.approx(r.current_risk_s)
    assert "spreads replicas" not in r.summary, r.summary


def test_an_urgent_move_short_of_the_best_target_is_replanned_at_the_next_boundary(job, plans):
    p = plans["best16"]
    def only_in_place(j, s, t, e):  # moves that change no layout are all that can run
        same = all(a.layout == b.layout for a, b in zip(s.stages, t.stages))
        return _Sched(0.0, feasible=same)

    c = Controller(job, p, config=ControlConfig(restart_moves=False),
                   transition=only_in_place, on_log=lambda s: None)
    c.horizons = Horizons(ema={"response_len": 7.0, "pool": 3.0})
    d = c.on_boundary(_tel(job, p, 0, 6000, longest=24000))
    assert d.action is Action.MOVE and d.reasons.chosen == "re-batched in place"
    assert [t.kind for t in c.pending] == [TriggerKind.ONWARD]
    nxt = c.on_boundary(_tel(job, d.plan, 1, 6000, longest=24000))
    assert TriggerKind.ONWARD in [t.kind for t in nxt.reasons.triggers]
    assert nxt.reasons.horizon_steps == 7.0  # the horizon of what drove the urgent move
    assert not c.pending


def test_when_no_plan_fits_the_length_margin_the_controller_plans_for_the_longest_itself(
        job, plans):
    c = Controller(job, plans["best16"], config=ControlConfig(length_margin=1000.0),
                   transition=lambda j, s, t, e: _Sched(1.0), on_log=lambda s: None)
    d = c.on_boundary(_tel(job, c.plan, 0, 2000))
    assert d.action is not Action.WAIT and d.plan is not None
    assert "no plan fits the longest response plus the 100000% margin" in d.reasons.summary
    d = c.on_boundary(_tel(job, c.plan, 1, 2000))
    assert d.action is Action.KEEP and not d.reasons.triggers  # no memory alarm every step


def test_a_loss_of_gpus_the_plan_does_not_use_replans_while_a_transition_runs(job, plans):
    c = Controller(job, plans["best8"], transition=lambda j, s, t, e: _Sched(1.0),
                   on_log=lambda s: None)
    c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    busy = replace(_tel(job, plans["best8"], 1, 2000, pool=tuple(range(12))),
                   transition_running=True)
    d = c.on_boundary(busy)
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.POOL_LOSS]
    assert not d.reasons.triggers[0].urgent and "deferred" not in d.reasons.summary
    assert c.pool == tuple(range(12))


def test_an_urgent_replan_takes_the_smallest_horizon_of_all_its_triggers(job, plans):
    c = Controller(job, plans["best16"], transition=lambda j, s, t, e: _Sched(1.0),
                   on_log=lambda s: None)
    for step in (0, 50, 100):  # lengths crossed every 50 steps
        c.horizons = c.horizons.crossed("response_len", step)
    for step in (97, 100):     # the pool every 3
        c.horizons = c.horizons.crossed("pool", step)
    c.on_boundary(_tel(job, c.plan, 101, 2000))
    d = c.on_boundary(_tel(job, c.plan, 103, 2700, pool=tuple(range(8))))  # both at once
    kinds = {t.kind for t in d.reasons.triggers}
    assert {TriggerKind.POOL_LOSS, TriggerKind.DRIFT} <= kinds and d.reasons.urgent
    assert d.reasons.horizon_steps == c.horizons.of("pool") < c.horizons.of("response_len")


def test_with_an_intact_copy_and_no_feasible_move_the_restart_saves_instead_of_redoing(job):
    spread = Planner(job, spread=True).best()
    c = Controller(job, spread, transition=lambda j, s, t, e: _Sched(0.0, feasible=False),
                   on_log=lambda s: None)
    c.on_boundary(_tel(job, spread, 0, 2000))
    d = c.on_boundary(_tel(job, spread, 1, 2000, pool=tuple(range(8))))  # node 1 goes
    assert d.action is Action.RESTART and "no feasible move" in d.reasons.summary
    assert d.restart.lost_s == 0 and d.restart.save_s > 0  # planned: nothing redone


def test_memory_measured_without_times_is_still_learned(job, plans):
    """A step that reports peak memory but no stage latency (a profiled run whose slowed times
    the framework drops) teaches the memory scale, and counts as no calibration step."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    tel = _tel(job, plans["best16"], 0, 2000)
    doubled = {k: 2 * v for k, v in tel.peak_mem_bytes.items()}
    c.on_boundary(replace(tel, latency_s={}, peak_mem_bytes=doubled))
    scale = c.calibrator.memory_scale()
    assert scale and all(v == pytest.approx(2.0, rel=0.05) for v in scale.values())
    assert c.steps_seen == 0 and c.calibrator.samples == 0


def test_a_planned_restart_writes_only_the_state_training_changed(job):
    """The reference and reward models are frozen: a restart reads their weights again, but
    the checkpoint written before a planned restart holds θ and ω of the actor and critic
    only (what verl and OpenRLHF save). The simulator charges the same write."""
    from nereus.control.restart import saved_bytes
    from nereus.spec.model import Head
    params = RestartParams(startup_s=0.0, storage_read_bw_per_node=1e9,
                           storage_write_bw_per_node=1e9)
    m = job.model
    trained = (m.param_count(Head.LM) + m.param_count(Head.SCALAR)) * 14
    assert saved_bytes(job) == trained < checkpoint_bytes(job)
    planned = restart_cost(job, params, after_failure=False)
    assert planned.save_s == pytest.approx(trained / 2e9)         # two nodes write
    assert planned.load_s == pytest.approx(checkpoint_bytes(job) / 2e9)
    from nereus.sim.policies import Act
    from nereus.sim.scenarios import builtin
    from nereus.sim.simulator import Simulator, _Runner
    from nereus.sim.truth import Truth
    sc = builtin("stationary", steps=3)
    sim = Simulator(Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed), sc.lengths,
                    sc.availability, params, sc.steps)
    runner = _Runner(None, sim)  # type: ignore[arg-type]
    runner._restart(1, Act(Action.RESTART, None, after_failure=False), sc.job.pool.ids)
    assert runner._acc["restart_s"] == pytest.approx(
        restart_cost(sc.job, params, after_failure=False).seconds)


def test_a_restart_after_a_wait_is_a_replan_every_reference_resets(job, plans):
    """Resuming after an empty pool replans (it restarts on the best plan), so every drifting
    signal's reference becomes its current value -- the efficiencies too, not only the
    length -- and nothing left pending from before the stop replans again."""
    from nereus.control.monitor import Trigger
    p = plans["best16"]
    c = Controller(job, p, config=ControlConfig(warmup_steps=0), on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    assert any(k.startswith("eff.") for k in c.monitor.references)
    stale = {k: (v * 0.5 if k.startswith("eff.") else v) for k, v in c.monitor.references.items()}
    c.monitor = replace(c.monitor, references=stale)
    c.pending = (Trigger(TriggerKind.ONWARD, "response_len", False),)
    assert c.on_boundary(Telemetry(1, 2000.0, 3000, ())).action is Action.WAIT
    d = c.on_boundary(Telemetry(1, 2000.0, 3000, tuple(range(16))))
    assert d.action is Action.RESTART
    eff = c.calibrator.efficiencies()
    for k, v in c.monitor.references.items():
        if k.startswith("eff."):
            assert v == pytest.approx(eff[OpClass(k[4:])]), k
    assert c.pending == ()
    nxt = c.on_boundary(_tel(job, d.plan, 2, 2000))
    assert nxt.action is Action.KEEP and not nxt.reasons.triggers


def test_a_replan_at_a_boundary_without_times_resets_the_efficiency_references(job, plans):
    """A second decision in one step (GPUs left during it) carries no times, so it watches no
    efficiency; the replan it runs still resets their references."""
    p = plans["best16"]
    c = Controller(job, p, config=ControlConfig(warmup_steps=0),
                   transition=lambda j, s, t, e: _Sched(1.0), on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    stale = {k: (v * 0.5 if k.startswith("eff.") else v) for k, v in c.monitor.references.items()}
    c.monitor = replace(c.monitor, references=stale)
    d = c.on_boundary(Telemetry(0, 2000.0, 3000, tuple(range(15))))  # a GPU left: urgent
    assert d.reasons.urgent and d.action in (Action.MOVE, Action.RESTART)
    nxt = c.on_boundary(_tel(job, d.plan, 1, 2000, pool=tuple(range(15))))
    assert not [t for t in nxt.reasons.triggers if t.signal.startswith("eff.")]


def test_the_length_window_counts_steps_not_decisions(job, plans):
    """Memory is planned for the longest response of the last ``length_window`` steps. The
    simulator decides again within a step (a pause, GPUs lost mid-step, a crash), and each
    repeat took a place in the window: 17 boundaries of step 4 pushed step 0's 6,000 tokens
    out, and the controller planned for 3,000 with step 0 among the last 5 steps."""
    c = Controller(job, plans["best16"], config=ControlConfig(length_window=5),
                   on_log=lambda s: None)
    full = tuple(range(16))

    def at(step, longest):
        return Telemetry(step, 2000.0, longest, full)

    c.on_boundary(at(0, 6000))
    for k in range(1, 4):
        c.on_boundary(at(k, 3000))
    for _ in range(17):
        c.on_boundary(at(4, 3000))
    assert c._longest(at(4, 3000)) == 6000
    c.on_boundary(at(5, 3000))                      # steps 1-5: step 0 leaves the window
    assert c._longest(at(5, 3000)) == 3000
    # a step seen again keeps the longest of its sightings (a crash heard of a longer one)
    for longest in (3000, 5000, 3000):
        c.on_failure(at(6, longest), out_of_memory=False)
    assert c._recent_longest[6] == 5000 and len(c._recent_longest) == 5


def test_telemetry_the_cluster_cannot_hold_changes_nothing(job, plans):
    """A pool with ids outside the cluster is refused before the controller learns from it:
    its times, its longest response and its pool change are not kept."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    c.on_boundary(_tel(job, plans["best16"], 0, 2000))
    samples, window, horizons = c.calibrator.samples, dict(c._recent_longest), c.horizons
    bad = replace(_tel(job, plans["best16"], 1, 2000, longest=9000),
                  pool=tuple(range(job.cluster.num_devices + 2)))
    for call in (c.on_boundary, c.on_failure):
        with pytest.raises(InputError, match="outside the cluster"):
            call(bad)
    assert c.calibrator.samples == samples and c._recent_longest == window
    assert c.horizons == horizons and c._seen_pool == job.pool.ids and not c.stopped
    d = c.on_boundary(_tel(job, plans["best16"], 2, 2000))
    assert d.action is Action.KEEP and d.reasons.triggers == ()


def test_a_step_run_beside_a_transition_teaches_the_calibrator_nothing(job, plans):
    """Its times were measured while state moved over the same GPUs and links, and the
    controller's plan is already the transition's target: neither plan ran it alone."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    busy = replace(_tel(job, plans["best16"], 0, 2000, eff=HIDDEN), transition_running=True)
    before = c.calibrator.efficiencies()
    c.on_boundary(busy)
    assert c.calibrator.samples == 0 and c.calibrator.efficiencies() == before
    c.on_boundary(_tel(job, plans["best16"], 1, 2000, eff=HIDDEN))
    assert c.calibrator.samples > 0


def test_the_first_length_reference_is_the_length_the_first_plan_was_made_for(job, plans):
    """A first step at twice the planned mean is a drift, as a first pool without the planned
    GPUs is a pool change; it does not become the reference quietly."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    assert c.monitor.references["response_len"] == job.workload.response_len_mean
    d = c.on_boundary(_tel(job, plans["best16"], 0, 2 * job.workload.response_len_mean))
    assert [t.signal for t in d.reasons.triggers] == ["response_len"]
    assert d.reasons.triggers[0].reference == job.workload.response_len_mean


def test_h_len_counts_steps_from_the_reset_a_pool_replan_made_not_from_the_last_crossing(
        job, plans):
    """Responses cross at step 1; a pool gain replans at step 5 and resets the length's
    reference; the next crossing, 3 steps later, is 31 % beyond the reset reference. H_len is
    those 3 steps, not the 7 since the crossing before (H_x says how long after a replan the
    signal takes to cross again)."""
    p = plans["best8"]
    n8, n16 = tuple(range(8)), tuple(range(16))
    start = _at_length(job.with_pool(GpuPool(job.cluster, n8)), 1000)
    c = Controller(start, p, transition=lambda j, s, t, e: _Sched(1e9), on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 1000, pool=n8))
    d1 = c.on_boundary(_tel(job, p, 1, 1350, pool=n8))
    assert [t.signal for t in d1.reasons.triggers] == ["response_len"]
    c.on_boundary(_tel(job, p, 2, 1400, pool=n8))
    d5 = c.on_boundary(_tel(job, p, 5, 1600, pool=n16))
    assert [t.kind for t in d5.reasons.triggers] == [TriggerKind.POOL_GAIN]
    assert d5.action is Action.KEEP and c.monitor.references["response_len"] == 1600.0
    d8 = c.on_boundary(_tel(job, p, 8, 1600 * 1.31, pool=n16))
    assert [t.signal for t in d8.reasons.triggers] == ["response_len"]
    assert c.horizons.of("response_len") == 3.0
    assert d8.reasons.horizon_steps == 3.0


def test_h_len_counts_steps_from_a_deferred_replan_not_from_the_crossing_it_waited_on(
        job, plans):
    """A crossing at step 1 waits for a running transition; the replan at step 4 resets the
    reference, and the next crossing at step 6 closes an interval of 2 steps, not 5."""
    p = plans["best8"]
    n8 = tuple(range(8))
    start = _at_length(job.with_pool(GpuPool(job.cluster, n8)), 1000)
    c = Controller(start, p, transition=lambda j, s, t, e: _Sched(1e9), on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 1000, pool=n8))
    for step in (1, 2, 3):
        busy = replace(_tel(job, p, step, 1350, pool=n8), transition_running=True)
        assert "deferred" in c.on_boundary(busy).reasons.summary
    d4 = c.on_boundary(_tel(job, p, 4, 1350, pool=n8))
    assert [t.signal for t in d4.reasons.triggers] == ["response_len"]
    d6 = c.on_boundary(_tel(job, p, 6, 1350 * 1.31, pool=n8))
    assert [t.signal for t in d6.reasons.triggers] == ["response_len"]
    assert c.horizons.of("response_len") == 2.0


def test_reprice_prices_the_weight_sync_from_the_candidates_as_the_planner_does(job):
    """A synchronous sync whose generation spans more GPUs than training (the extra ones hold
    no training shard) costs what ``CostModel.weight_sync`` of the two candidates says; priced
    from the bare layouts it was the colocated price (0 s here), so the controller and the
    simulator's truth saw a cheaper step than the planner."""
    w = job.workload.with_response_len(500, 750)
    now = job.with_workload(w)
    cost = CostModel(now)
    plan = Planner(now, cost=cost).best_placed()  # packed: the sync the search prices
    train, gen = plan.stage("actor_train"), plan.stage("actor_gen")
    assert len(gen.gpus) > len(train.gpus)  # the case the candidates price
    sync = cost.weight_sync(train.candidate, gen.candidate).latency_s
    assert sync > cost.weight_sync(train.layout, gen.layout).latency_s
    again = reprice(now, cost, plan).plan
    assert again.terms["weight_sync"] == pytest.approx(sync)
    assert again.terms["weight_sync"] == pytest.approx(plan.terms["weight_sync"])
    assert again.step_latency_s == pytest.approx(plan.step_latency_s)


class _Spread:
    """A calibrator stand-in: fixed efficiencies and their relative standard errors."""

    def __init__(self, eff: Efficiencies, spread: dict[OpClass, float]):
        self.eff, self.spread = eff, spread

    def efficiencies(self) -> Efficiencies:
        return self.eff

    def relative_error(self) -> dict[OpClass, float]:
        return dict(self.spread)


def test_an_efficiency_the_measurements_do_not_pin_down_is_not_watched(job, plans):
    """δ_eff = 20 % and eff_z = 3: a class is watched while its estimate's standard error is
    at most 6.7 %; decode's (moving only together with its all-reduce latency) is not, so its
    noise never reads as drift (the stationary trace once moved on it)."""
    c = Controller(job, plans["best16"], on_log=lambda s: None)
    c.steps_seen = c.config.warmup_steps
    eff = Efficiencies({OpClass.GEMM: 0.6, OpClass.DECODE: 0.7, OpClass.LATENCY_INTRA: 0.6})
    c.calibrator = _Spread(eff, {OpClass.GEMM: 0.02, OpClass.DECODE: 0.066,
                                 OpClass.LATENCY_INTRA: 0.25})
    tel = _tel(job, plans["best16"], 0, 2000)
    sig = c._signals(tel, {"gemm": 0.5, "decode": 0.4, "latency.intra": 0.1})
    assert sig.keys() == {"response_len", "eff.gemm", "eff.decode"}
    c.calibrator = _Spread(eff, {OpClass.GEMM: 0.02, OpClass.DECODE: 0.068})
    sig = c._signals(tel, {"gemm": 0.5, "decode": 0.4, "latency.intra": 0.1})
    assert sig.keys() == {"response_len", "eff.gemm"}  # an unmeasured class is not watched


def test_efficiency_signals_arm_only_after_the_calibration_warm_up(job, plans):
    """An efficiency fitted from fewer than ``warmup_steps`` measured steps is not watched,
    however well the calibrator says it is pinned down: early fits move with every sample,
    and a drift trigger on them would replan for nothing."""
    c = Controller(job, plans["best16"], config=ControlConfig(warmup_steps=10),
                   on_log=lambda s: None)
    c.calibrator = _Spread(Efficiencies({OpClass.GEMM: 0.6}), {OpClass.GEMM: 0.01})
    tel = _tel(job, plans["best16"], 0, 2000)
    for seen in (0, 9):
        c.steps_seen = seen
        assert c._signals(tel, {"gemm": 1.0}).keys() == {"response_len"}, seen
    c.steps_seen = 10
    assert c._signals(tel, {"gemm": 1.0}) == {"response_len": 2000.0, "eff.gemm": 0.6}


def _moved_to(plan, shift):
    """``plan`` with every GPU id g moved to (g + shift) mod 16: the same plan a node over."""
    return replace(plan, stages=tuple(
        replace(s, replicas=tuple(tuple((g + shift) % 16 for g in r) for r in s.replicas))
        for s in plan.stages))


def test_the_best_target_is_placed_near_the_current_gpus_when_that_move_is_cheaper(job, plans):
    # the 8-GPU plan runs on the second node; the best 16-GPU plan, as searched, puts actor
    # training on the first. A transition that keeps actor training where it is (GPUs 8-15)
    # is feasible, any other is not: the controller must find the placement near its GPUs
    here = _moved_to(plans["best8"], 8)
    train = set(here.stage("actor_train").gpus)

    asked = []

    def transition(j, s, t, e):
        asked.append(t)
        return _Sched(0.5, feasible=set(t.stage("actor_train").gpus) <= train)

    c = Controller(job, here, transition=transition, planner=packed, on_log=lambda s: None)
    c.on_boundary(_tel(job, here, 0, 2000))
    d = c.on_boundary(_tel(job, here, 1, 2700))
    assert d.action is Action.MOVE, d.reasons.summary
    assert d.reasons.chosen.startswith("best, placed near the current GPUs (")
    assert set(d.plan.stage("actor_train").gpus) <= train
    # the planner's own placement of the same candidates was priced too, and found infeasible
    searched = [t for t in asked if not set(t.stage("actor_train").gpus) <= train]
    assert any([x.candidate for x in t.stages] == [x.candidate for x in d.plan.stages]
               for t in searched)
    assert d.reasons.verdicts[0].admitted
    assert len(d.plan.gpus()) > len(here.gpus())


def test_of_two_feasible_placements_of_the_best_target_the_cheaper_move_comes_first(job,
                                                                                   plans):
    """Every placement of S* can be reached, but keeping actor training on its GPUs (8-15)
    takes 0.5 s and any other placement 5 s: the target is the placement with the cheaper
    transition, not merely a feasible one (the as-searched placement is no slower)."""
    here = _moved_to(plans["best8"], 8)
    train = set(here.stage("actor_train").gpus)
    priced = []

    def transition(j, s, t, e):
        seconds = 0.5 if set(t.stage("actor_train").gpus) <= train else 5.0
        priced.append(seconds)
        return _Sched(seconds)

    c = Controller(job, here, transition=transition, planner=packed, on_log=lambda s: None)
    c.on_boundary(_tel(job, here, 0, 2000))
    d = c.on_boundary(_tel(job, here, 1, 2700))
    assert sorted(set(priced)) == [0.5, 5.0]  # both kinds of placement were priced
    assert d.action is Action.MOVE, d.reasons.summary
    first = d.reasons.verdicts[0]
    assert first.label.startswith("best, placed near the current GPUs (") and first.admitted
    assert first.l_tran_s == 0.5
    assert d.reasons.chosen == first.label and d.reasons.l_tran_s == 0.5
    assert set(d.plan.stage("actor_train").gpus) <= train


FAST_RESTART = RestartParams(startup_s=1.0, storage_read_bw_per_node=1e12,
                             storage_write_bw_per_node=1e12)


def test_an_urgent_move_dearer_over_the_horizon_than_a_planned_restart_restarts(job, plans):
    """A GPU loss leaves every model-stage a copy; each move is feasible but its L_tran is
    huge, so restart + H·L_step into S* beats the best move's L_tran + H·L_step; with a cheap
    L_tran the move wins the same comparison."""
    p = plans["best16"]
    gone = p.stage("actor_train").replicas[-1][-1]
    pool = tuple(g for g in range(16) if g != gone)
    rc = restart_cost(job.with_pool(GpuPool(job.cluster, pool)), FAST_RESTART,
                      after_failure=False).seconds
    decisions = {}
    for l_tran in (1e6, 1.0):
        c = Controller(job, p, config=ControlConfig(restart=FAST_RESTART),
                       transition=lambda j, s, t, e, x=l_tran: _Sched(x), on_log=lambda s: None)
        c.on_boundary(_tel(job, p, 0, 2000))
        decisions[l_tran] = c.on_boundary(_tel(job, p, 1, 2000, pool=pool))
    d = decisions[1e6]
    r = d.reasons
    assert r.urgent and r.horizon_steps == 1.0 and r.current_step_s is None
    assert d.action is Action.RESTART and r.chosen == "planned checkpoint/restart"
    assert d.restart.lost_s == 0 and d.restart.save_s > 0          # planned: saved first
    assert r.restart_s == d.restart.seconds == pytest.approx(rc)
    # a restart runs no transition: its cost is restart_s, not L_tran
    assert r.l_tran_s is None
    assert "L_tran=" not in d.log_line() and f"restart={rc:.0f} s" in d.log_line()
    assert set(d.plan.gpus()) <= set(pool)
    move = next(v for v in r.verdicts if v.admitted)
    assert move.feasible and move.l_tran_s == 1e6
    restart_total = r.restart_s + (r.target_step_s + r.target_risk_s)  # H = 1
    move_total = move.l_tran_s + move.step_s + move.risk_s
    assert restart_total < move_total
    assert f"{restart_total:.4g} s beats the best feasible move's {move_total:.4g} s" \
        in r.summary
    cheap = decisions[1.0]
    # S* or one of its placements near the surviving units (as fast, as cheap to reach here)
    assert cheap.action is Action.MOVE and cheap.reasons.chosen.startswith("best")
    assert cheap.reasons.l_tran_s == 1.0
    assert cheap.reasons.l_tran_s + cheap.reasons.target_step_s < rc + r.target_step_s


def test_a_planned_restart_that_gains_more_than_the_admitted_fallback_move_is_taken(
        job, plans):
    """S* cannot be reached by a transition; a hybrid that keeps reward_infer can (L_tran =
    10 s, admitted by Eq. 2). A fast planned restart into S* is admitted too, and its gain
    over H (ΔL·H - restart) beats the hybrid's: the restart is taken. A slower restart, still
    admitted, gains less than the hybrid: the hybrid is taken."""
    def keeps_reward(j, s, t, e):
        a, b = s.stage("reward_infer"), t.stage("reward_infer")
        return _Sched(10.0, feasible=(a.layout, a.replicas) == (b.layout, b.replicas))

    out = {}
    for startup in (1.0, 20.0):
        params = replace(FAST_RESTART, startup_s=startup)
        c = Controller(job, plans["best8"], config=ControlConfig(restart=params),
                       transition=keeps_reward, on_log=lambda s: None)
        c.on_boundary(_tel(job, plans["best8"], 0, 2000))
        out[startup] = (c.on_boundary(_tel(job, plans["best8"], 1, 2700)),
                        restart_cost(job, params, after_failure=False).seconds)
    d, rc = out[1.0]
    r = d.reasons
    h, gamma = r.horizon_steps, r.gamma
    assert not r.urgent and h == 1.0
    assert d.action is Action.RESTART and r.chosen == "planned checkpoint/restart"
    assert "no feasible transition to the best target" in r.summary
    assert d.restart.lost_s == 0 and d.restart.save_s > 0
    assert r.restart_s == d.restart.seconds == pytest.approx(rc)
    # a restart runs no transition: its cost is restart_s, not L_tran
    assert r.l_tran_s is None
    assert "L_tran=" not in d.log_line() and f"restart={rc:.0f} s" in d.log_line()
    best = r.verdicts[0]
    assert best.label == "best" and not best.feasible and r.target_step_s == best.step_s
    assert r.delta_l_s == pytest.approx(r.current_step_s - r.target_step_s)
    assert r.payback_steps == pytest.approx(r.restart_s / r.delta_l_s)
    assert r.payback_steps <= gamma * h
    move = next(v for v in r.verdicts if v.admitted)
    assert move.label == "move all but reward_infer" and move.feasible and move.l_tran_s == 10.0
    assert move.payback_steps <= gamma * h and move.delta_l_s < r.delta_l_s
    assert r.delta_l_s * h - r.restart_s > move.delta_l_s * h - move.l_tran_s
    # a slower restart still repays within γ·H, but gains less than the admitted hybrid
    d, rc = out[20.0]
    r = d.reasons
    best_delta = r.verdicts[0].delta_l_s
    assert rc / best_delta <= gamma * h
    assert d.action is Action.MOVE and r.chosen == "move all but reward_infer"
    assert r.l_tran_s == 10.0 and d.restart is None
    assert best_delta * h - rc < r.delta_l_s * h - r.l_tran_s


def test_a_planned_restart_that_fails_eq2_keeps_the_plan(job, plans):
    """No transition can run and the restart (a start-up of 10^6 s) would repay in far more
    than γ·H steps: Eq. 2 rejects it and the plan is kept."""
    slow = RestartParams(startup_s=1e6)
    c = Controller(job, plans["best8"], config=ControlConfig(restart=slow),
                   transition=lambda j, s, t, e: _Sched(0.0, feasible=False),
                   on_log=lambda s: None)
    assert c.config.restart_moves and c.config.admission
    c.on_boundary(_tel(job, plans["best8"], 0, 2000))
    d = c.on_boundary(_tel(job, plans["best8"], 1, 2700))
    r = d.reasons
    assert [t.kind for t in r.triggers] == [TriggerKind.DRIFT] and not r.urgent
    assert d.action is Action.KEEP and d.plan is plans["best8"] and c.plan is plans["best8"]
    assert d.restart is None and r.restart_s is None and r.chosen == ""
    assert r.summary.startswith("keep: best target infeasible")
    assert r.verdicts and not any(v.feasible for v in r.verdicts)
    assert r.l_tran_s is None and r.payback_steps is None
    assert r.delta_l_s == pytest.approx(r.current_step_s - r.target_step_s)
    assert r.delta_l_s > 0
    rc = restart_cost(job, slow, after_failure=False).seconds
    assert rc / r.delta_l_s > r.gamma * r.horizon_steps  # the restart Eq. 2 turned down
    assert "restart=" not in d.log_line()


def test_no_transition_is_planned_for_a_move_that_cannot_be_admitted(job, plans):
    """Under γ = 0 an opportunistic move is never admitted, and a target no faster than the
    current plan never is: the near placements of S* were still priced, up to four transition
    plans thrown away at every such boundary."""
    asked = []

    def transition(j, s, t, e):
        asked.append(t)
        return _Sched(0.5)

    here = _moved_to(plans["best8"], 8)
    c = Controller(job, here, config=ControlConfig(gamma=0.0), transition=transition,
                   planner=packed, on_log=lambda s: None)
    c.on_boundary(_tel(job, here, 0, 2000))
    d = c.on_boundary(_tel(job, here, 1, 2700))
    assert d.action is Action.KEEP and "γ = 0" in d.reasons.verdicts[0].why
    assert asked == []


def test_every_pool_change_counts_while_a_replan_waits_and_the_replan_answers_the_last(job,
                                                                                      plans):
    """GPUs 8-15 join while a transition runs (the replan waits), leave again, then join
    again. Each change is a crossing of the pool (H from intervals 4 and 3), the loss one of
    the losses alone, and the boundary after the GPUs left has nothing to answer: the gain
    that waited was listed again there (and no crossing after it counted)."""
    n8, n16 = tuple(range(8)), tuple(range(16))
    start = job.with_pool(GpuPool(job.cluster, n8))
    c = Controller(start, plans["best8"], transition=lambda j, s, t, e: _Sched(1e9),
                   on_log=lambda s: None)
    c.on_boundary(_tel(start, plans["best8"], 0, 2000, pool=n8))
    d = c.on_boundary(replace(_tel(start, plans["best8"], 5, 2000, pool=n16),
                              transition_running=True))
    assert "deferred" in d.reasons.summary
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.POOL_GAIN]
    d = c.on_boundary(replace(_tel(start, plans["best8"], 9, 2000, pool=n8),
                              transition_running=True))
    assert d.action is Action.KEEP and d.reasons.triggers == () and c.pending == ()
    d = c.on_boundary(_tel(start, plans["best8"], 12, 2000, pool=n16))
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.POOL_GAIN]
    assert c.horizons.of("pool") == pytest.approx(0.5 * 4 + 0.5 * 3)
    assert d.reasons.horizon_steps == pytest.approx(3.5)
    assert c.horizons.last_crossing["pool_loss"] == 9


def test_a_kept_decision_reports_the_target_its_verdict_weighed(job, plans):
    """S* is weighed as the search placed it and placed near the current GPUs (cheaper to
    reach, and as fast or faster); when Eq. 2 rejects them all, the decision's target latency
    and ΔL are those of the verdict it reports first (once the target latency was the
    search's placement while ΔL was a near one's)."""
    def moved(plan, shift):
        return replace(plan, stages=tuple(replace(s, replicas=tuple(
            tuple((g + shift) % 16 for g in r) for r in s.replicas)) for s in plan.stages))

    def l_tran(job, cur, tgt, eff):  # a long move, longer the more stages change GPUs
        return _Sched(1e8 * (1 + sum(sp.replicas != cur.stage(sp.stage).replicas
                                     for sp in tgt.stages)))

    here = moved(plans["best8"], 4)
    c = Controller(job, here, transition=l_tran, planner=lambda j, cost, spread=False:
                   packed(j, cost, spread), on_log=lambda s: None)
    c.on_boundary(_tel(job, here, 0, 2000))
    d = c.on_boundary(_tel(job, here, 1, 2700))
    r = d.reasons
    assert d.action is Action.KEEP
    assert any("near the current GPUs" in v.label for v in r.verdicts)
    assert r.verdicts[0].step_s == min(v.step_s for v in r.verdicts)
    assert r.target_step_s == r.verdicts[0].step_s
    assert r.current_step_s - r.target_step_s == pytest.approx(r.delta_l_s, rel=1e-12)


def test_op_class_times_alone_teach_the_calibrator(job, plans):
    """A framework that times op classes but reports no stage wall times: the calibrator
    learned nothing from it."""
    p = plans["best16"]
    w = job.workload.with_response_len(2000, 3000)
    cost = CostModel(job.with_workload(w), Efficiencies({OpClass.GEMM: 0.5}))
    ops = {}
    for sp in reprice(job.with_workload(w), cost, p).plan.stages:
        est = cost.estimate(sp.stage, sp.candidate)
        timed: dict[str, float] = {}
        for op in est.ops:  # a block's timers file its work, not the pipeline's idle slots
            if op.term != BUBBLE and op.ideal_s > 0:
                timed[op.cls.value] = timed.get(op.cls.value, 0.0) + op.ideal_s / cost.eff[op.cls]
        ops[sp.stage] = timed
    c = Controller(job, p, on_log=lambda s: None)
    for k in range(5):
        c.on_boundary(Telemetry(k, 2000.0, 3000, job.pool.ids, op_time_s=ops))
    assert c.steps_seen == 5 and c.calibrator.samples > 0
    assert c.calibrator.efficiencies()[OpClass.GEMM] == pytest.approx(0.5, rel=1e-3)


def test_an_onward_replan_waits_through_pool_changes_while_a_transition_runs(job, plans):
    """After an urgent move short of S*, the onward replan waits for the running transition;
    GPUs joining and leaving meanwhile replaced it with a pool trigger that then vanished, so
    S* was never priced again."""
    from nereus.control.monitor import Trigger

    n8, n16 = tuple(range(8)), tuple(range(16))
    start = job.with_pool(GpuPool(job.cluster, n8))
    c = Controller(start, plans["best8"], transition=lambda j, s, t, e: _Sched(1.0),
                   on_log=lambda s: None)
    c.on_boundary(_tel(start, plans["best8"], 0, 2000, pool=n8))
    c.pending = (Trigger(TriggerKind.ONWARD, "pool", False, detail="after the urgent move"),)
    for step, pool in ((1, n8), (2, n16), (3, n8)):
        d = c.on_boundary(replace(_tel(start, plans["best8"], step, 2000, pool=pool),
                                  transition_running=True))
        assert "deferred" in d.reasons.summary
        assert TriggerKind.ONWARD in [t.kind for t in c.pending]
    d = c.on_boundary(_tel(start, plans["best8"], 4, 2000, pool=n8))
    assert [t.kind for t in d.reasons.triggers] == [TriggerKind.ONWARD]
    assert [v.label for v in d.reasons.verdicts] == ["best"]  # S* priced again
    assert c.pending == ()


def test_an_out_of_memory_failure_restarts_onto_a_plan_for_the_crashed_length(job, plans):
    """The failure's telemetry is the step that crashed: its longest response enters the
    window memory is planned for, so the restart's plan holds it (it used to be the step
    before, and the restart crashed again on the same step)."""
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    at = job.with_workload(job.workload.with_response_len(2000, 16000))
    assert not reprice(at, c._cost(at), p).fits               # the plan that ran cannot hold it
    d = c.on_failure(Telemetry(1, 2000.0, 16000, job.pool.ids), out_of_memory=True)
    assert d.action is Action.RESTART and d.restart is not None and d.restart.lost_s > 0
    assert reprice(at, c._cost(at), d.plan).fits


def test_a_replan_after_short_steps_still_plans_memory_for_the_crash_in_the_window(job, plans):
    """The crashed step's 16,000 tokens stay in the 20-step window that memory is planned
    for: short steps after it (3,000 tokens) and a length drift at step 5 keep the restart's
    plan, which holds 16,000; planning for the last step's longest alone moved to a faster
    plan that does not hold it (the crash would come back)."""
    p = plans["best16"]
    c = Controller(job, p, transition=lambda j, s, t, e: _Sched(0.0), on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    at = job.with_workload(job.workload.with_response_len(2000, 16000))
    d = c.on_failure(Telemetry(1, 2000.0, 16000, job.pool.ids), out_of_memory=True)
    assert d.action is Action.RESTART and reprice(at, c._cost(at), c.plan).fits
    for step in range(2, 5):
        d = c.on_boundary(_tel(job, c.plan, step, 2000, longest=3000))
        assert d.action is Action.KEEP and not d.reasons.triggers
    d = c.on_boundary(_tel(job, c.plan, 5, 2700, longest=3000))
    assert [t.signal for t in d.reasons.triggers] == ["response_len"]
    assert d.action is Action.KEEP, d.log_line()
    assert reprice(at, c._cost(at), c.plan).fits


def test_an_out_of_memory_failure_the_estimate_missed_raises_the_memory_scale(job, plans):
    """A crash at a length the plan was estimated to hold: the stages that may have run out
    (no measured peak, every stage before them measured) needed at least the whole device, so
    the calibrator's memory scale grows. With no peak at all that is generation, the step's
    first stage: inference and training never ran, and learn nothing (they used to be
    learned to need the whole device too)."""
    from nereus.spec.workflow import StageKind
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    before = c.calibrator.memory_scale()
    counted = c.calibrator.memory_samples()
    logs: list[str] = []
    c.on_log = logs.append
    c.on_failure(Telemetry(1, 2000.0, 3000, job.pool.ids), out_of_memory=True)
    after = c.calibrator.memory_scale()
    assert after[StageKind.GENERATE] > before.get(StageKind.GENERATE, 1.0)
    grown = {k: n - counted.get(k, 0) for k, n in c.calibrator.memory_samples().items()}
    assert {k: n for k, n in grown.items() if n} == {StageKind.GENERATE: 1}
    assert "restarting after out of memory at step 1 (longest response 3000 tokens)" \
        in logs[-1]


def test_an_out_of_memory_failure_learns_one_sample_per_kind_of_the_stages_that_ran(job,
                                                                                  plans):
    """Generation measured its peak; the three inference stages run side by side (no shared
    GPU set) and measured none: one of them ran out. One sample for inference, from its
    fullest stage, not three (the fullest needs the least scaling), and none for training,
    which never ran."""
    from nereus.spec.workflow import StageKind
    p = replace(plans["best16"], groups=())
    c = Controller(job, p, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    counted = c.calibrator.memory_samples()
    gen = _tel(job, p, 1, 2000, longest=3000).peak_mem_bytes["actor_gen"]
    c.on_failure(Telemetry(1, 2000.0, 3000, job.pool.ids, {}, {"actor_gen": gen}),
                 out_of_memory=True)
    grown = {k: n - counted.get(k, 0) for k, n in c.calibrator.memory_samples().items()}
    assert grown.get(StageKind.FORWARD) == 1
    assert grown.get(StageKind.TRAIN, 0) == 0
    assert grown.get(StageKind.GENERATE, 0) <= 1    # its measured peak, learned as any is


@pytest.mark.parametrize("measured,suspects", [
    ((), {"actor_gen"}),
    (("actor_gen",), {"reference_infer"}),       # the inference stages share one GPU set
    (("actor_gen", "reference_infer", "reward_infer"), {"critic_infer"}),
    (("actor_gen", "reference_infer", "reward_infer", "critic_infer"), {"actor_train"}),
    (("actor_gen", "reference_infer", "reward_infer", "critic_infer", "actor_train"),
     {"critic_train"}),
])
def test_only_a_stage_whose_earlier_stages_measured_a_peak_may_have_run_out(plans, measured,
                                                                            suspects):
    """The step runs generation, then inference (three stages on one GPU set, one after
    another), then training (two on one set): a stage after one with no peak never ran."""
    from nereus.control.controller import _may_have_run_out
    from nereus.spec.workflow import ppo
    p = replace(plans["best16"], groups=(("reference_infer", "reward_infer", "critic_infer"),
                                         ("actor_train", "critic_train")))
    assert _may_have_run_out(ppo(), p, dict.fromkeys(measured, 1)) == suspects


def _split_plan(reference_gpus=range(8), gen_gpus=range(8, 16)):
    """The default job on 16 GPUs with actor_gen alone on node 1 (GPUs 8-15, or where asked);
    every other model-stage on node 0 (reference_infer where asked)."""
    from nereus.control.targets import price
    from nereus.plan.evaluate import StageLayoutSpec as S
    from nereus.sim.scenarios import default_job
    job = default_job()

    def reps(ids, n):
        ids = list(ids)
        return tuple(tuple(ids[i:i + n]) for i in range(0, len(ids), n))

    ref = list(reference_gpus)
    specs = {"actor_gen": S(4, 1, 2, reps(gen_gpus, 4)),
             "reference_infer": S(1, 2, len(ref) // 2, reps(ref, 2)),
             "reward_infer": S(1, 8, 1, reps(range(8), 8)),
             "critic_infer": S(1, 8, 1, reps(range(8), 8)),
             "actor_train": S(2, 2, 1, reps(range(4), 4)),
             "critic_train": S(1, 4, 1, reps(range(4, 8), 4))}
    priced = price(job, CostModel(job), specs)
    assert priced.plan is not None
    return job, priced.plan


def test_losing_every_generation_replica_rebuilds_it_from_training():
    """A generation EMU holds a copy of the actor's θ, which actor_train still holds (newer
    than any checkpoint's): losing every actor_gen replica is a move whose L_tran adds the
    rebuild through storage (actor_train's replica writes θ and ω, generation reads θ: the
    runtime's ``recover``), not a restart."""
    from nereus.control.restart import RestartParams
    from nereus.control.targets import rebuild_s, survive
    job, p = _split_plan()
    node0 = tuple(range(8))
    survivors, lost, rebuilt = survive(p, node0, job.workflow)
    assert survivors is not None and lost == () and rebuilt == ("actor_gen",)
    params = RestartParams()
    n = job.model.param_count(job.workflow.model("actor").head)
    w = job.workload
    nodes = len({job.cluster.node_of(g) for g in p.stage("actor_train").replicas[0]})
    reads = len(p.stage("actor_gen").replicas)  # every replica reads θ
    want = (n * (w.param_bytes + w.optimizer_state_bytes_per_param())
            / (params.storage_write_bw_per_node * nodes)
            + reads * n * w.param_bytes / (params.storage_read_bw_per_node * 1))  # one node
    assert rebuild_s(job, p, ("actor_gen",), params) == pytest.approx(want)
    c = Controller(job, p, on_log=lambda s: None)
    d = c.on_boundary(Telemetry(0, 500.0, 750, node0))
    assert d.action is Action.MOVE, d.log_line()
    assert d.schedule is not None and "make actor_gen again through storage" in d.schedule.reason


def test_frozen_weights_are_read_again_and_trained_state_is_a_last_copy():
    """Frozen weights (reference) come back from storage, priced at the read bandwidth of the
    stage's nodes, in a move; losing the only actor_train replica loses θ and ω: a restart."""
    from nereus.control.restart import GB, RestartParams
    from nereus.control.targets import fill, rebuild_s, survive
    job, p = _split_plan(reference_gpus=range(8, 16), gen_gpus=range(8))
    node0 = tuple(range(8))
    survivors, lost, rebuilt = survive(p, node0, job.workflow)
    assert lost == () and rebuilt == ("reference_infer",)
    assert {sp.stage for sp in fill(survivors, p).stages} == {sp.stage for sp in p.stages}
    ref_bytes = job.model.param_count(job.workflow.model("reference").head) \
        * job.workload.param_bytes
    assert rebuild_s(job, p, ("reference_infer",), RestartParams(storage_read_bw_per_node=2 * GB)
                     ) == pytest.approx(len(p.stage("reference_infer").replicas) * ref_bytes
                                        / (2 * GB))  # each replica reads θ; one node
    c = Controller(job, p, on_log=lambda s: None)
    d = c.on_boundary(Telemetry(0, 500.0, 750, node0))
    assert d.action is Action.MOVE, d.log_line()
    assert d.schedule is not None and d.schedule.feasible
    assert "make reference_infer again through storage" in d.schedule.reason
    assert d.reasons.l_tran_s == d.schedule.estimated_s and d.reasons.l_tran_s > 0
    # and the node-loss risk the controller prices agrees: node 1 takes no last copy
    from nereus.plan.exposure import exposed_by_node
    assert exposed_by_node(p, job.cluster)[1] == ("reference_infer",)
    assert exposed_by_node(p, job.cluster, job.workflow)[1] == ()
    gone = set(p.stage("actor_train").gpus)
    survivors, lost, _ = survive(p, [g for g in range(16) if g not in gone], job.workflow)
    assert survivors is None and "actor_train" in lost
    c = Controller(job, p, on_log=lambda s: None)
    d = c.on_boundary(Telemetry(0, 500.0, 750, tuple(g for g in range(16) if g not in gone)))
    assert d.action is Action.RESTART and d.restart.lost_s > 0


def test_a_boundary_after_the_pool_emptied_learns_nothing_and_restarts():
    """Telemetry with measured times after an empty pool: the controller holds no running
    plan (its pool is empty), so it learns nothing instead of building a job on no GPUs
    (``InputError: gpus: the GPU pool is empty``)."""
    from nereus.sim.scenarios import default_job
    job = default_job()
    c = Controller(job, on_log=lambda s: None)
    full = tuple(range(16))
    lat = {sp.stage: 5.0 for sp in c.plan.stages}
    c.on_boundary(Telemetry(0, 500, 750, full, latency_s=lat))
    assert c.on_boundary(Telemetry(1, 500, 750, (), latency_s=lat)).action is Action.WAIT
    samples = c.calibrator.samples
    d = c.on_boundary(Telemetry(2, 500, 750, full, latency_s=lat))
    assert d.action is Action.RESTART and c.calibrator.samples == samples


@pytest.mark.parametrize("field, value, says", [
    ("length_margin", math.nan, "must be a finite number"),
    ("length_margin", math.inf, "must be a finite number"),
    ("gamma", math.nan, "must be a finite number"),
    ("horizon_alpha", math.inf, "must be a finite number"),
    ("warmup_steps", math.nan, "must be an integer >= 0"),
    ("warmup_steps", 2.0, "must be an integer >= 0"),
    ("max_tries", 2.5, "must be an integer >= 1"),
    ("length_window", True, "must be an integer >= 1"),
])
def test_control_config_refuses_non_finite_and_non_integer_values(field, value, says):
    from nereus.errors import InputError
    with pytest.raises(InputError, match=f"^control.{field}: {says}"):
        ControlConfig(**{field: value})


@pytest.mark.parametrize("field, value, says", [
    ("startup_s", math.inf, "must be a finite number"),
    ("startup_s", -1.0, "must be >= 0"),
    ("storage_read_bw_per_node", math.inf, "must be a finite number"),
    ("storage_write_bw_per_node", 0.0, "must be > 0"),
    ("checkpoint_interval_steps", 2.5, "must be an integer >= 1"),
])
def test_restart_params_refuse_non_finite_values_and_say_the_right_bound(field, value, says):
    from nereus.errors import InputError
    with pytest.raises(InputError, match=f"^restart.{field}: {says}"):
        RestartParams(**{field: value})
    assert RestartParams(startup_s=0.0).startup_s == 0.0


def _state(c):
    """What a boundary may change: what the controller learned and counted."""
    return (c.calibrator.samples, c.calibrator.efficiencies(), c.calibrator.memory_scale(),
            dict(c._recent_longest), c.horizons, c.monitor, c._seen_pool, c.pool, c.pending,
            c.steps_seen, c.stopped, c.plan)


def test_a_longest_response_past_what_can_be_planned_is_refused_and_changes_nothing(job, plans):
    """A rejected boundary leaves the calibrator, the length window and H_pool as they were:
    the refusal names the telemetry's field and the longest it may be (the prompt plus it
    within the model's context window), and the next valid step is decided as if the bad one
    never came."""
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000))
    before = _state(c)
    bad = replace(_tel(job, p, 1, 2000, pool=range(8)), response_len_max=20_000_000)
    for call in (c.on_boundary, c.on_failure):
        with pytest.raises(InputError) as e:
            call(bad)
        assert e.value.field == "telemetry.response_len_max"
        assert "20000000" in e.value.problem and "context window of 131,072" in e.value.problem
        assert e.value.allowed == "a longest response up to 130,560 tokens"
        assert _state(c) == before
    d = c.on_boundary(_tel(job, p, 2, 2000))
    assert d.action is Action.KEEP and d.reasons.triggers == ()


def test_without_a_context_window_the_bound_is_the_margin_on_the_workloads_bound(job, plans):
    from nereus.spec.workload import MAX_TOKENS
    free = replace(job, model=replace(job.model, max_position_embeddings=None))
    c = Controller(free, plans["best16"], on_log=lambda s: None)
    most = math.floor(MAX_TOKENS / 1.05)
    assert math.ceil(most * 1.05) <= MAX_TOKENS < math.ceil((most + 1) * 1.05)
    with pytest.raises(InputError) as e:
        c.on_boundary(Telemetry(0, 2000.0, most + 1, job.pool.ids))
    assert e.value.field == "telemetry.response_len_max"
    assert e.value.allowed == f"a longest response up to {most:,} tokens"
    assert "5% margin" in e.value.problem


def test_a_boundary_that_fails_after_learning_keeps_nothing_it_learned(job, plans):
    """State is committed only when the boundary returns a decision: a replan that raises
    (here the planner) leaves the calibrator, the window and the pool counters as they were."""
    p = plans["best16"]
    calls = []

    def planner(j, cost, spread=False):
        calls.append(j)
        raise RuntimeError("planner down")

    c = Controller(job, p, planner=planner, on_log=lambda s: None)
    c.on_boundary(_tel(job, p, 0, 2000, eff=HIDDEN))
    before = _state(c)
    with pytest.raises(RuntimeError):
        c.on_boundary(_tel(job, p, 1, 2000, pool=range(8), longest=5000, eff=HIDDEN))
    assert calls and _state(c) == before


@pytest.mark.parametrize("field, value", [
    ("latency_s", {"actor_trian": 3.0, "critic_tran": 5.0}),
    ("peak_mem_bytes", {"actor_gen": 10, "actr_gen": 10}),
    ("op_time_s", {"critic_tran": {"gemm": 1.0}}),
])
def test_telemetry_for_a_stage_the_workflow_does_not_have_is_refused(job, plans, field, value):
    """A misspelt model-stage would be dropped without a word (the calibrator learning
    nothing): it is refused, naming the field and the workflow's model-stages."""
    p = plans["best16"]
    c = Controller(job, p, on_log=lambda s: None)
    before = _state(c)
    bad = replace(Telemetry(0, 2000.0, 3000, job.pool.ids), **{field: value})
    stage = next(s for s in value if s not in {sp.stage for sp in p.stages})
    for call in (c.on_boundary, c.on_failure):
        with pytest.raises(InputError) as e:
            call(bad)
        assert e.value.field == f"telemetry.{field}.{stage}"
        assert "actor_train" in str(e.value) and "critic_train" in str(e.value)
        assert _state(c) == before
    d = c.on_boundary(_tel(job, p, 0, 2000))
    assert d.action is Action.KEEP and c.calibrator.samples > 0


def test_a_deferred_memory_trigger_speaks_of_the_current_longest_response(job, plans):
    """A plan known to fail from a shorter response still fails at a longer one; the trigger
    listed then gives the peak predicted at the longer one, as a controller that saw only
    the longer one predicts it."""
    p = plans["best16"]

    def seen(steps):
        c = Controller(job, p, on_log=lambda s: None)
        c.on_boundary(_tel(job, p, 0, 2000))
        for k, longest in steps:
            d = c.on_boundary(replace(_tel(job, p, k, 2000, longest=longest),
                                      transition_running=True))
        return next(t for t in d.reasons.triggers if t.kind is TriggerKind.MEMORY)

    later = seen([(1, 20000), (2, 40000)])
    alone = seen([(2, 40000)])
    assert later == alone and later.describe() == alone.describe()
    assert later.value != seen([(1, 20000)]).value


def test_telemetry_for_the_reward_model_of_a_job_scored_by_a_rule_says_why_it_is_refused():
    """With a rule reward there is no reward_infer: times reported for it (a framework that
    still names the stage) are refused with the reason, not only as an unknown name."""
    job = parse_job({"model": "llama-3.1-8b", "gpus": 16, "reward": "rule"})
    c = Controller(job, best_plan(job), on_log=lambda s: None)
    with pytest.raises(InputError) as e:
        c.on_boundary(Telemetry(0, 2000.0, 3000, job.pool.ids, {"reward_infer": 2.0}))
    assert e.value.field == "telemetry.latency_s.reward_infer"
    assert e.value.problem == ("unknown model-stage 'reward_infer' for ppo: a rule scores the "
                               "responses here, with no reward model")
