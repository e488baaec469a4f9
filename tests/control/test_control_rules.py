"""Triggers, reference resets, horizons and the admission rule, on hand-made values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.control.admission import Option, payback_steps, profitable, select
from nereus.control.horizon import Horizons
from nereus.control.monitor import Monitor, TriggerKind, memory_trigger, pool_triggers
from nereus.control.telemetry import Telemetry
from nereus.errors import InputError
from nereus.plan.types import Plan


# ---------------------------------------------------------------- triggers
def test_drift_triggers_only_beyond_delta_and_first_value_sets_reference():
    m = Monitor({"response_len": 0.30})
    m, t = m.check({"response_len": 1000.0})
    assert t == [] and m.references["response_len"] == 1000.0
    m, t = m.check({"response_len": 1300.0})          # exactly 30 %: not beyond δ
    assert t == []
    m, t = m.check({"response_len": 1301.0})
    assert [x.kind for x in t] == [TriggerKind.DRIFT]
    assert t[0].reference == 1000.0 and t[0].value == 1301.0 and t[0].threshold == 0.30
    m, t = m.check({"response_len": 699.0})            # falls count too
    assert len(t) == 1


def test_reference_reset_stops_a_persistent_deviation_from_retriggering():
    m = Monitor({"response_len": 0.30}, {"response_len": 1000.0})
    m, t = m.check({"response_len": 1400.0})
    assert t
    m = m.reset({"response_len": 1400.0})              # a replan happened (admitted or not)
    for v in (1400.0, 1500.0, 1800.0):
        m, t = m.check({"response_len": v})
        assert t == []
    m, t = m.check({"response_len": 1821.0})           # growth crosses again from the new ref
    assert t


def test_wildcard_delta_and_signals_without_delta_are_ignored():
    m = Monitor({"eff.*": 0.2})
    m, _ = m.check({"eff.gemm": 0.5, "other": 1.0})
    assert "other" not in m.references
    _, t = m.check({"eff.gemm": 0.39, "other": 100.0})
    assert [x.signal for x in t] == ["eff.gemm"]


def test_pool_loss_is_urgent_only_when_the_plan_used_a_lost_gpu():
    used = range(8)
    t = pool_triggers(range(16), range(12), used)
    assert [(x.kind, x.urgent) for x in t] == [(TriggerKind.POOL_LOSS, False)]
    t = pool_triggers(range(16), [i for i in range(16) if i != 3], used)
    assert t[0].urgent and "3" in t[0].detail
    t = pool_triggers(range(8), range(16), used)
    assert [(x.kind, x.urgent) for x in t] == [(TriggerKind.POOL_GAIN, False)]
    assert pool_triggers(range(16), range(16), used) == []


def test_pool_trigger_names_lost_gpus_as_runs_not_a_first_to_last_span():
    # regression: {0,1,2,11..15} read "lost GPUs 0..15 (8)", naming GPUs 3-10 still in the pool
    t = pool_triggers(range(16), range(3, 11), range(16))
    assert t[0].detail == "lost GPUs 0-2,11-15 (8), the plan used all of them"
    t = pool_triggers(range(16), [i for i in range(16) if i not in (0, 15)], [4])
    assert t[0].detail == "lost GPUs 0,15 (2), none used by the plan"
    t = pool_triggers(range(8), [*range(8), 9, 12, 13], [])
    assert t[0].detail == "gained GPUs 9,12-13 (3)"


def test_memory_trigger_names_the_worst_stage():
    assert memory_trigger({"a": 10, "b": 20}, 20) is None
    t = memory_trigger({"a": 30, "b": 25}, 20)
    assert t is not None and t.urgent and t.detail.startswith("a ")


# ---------------------------------------------------------------- horizons
def test_horizon_is_one_until_an_interval_is_seen_then_an_ema_of_intervals():
    h = Horizons(alpha=0.5)
    assert h.of("x") == 1.0
    h = h.crossed("x", 10)
    assert h.of("x") == 1.0                      # one crossing: no interval yet
    h = h.crossed("x", 30)
    assert h.of("x") == 20.0
    h = h.crossed("x", 40)
    assert h.of("x") == pytest.approx(0.5 * 10 + 0.5 * 20)
    h = h.crossed("y", 5).crossed("y", 7)
    assert h.smallest(["x", "y"]) == 2.0
    assert h.smallest([]) == 1.0
    with pytest.raises(InputError):
        Horizons(alpha=0.0)


def test_a_lopsided_alpha_weights_the_newest_interval_by_alpha():
    """alpha = 0.25: the newest interval weighs a quarter, the running average three quarters
    (swapped weights give 0.75 x 10 + 0.25 x 20 = 12.5)."""
    h = Horizons(alpha=0.25).crossed("x", 0).crossed("x", 20)
    assert h.of("x") == 20.0                     # the first interval is taken as it is
    h = h.crossed("x", 30)                       # interval 10
    assert h.of("x") == pytest.approx(0.25 * 10 + 0.75 * 20)
    assert h.of("x") == pytest.approx(17.5)
    h = h.crossed("x", 70)                       # interval 40
    assert h.of("x") == pytest.approx(0.25 * 40 + 0.75 * 17.5)
    assert h.of("x") == pytest.approx(23.125)


@given(st.lists(st.integers(1, 50), min_size=2, max_size=12), st.floats(0.05, 1.0))
def test_horizon_stays_within_the_intervals_seen(gaps, alpha):
    h, step = Horizons(alpha=alpha), 0
    h = h.crossed("x", step)
    for g in gaps:
        step += g
        h = h.crossed("x", step)
    assert min(gaps) - 1e-9 <= h.of("x") <= max(gaps) + 1e-9


def test_an_interval_starts_at_the_last_reset_of_the_reference_after_a_crossing():
    """A crossing is measured from the reference, and a replan started by another signal
    resets it: the steps before that reset are no part of the next interval."""
    h = Horizons(alpha=0.5).reset(["x"], 4)       # no crossing yet: nothing starts
    h = h.crossed("x", 10)
    assert h.of("x") == 1.0
    h = h.reset(["x"], 25).crossed("x", 30)      # crossed at 10, reset at 25, crossed at 30
    assert h.of("x") == 5.0
    h = h.reset(["y"], 35).crossed("x", 40)      # another signal's reset leaves x alone
    assert h.of("x") == pytest.approx(0.5 * 10 + 0.5 * 5)
    h = h.reset(["x"], 40).crossed("x", 52)      # a reset at the crossing itself changes nothing
    assert h.of("x") == pytest.approx(0.5 * 12 + 0.5 * 7.5)


# ---------------------------------------------------------------- admission
def test_payback_inequality_at_its_boundary():
    # L_tran / ΔL <= γ H: 10 / 2 = 5 = 0.5 * 10
    assert payback_steps(10.0, 2.0) == 5.0
    assert profitable(10.0, 2.0, 0.5, 10.0)
    assert not profitable(10.0 + 1e-9, 2.0, 0.5, 10.0)
    assert not profitable(1.0, 0.0, 0.5, 10.0)
    assert payback_steps(1.0, 0.0) == math.inf
    assert not profitable(0.0, 5.0, 0.0, 100.0)          # γ = 0: nothing opportunistic
    # decided on the payback a decision reports: 0.5·49·ΔL / ΔL rounds above 24.5 here
    delta = 6.771716913101244
    l_tran = 0.5 * 49 * delta
    assert payback_steps(l_tran, delta) > 0.5 * 49
    assert not profitable(l_tran, delta, 0.5, 49.0)


class _Sched:
    def __init__(self, seconds, feasible=True, reason=""):
        self.estimated_s = seconds if feasible else math.inf
        self.feasible = feasible
        self.reason = reason


def _opts(*steps):
    return [Option(f"o{i}", Plan(()), s) for i, s in enumerate(steps)]


def _schedules(table):
    calls = []

    def f(opt):
        calls.append(opt.label)
        return table[opt.label]
    return f, calls


def test_best_target_admitted_when_it_repays_within_gamma_h():
    f, _ = _schedules({"o0": _Sched(10.0)})
    idx, _, v = select(_opts(8.0), 10.0, urgent=False, gamma=0.5, horizon_steps=10.0,
                       schedule_of=f)
    assert idx == 0 and v[0].admitted and v[0].payback_steps == 5.0
    assert v[0].delta_l_s == 2.0 and v[0].l_tran_s == 10.0


def test_rejected_target_falls_back_to_a_slower_cheaper_one_before_keeping():
    f, calls = _schedules({"o0": _Sched(100.0), "o1": _Sched(150.0), "o2": _Sched(2.0),
                           "o3": _Sched(1.0)})
    # S* saves 2 s/step for 100 s; o1 is slower and dearer; o2 saves 1 s/step for 2 s; o3 is
    # not faster than the current plan
    idx, _, v = select(_opts(8.0, 8.5, 9.0, 10.0), 10.0, urgent=False, gamma=0.5,
                       horizon_steps=10.0, schedule_of=f)
    assert idx == 2
    assert [x.label for x in v] == ["o0", "o1", "o2"]
    assert not v[0].admitted and "rejected" in v[0].why
    assert not v[1].admitted and "not cheaper" in v[1].why
    assert v[2].admitted
    assert "o3" not in calls


def test_a_fallback_whose_transition_costs_as_much_as_s_stars_is_not_cheaper():
    """Fallbacks are tried for a cheaper transition; one that costs exactly S*'s L_tran is
    not one, even where its own payback would pass: S* saves 2 s/step for 100 s (payback
    50 > γ·H = 40); o1, priced a little faster than S*, saves 3 s/step for the same 100 s
    (payback 33) and is refused as no cheaper; o2 costs a hair less and is weighed."""
    f, calls = _schedules({"o0": _Sched(100.0), "o1": _Sched(100.0), "o2": _Sched(99.99)})
    idx, _, v = select(_opts(8.0, 7.0, 9.5), 10.0, urgent=False, gamma=0.5,
                       horizon_steps=80.0, schedule_of=f)
    assert idx is None and calls == ["o0", "o1", "o2"]
    assert [x.label for x in v] == ["o0", "o1", "o2"]
    assert "rejected: payback 50" in v[0].why
    assert not v[1].admitted and "not cheaper" in v[1].why and v[1].payback_steps is None
    assert "rejected: payback" in v[2].why and v[2].payback_steps == pytest.approx(199.98)


def test_nothing_admitted_keeps_the_plan_and_gamma_zero_prices_nothing():
    f, calls = _schedules({"o0": _Sched(100.0)})
    idx, sched, v = select(_opts(8.0), 10.0, urgent=False, gamma=0.5, horizon_steps=1.0,
                           schedule_of=f)
    assert idx is None and sched is None and not v[0].admitted
    f, calls = _schedules({"o0": _Sched(0.0)})
    idx, _, v = select(_opts(1.0), 10.0, urgent=False, gamma=0.0, horizon_steps=1e9,
                       schedule_of=f)
    assert idx is None and calls == [] and "γ = 0" in v[0].why


def test_infeasible_best_target_lets_any_feasible_fallback_through():
    f, _ = _schedules({"o0": _Sched(0, False, "GPU 3 lacks 2 GiB"), "o1": _Sched(50.0)})
    idx, _, v = select(_opts(8.0, 9.0), 10.0, urgent=False, gamma=0.5, horizon_steps=200.0,
                       schedule_of=f)
    assert idx == 1 and "infeasible: GPU 3" in v[0].why


def test_without_profitability_any_faster_feasible_move_is_taken():
    f, _ = _schedules({"o0": _Sched(1e6)})
    idx, _, v = select(_opts(9.999), 10.0, urgent=False, gamma=0.5, horizon_steps=1.0,
                       schedule_of=f, profitability=False)
    assert idx == 0 and v[0].admitted


def test_urgent_path_waives_payback_and_minimizes_time_over_the_horizon():
    f, _ = _schedules({"o0": _Sched(0, False), "o1": _Sched(300.0), "o2": _Sched(0.0)})
    # horizon 10: o1 costs 300 + 10*20 = 500, o2 costs 0 + 10*40 = 400
    idx, _, v = select(_opts(15.0, 20.0, 40.0), None, urgent=True, gamma=0.0,
                       horizon_steps=10.0, schedule_of=f)
    assert idx == 2 and [x.admitted for x in v] == [False, False, True]
    # a long horizon favours the faster plan despite its transition
    f, _ = _schedules({"o0": _Sched(0, False), "o1": _Sched(300.0), "o2": _Sched(0.0)})
    idx, _, _ = select(_opts(15.0, 20.0, 40.0), None, urgent=True, gamma=0.0,
                       horizon_steps=100.0, schedule_of=f)
    assert idx == 1
    f, _ = _schedules({"o0": _Sched(0, False)})
    idx, _, v = select(_opts(15.0), None, urgent=True, gamma=0.5, horizon_steps=1.0,
                       schedule_of=f)
    assert idx is None and not v[0].feasible


def test_the_urgent_path_returns_the_option_it_scheduled_when_labels_repeat():
    """Two placements of one target may share a label; the urgent path returned the first
    option with the admitted verdict's label, so the controller adopted one plan and ran the
    schedule of another."""
    opts = [Option("near", Plan(()), 15.0), Option("near", Plan(()), 15.0)]
    scheds = {id(opts[0]): _Sched(50.0), id(opts[1]): _Sched(5.0)}
    idx, sched, v = select(opts, None, urgent=True, gamma=0.5, horizon_steps=1.0,
                           schedule_of=lambda o: scheds[id(o)])
    assert idx == 1 and sched is scheds[id(opts[1])]
    assert [x.admitted for x in v] == [False, True]



def test_the_urgent_verdict_names_every_term_of_the_sum_it_prints():
    """The admitted urgent verdict said ``L_tran + H·L_step = X`` while X also summed the
    node-loss risk per step: 3 + 10 x 20 = 203, not the 253 printed. The formula names the
    risk, and its number is the sum of the terms it names."""
    import re

    opts = [Option("o0", Plan(()), 20.0, risk_s=5.0)]
    f, _ = _schedules({"o0": _Sched(3.0)})
    idx, _, v = select(opts, None, urgent=True, gamma=0.5, horizon_steps=10.0, schedule_of=f)
    assert idx == 0 and v[0].admitted
    m = re.search(r"L_tran \+ H·\(L_step \+ risk\) = ([0-9.e+]+) s", v[0].why)
    assert m is not None, v[0].why
    assert float(m.group(1)) == pytest.approx(v[0].l_tran_s + 10.0 * (v[0].step_s + v[0].risk_s))
    assert float(m.group(1)) == pytest.approx(3.0 + 10.0 * (20.0 + 5.0))


def test_the_urgent_path_ranks_options_by_step_time_with_their_node_loss_risk():
    """o0 steps in 10 s but a node loss costs it 10 s a step; o1 steps in 15 s with no risk.
    Over H = 10 with free transitions: o0 costs 10 x (10 + 10) = 200 s, o1 10 x 15 = 150 s,
    so o1 wins; on step time alone o0 (100 s) would."""
    opts = [Option("o0", Plan(()), 10.0, risk_s=10.0), Option("o1", Plan(()), 15.0)]
    f, _ = _schedules({"o0": _Sched(0.0), "o1": _Sched(0.0)})
    idx, _, v = select(opts, None, urgent=True, gamma=0.5, horizon_steps=10.0, schedule_of=f)
    assert idx == 1
    assert {x.label: x.admitted for x in v} == {"o0": False, "o1": True}
    assert "= 150 s" in next(x.why for x in v if x.admitted)


def test_the_non_urgent_path_prices_at_most_max_tries_schedules():
    """S* is rejected (payback 50 > γ·H = 5) and o1 is no cheaper; o2 would be admitted
    (payback 2), but max_tries = 2 is spent on the first two: the plan is kept."""
    table = {"o0": _Sched(100.0), "o1": _Sched(150.0), "o2": _Sched(2.0)}
    f, calls = _schedules(table)
    idx, sched, v = select(_opts(8.0, 8.5, 9.0), 10.0, urgent=False, gamma=0.5,
                           horizon_steps=10.0, schedule_of=f, max_tries=2)
    assert idx is None and sched is None
    assert calls == ["o0", "o1"]
    assert [x.label for x in v] == ["o0", "o1"] and not any(x.admitted for x in v)
    # with one more try o2 is priced and admitted
    f, calls = _schedules(table)
    idx, _, _ = select(_opts(8.0, 8.5, 9.0), 10.0, urgent=False, gamma=0.5,
                       horizon_steps=10.0, schedule_of=f, max_tries=3)
    assert idx == 2 and calls == ["o0", "o1", "o2"]


# ---------------------------------------------------------------- telemetry
def test_telemetry_rejects_bad_fields_by_name():
    ok = Telemetry(3, 1000.0, 1500, (3, 1, 2), {"a": 1.0}, {"a": 10}, {"a": {"gemm": 0.5}})
    assert ok.pool == (1, 2, 3)
    assert ok.op_times("a")
    for kwargs, field in (({"step": -1}, "telemetry.step"),
                          ({"response_len_max": 10}, "telemetry.response_len_max"),
                          ({"latency_s": {"a": 0.0}}, "telemetry.latency_s.a"),
                          ({"op_time_s": {"a": {"flops": 1.0}}}, "telemetry.op_time_s.a"),
                          ({"pool": (-1,)}, "telemetry.pool"),
                          ({"pool": ("gpu0",)}, "telemetry.pool"),
                          ({"pool": (1.5,)}, "telemetry.pool"),
                          ({"response_len_max": math.nan}, "telemetry.response_len_max"),
                          ({"response_len_max": math.inf}, "telemetry.response_len_max"),
                          ({"peak_mem_bytes": {"a": math.nan}}, "telemetry.peak_mem_bytes.a"),
                          ({"peak_mem_bytes": {"a": -1}}, "telemetry.peak_mem_bytes.a")):
        args = {"step": 1, "response_len_mean": 100.0, "response_len_max": 200, "pool": (0,)}
        args.update(kwargs)
        with pytest.raises(InputError) as e:
            Telemetry(**args)
        assert e.value.field == field


def test_the_urgent_path_always_prices_the_moves_that_carry_no_state():
    """More fast options than max_tries, none feasible: the slow in-place one is priced
    first, within the budget, and still runs."""
    fast = [Option(f"hybrid {k}", None, 10.0 + k) for k in range(13)]
    slow = Option("re-batched in place", None, 99.0, in_place=True)

    def schedule_of(opt):
        return _Sched(0.5) if opt is slow else _Sched(0.0, feasible=False)

    idx, sched, verdicts = select([*fast, slow], None, urgent=True, gamma=0.5,
                                  horizon_steps=10, schedule_of=schedule_of, max_tries=12)
    assert idx == 13 and sched.feasible and verdicts[-1].admitted
    # the in-place one and the 11 fastest: 12 schedules, verdicts in the order of the step
    assert len(verdicts) == 12 and verdicts[-1].label == "re-batched in place"
    assert [v.label for v in verdicts[:-1]] == [f"hybrid {k}" for k in range(11)]


def test_control_config_rejects_bad_knobs_by_name():
    """eff_z = 0 divided by zero at the first efficiency signal; max_tries = 0 priced nothing."""
    from nereus.control.controller import ControlConfig

    ControlConfig()
    for kwargs in ({"eff_z": 0.0}, {"max_tries": 0}, {"warmup_steps": -1},
                   {"eff_min_share": 1.5}, {"horizon_alpha": 0.0}, {"gamma": 2.0}):
        with pytest.raises(InputError) as e:
            ControlConfig(**kwargs)
        assert e.value.field == f"control.{next(iter(kwargs))}"


def test_a_target_whose_weight_sync_does_not_fit_is_not_a_move_the_controller_can_make(
        monkeypatch):
    """``price``/``reprice`` (every target the controller weighs: S*, hybrids, near
    placements, re-batched layouts) list the weight sync among what keeps a plan from running
    when the GPUs cannot hold it, as the search and the validator refuse it."""
    from nereus.control.targets import reprice
    from nereus.cost.model import CostModel
    from nereus.plan.search import best_plan
    from nereus.spec import parse_job

    job = parse_job({"model": "tiny-llama", "algo": "grpo", "gpus": 4,
                     "cluster": {"device": "cpu", "devices_per_node": 2}})
    plan = best_plan(job)
    assert reprice(job, CostModel(job), plan).fits
    real = CostModel.weight_sync_memory
    monkeypatch.setattr(CostModel, "weight_sync_memory",
                        lambda self, t, g: {**real(self, t, g), "gather buffer": 2**40})
    got = reprice(job, CostModel(job), plan)
    assert not got.fits
    assert [p for p in got.problems if p.startswith("weight sync actor_train -> actor_gen: ")]


def test_a_drift_trigger_says_by_how_much_it_passed_its_threshold():
    """A crossing at +30.4 % printed as '+30%, δ=30%', which reads as not past δ."""
    m = Monitor({"response_len": 0.3})
    m, _ = m.check({"response_len": 1000.0})
    _, (t,) = m.check({"response_len": 1304.0})
    assert t.describe() == "response_len 1304 vs ref 1000 (+30.4%, past δ=30%)"


def test_a_crossing_a_hair_past_its_threshold_does_not_print_as_equal_to_it():
    """+30.05 % printed as '+30.0%, past δ=30%': more decimals where one does not show it."""
    m = Monitor({"response_len": 0.3})
    m, _ = m.check({"response_len": 2000.0})
    _, (t,) = m.check({"response_len": 2601.0})
    assert t.describe() == "response_len 2601 vs ref 2000 (+30.05%, past δ=30%)"
    _, (t,) = m.check({"response_len": 1399.0})
    assert t.describe() == "response_len 1399 vs ref 2000 (-30.05%, past δ=30%)"


def test_a_payback_a_hair_over_gamma_h_is_rejected_with_numbers_that_show_it():
    """A payback of 5.000001 steps against γ·H = 5 printed as '0.5 > 0.5'-like equals."""
    f, _ = _schedules({"o0": _Sched(10.000002)})
    idx, _, (v,) = select(_opts(8.0), 10.0, urgent=False, gamma=0.5, horizon_steps=10.0,
                          schedule_of=f)
    assert idx is None and not v.admitted
    assert v.why == "rejected: payback 5.000001 steps > γ·H = 5"


def test_the_controller_and_select_refuse_an_unpriced_move_by_one_rule() -> None:
    """What ``select`` refuses before pricing a transition is what the controller asks before
    pricing the near placements' transitions: one rule, so the two cannot drift apart."""
    from nereus.control.admission import GAMMA_ZERO, NOT_FASTER, unpriced_refusal

    assert unpriced_refusal(10.0, 10.0, urgent=False, gamma=0.5) == NOT_FASTER
    assert unpriced_refusal(10.0, 9.0, urgent=False, gamma=0.0) == GAMMA_ZERO
    assert unpriced_refusal(10.0, 9.0, urgent=False, gamma=0.0, profitability=False) is None
    assert unpriced_refusal(10.0, 9.0, urgent=False, gamma=0.5) is None
    assert unpriced_refusal(10.0, 11.0, urgent=True, gamma=0.0) is None
    assert unpriced_refusal(None, 11.0, urgent=False, gamma=0.5) is None  # current cannot run
    opts = [Option("best", None, 9.0), Option("slower", None, 9.5)]  # type: ignore[arg-type]
    _, _, verdicts = select(opts, 10.0, urgent=False, gamma=0.0, horizon_steps=10,
                            schedule_of=lambda o: pytest.fail("priced under γ = 0"))
    assert [v.why for v in verdicts] == [GAMMA_ZERO]


def test_a_target_refused_before_pricing_is_not_recorded_as_feasible():
    """A verdict given before the transition was priced knows nothing of its feasibility:
    it says so (None, L_tran nan), where it once said feasible."""
    from nereus.control.admission import GAMMA_ZERO, NOT_FASTER

    for steps, gamma, why in (((10.0,), 0.5, NOT_FASTER), ((9.0,), 0.0, GAMMA_ZERO)):
        _, _, (v,) = select(_opts(*steps), 10.0, urgent=False, gamma=gamma, horizon_steps=10,
                            schedule_of=lambda o: pytest.fail("priced"))
        assert v.why == why and v.feasible is None and math.isnan(v.l_tran_s)
    f, _ = _schedules({"o0": _Sched(0, False)})
    _, _, (v,) = select(_opts(9.0), 10.0, urgent=False, gamma=0.5, horizon_steps=10,
                        schedule_of=f)
    assert v.feasible is False  # priced, and infeasible


def test_one_lost_gpu_is_named_as_one_gpu():
    """'lost GPUs 7, the plan used 7' read as seven GPUs."""
    (t,) = pool_triggers(range(8), range(7), range(8))
    assert t.detail == "lost GPU 7, the plan used it"
    (t,) = pool_triggers(range(8), [0, 1, 2, 3, 4, 5], [5, 6])
    assert t.detail == "lost GPUs 6-7 (2), the plan used GPU 6"
    (t,) = pool_triggers(range(7), range(8), range(7))
    assert t.detail == "gained GPU 7"
