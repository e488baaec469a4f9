"""The simulator and its policies on small scenarios (all numbers simulated)."""

from dataclasses import fields, replace

import pytest

from nereus.control.controller import ControlConfig
from nereus.sim import traces as T
from nereus.sim.scenarios import (
    SCENARIOS,
    builtin,
    run_scenario,
    simulator,
    with_overrides,
)


@pytest.fixture(scope="module")
def stationary():
    sc = builtin("stationary", steps=120)
    return sc, run_scenario(sc)


def test_stationary_trace_has_no_transition_after_the_first_plan(stationary):
    sc, res = stationary
    assert set(res.results) == {"static", "replan_always", "nereus", "oracle"}
    n = res.results["nereus"]
    assert len(n.rows) == sc.steps
    assert n.transitions == 0 and n.restarts == 0 and n.transition_s == 0
    assert {r.plan_gpus for r in n.rows} == {16}


def test_calibrator_error_under_ten_percent_after_ten_steps(stationary):
    _, res = stationary
    n = res.results["nereus"]
    assert n.rows[0].calib_error > 0.10          # the defaults are off: calibration matters
    assert n.calib_error_at(10) < 0.10


def test_every_policy_pays_the_same_periodic_checkpoint_writes(stationary):
    """A failure restarts from the last periodic checkpoint, so writing it is not free: every
    ``checkpoint_interval_steps`` steps each policy waits for the write the controller prices
    into a planned restart (θ and ω of the trainable models over the pool's write bandwidth)."""
    from nereus.control.restart import checkpoint_write_s, restart_cost
    sc, res = stationary
    every = sc.restart.checkpoint_interval_steps
    write_s = checkpoint_write_s(sc.job, sc.restart)
    assert write_s == pytest.approx(restart_cost(sc.job, sc.restart, after_failure=False).save_s)
    assert write_s > 0
    writes = sc.steps // every
    for name, r in res.results.items():
        accounted = sum(row.step_s + row.transition_s + row.restart_s + row.lost_s
                        + row.paused_s for row in r.rows)
        assert r.total_s - accounted == pytest.approx(writes * write_s), name
        assert [row.step for row in r.rows if row.checkpoint_s > 0] == \
            [k for k in range(sc.steps) if (k + 1) % every == 0], name
        assert r.summary()["checkpoint_s"] == pytest.approx(writes * write_s), name


def test_result_json_has_the_issue_shape(stationary):
    from nereus.commands.simulate import result_json
    sc, res = stationary
    out = result_json(res, sc)
    assert set(out) == {"scenario", "source", "run", "policies"}
    assert out["source"] == "simulated" and out["scenario"] == "stationary"
    assert out["run"] == {"scenario": "stationary", "steps": 120, "seed": 0, "gamma": 0.5,
                          "policies": ["static", "replan_always", "nereus", "oracle"],
                          "command": "nereus simulate --scenario stationary"}
    assert set(out["policies"]) == {"static", "replan_always", "nereus", "oracle"}
    for v in out["policies"].values():
        assert {"tokens_per_s", "transitions", "transition_s", "restarts"} <= set(v)
        assert set(v) == {"tokens_per_s", "transitions", "transition_s", "restarts",
                          "mean_step_s", "restart_s", "lost_s", "paused_s", "checkpoint_s",
                          "calib_error_at_step_10"}
        assert v["tokens_per_s"] > 0


@pytest.fixture(scope="module")
def node_loss():
    """One node leaves for a while and comes back; lengths stay put."""
    sc = builtin("stationary", steps=60)
    av = T.Availability((0.0, 400.0, 1400.0), (tuple(range(16)), tuple(range(8)),
                                               tuple(range(16))), "test: node 1 leaves")
    sc = replace(sc, availability=av, name="node-loss")
    return sc, run_scenario(sc)


def test_static_restarts_on_a_loss_and_never_grows_back(node_loss):
    _, res = node_loss
    s = res.results["static"]
    assert s.restarts == 1 and s.lost_s > 0
    assert s.rows[0].plan_gpus == 16 and s.rows[-1].plan_gpus <= 8


def test_oracle_moves_for_free_and_others_pay_for_moves(node_loss):
    _, res = node_loss
    o = res.results["oracle"]
    # its moves are free, and it sees the loss coming: on the step node 1 leaves it runs on
    # node 0 alone, so the loss hits none of its GPUs (the others lose critic_train's one
    # replica there and restart)
    assert o.transition_s == 0 and o.rows[-1].plan_gpus == 16
    assert res.results["static"].restarts == 1
    assert o.restarts == 0 and o.lost_s == 0
    assert min(r.plan_gpus for r in o.rows) == 8
    n = res.results["nereus"]
    assert n.rows[-1].plan_gpus == 16             # it took the node back
    moved = [e for e in n.events if e.kind in ("move", "restart")]
    # a move costs time unless it moves no state: the spread plan keeps a copy of every stage
    # on node 0, so the urgent move onto it only re-batches in place (L_tran 0)
    assert moved and any(e.seconds > 0 for e in moved)
    assert all(e.seconds > 0 or "L_tran=0 s" in e.detail for e in moved)
    assert sum(r.transition_s for r in n.rows) == pytest.approx(n.transition_s)
    best = max(r.tokens_per_s for r in res.results.values())
    assert o.tokens_per_s == pytest.approx(best)


def test_runs_are_deterministic():
    sc = builtin("churn", steps=25)
    a = run_scenario(sc, ["static", "nereus"])
    b = run_scenario(sc, ["static", "nereus"])
    for name in ("static", "nereus"):
        assert a.results[name].rows == b.results[name].rows
        assert a.results[name].events == b.results[name].events


def test_every_builtin_parameter_has_a_source_or_is_an_assumption():
    required = {"job", "lengths", "availability", "drift", "hidden_efficiency", "noise",
                "restart.startup_s", "restart.storage_read_bw_per_node",
                "restart.storage_write_bw_per_node", "restart.checkpoint_interval_steps",
                "restart.checkpoint_bytes", "control.gamma", "control.delta_len",
                "control.delta_eff", "control.length_margin", "control.length_window",
                "control.warmup_steps", "control.horizon_alpha", "plan_cache", "static",
                "availability_replay", "control.restart_moves"}
    # every knob of the controller the scenarios run with (the restart's have their own notes)
    required |= {f"control.{f.name}" for f in fields(ControlConfig) if f.name != "restart"}
    for name in SCENARIOS:
        notes = builtin(name, steps=5).notes
        assert required <= set(notes), (name, required - set(notes))
        for k, v in notes.items():
            assert v and len(v) > 3, (name, k)
            assert "assumption" in v or any(w in v for w in (
                "paper", "§", "examples/", "AWS", "computed", "constant", "none",
                "simulation shortcut", "from", "schedule", "progress-aligned", "extension",
                "per GPU budget", "after a failure", "generated")), (name, k, v)


def test_worker_processes_give_the_same_results_as_one_process():
    sc = builtin("churn", steps=20)
    one = run_scenario(sc, ["static", "nereus", "oracle"], workers=1)
    two = run_scenario(sc, ["static", "nereus", "oracle"], workers=2)
    assert list(two.results) == ["static", "nereus", "oracle"]
    for name in one.results:
        assert one.results[name].rows == two.results[name].rows


def test_a_run_cut_with_steps_is_the_first_steps_of_the_whole_run():
    """``--steps N`` runs the whole run's first N steps: the pool changes at the same steps
    (the nominal clock maps the trace by the whole run's lengths, not the first N steps'),
    so the controller and the oracle do and measure the same. Before, the first GPU loss of
    the default scenario landed at step 18 with --steps 20, 16 with 60, 15 with 120."""
    whole = builtin("default")
    full = simulator(whole)
    assert any(e.changes for e in full.events[:12])  # the pool changes within the prefix
    short, longer = with_overrides(whole, steps=12), with_overrides(whole, steps=24)
    for sc in (short, longer):
        sim = simulator(sc)
        assert sim.events == full.events[:sc.steps]
        assert sim.nominal == full.nominal[:sc.steps]
    a = run_scenario(short, ["nereus", "oracle"], workers=1)
    b = run_scenario(longer, ["nereus", "oracle"], workers=1)
    for name in ("nereus", "oracle"):
        assert a.results[name].rows == b.results[name].rows[:12]
        assert a.results[name].events == tuple(e for e in b.results[name].events
                                               if e.step < 12)


def test_the_oracle_is_an_upper_bound_on_the_stationary_trace():
    """The oracle picks, with the ground truth, the fastest plan it finds at every step, so
    Nereus does not run faster. Nereus beat it here (19,684 against 19,658 tokens/s over 300
    steps) while the truth priced the weight sync from bare layouts (the colocated price) and
    the planner the oracle searches with priced it from the candidates: the truth charged
    the plan Nereus ran 0.17 s per step less than the planner, the oracle's plan 0.09 s."""
    sc = with_overrides(builtin("stationary"), steps=30)
    res = run_scenario(sc, ["nereus", "oracle"], workers=1)
    o, n = res.results["oracle"], res.results["nereus"]
    assert o.tokens_per_s >= n.tokens_per_s
    assert all(a.step_s <= b.step_s * (1 + 1e-9) for a, b in zip(o.rows, n.rows))


def test_the_oracle_is_not_held_to_the_plan_caches_longer_bucket_edge():
    """The plan cache solves a response-length bucket at its upper edge (up to 10 % longer than
    the step's longest response) with the planner's 10 % memory headroom; the oracle also
    weighs the plan of the bucket below and keeps it when the truth says it fits the step.
    At 2,600 tokens on the first node's 8 GPUs that plan is faster (by about 0.5 s:
    simulated)."""
    from nereus.cost.model import CostModel
    from nereus.sim.plancache import PlanCache
    from nereus.sim.policies import OraclePolicy

    sc = builtin("stationary", steps=5)
    truth = simulator(sc).truth
    pool, mean, longest = tuple(range(8)), 1733, 2600
    job = truth.job_at(pool, mean, longest)
    edge_plan = PlanCache()(job, CostModel(job, truth.efficiencies(0)))
    chosen = OraclePolicy(truth, PlanCache())._best(pool, 0, mean, longest)
    got = truth.price(chosen, pool, 0, mean, longest)
    assert truth.fits(got)
    assert got.step_s < truth.price(edge_plan, pool, 0, mean, longest).step_s


def test_the_plan_cache_gives_the_faster_of_packed_and_spread():
    """On 16 GPUs a plan spread over both nodes syncs its weights inside them but all-reduces
    its training gradients across them; the planner's best, and so the plan cache the oracle
    and the static policy read, is the faster of it and the packed plan (simulated)."""
    from nereus.cost.model import CostModel
    from nereus.plan.search import Planner
    from nereus.sim.plancache import PlanCache
    from nereus.sim.policies import OraclePolicy

    truth = simulator(builtin("stationary", steps=5)).truth
    pool, mean, longest = tuple(range(16)), 500, 700
    job = truth.job_at(pool, mean, longest)
    cost = CostModel(job, truth.efficiencies(0))

    def step_s(plan):
        return truth.price(plan, pool, 0, mean, longest).step_s

    packed = Planner(job, cost=cost).best_placed()
    spread = PlanCache()(job, cost, True)
    assert step_s(spread) != pytest.approx(step_s(packed))
    faster = min(step_s(spread), step_s(packed))
    assert step_s(PlanCache()(job, cost)) == pytest.approx(faster)
    chosen = OraclePolicy(truth, PlanCache())._best(pool, 0, mean, longest)
    assert step_s(chosen) <= faster * (1 + 1e-12)


def test_a_change_that_misses_a_plan_still_changes_the_pool_and_the_checkpoint():
    """Node 1 leaves, comes back, and leaves again inside a checkpoint step. Static stayed on
    node 0 after the first loss, so the second misses its plan; the others use node 1 again
    and lose work. Every row of that step still reports the pool left at its end, and the
    checkpoint is written by that one node for every policy: static once wrote it from two
    nodes in half the time (pool 16, 108.7 s against 217.5 s on churn seed 3, step 139)."""
    from itertools import accumulate

    from nereus.control.restart import checkpoint_write_s
    sc = builtin("stationary", steps=42)
    every = sc.restart.checkpoint_interval_steps
    k = 4 * every - 1                                   # a checkpoint step
    ends = list(accumulate(simulator(sc).nominal))      # the clock is the full pool's
    leave = ends[k - 1] + 0.3 * (ends[k] - ends[k - 1])
    full, node0 = tuple(range(16)), tuple(range(8))
    av = T.Availability((0.0, ends[8] + 10.0, ends[22] + 10.0, leave),
                        (full, node0, full, node0), "test: node 1 leaves twice")
    sc = replace(sc, availability=av, name="miss")
    sim = simulator(sc)
    assert sim.events[k].pool == full and sim.events[k].changes[0][2] == node0
    res = run_scenario(sc, workers=1)
    hit = {name for name, r in res.results.items()
           if any(e.step == k and e.kind == "loss" for e in r.events)}
    assert "static" not in hit and hit, hit             # missed one plan, hit another
    write_s = checkpoint_write_s(sim.truth.job_at(node0, *sc.lengths.at(k)), sc.restart)
    for name, r in res.results.items():
        row = next(row for row in r.rows if row.step == k)
        assert row.pool_gpus == 8, name
        assert row.checkpoint_s == pytest.approx(write_s), name
        assert r.checkpoint_s == pytest.approx(res.results["static"].checkpoint_s), name


def _spike(steps: int, at: int, longest: int, name: str = "spike"):
    """The stationary scenario with one step's longest response raised to ``longest``."""
    sc = builtin("stationary", steps=steps)
    lt = sc.lengths.head(steps)
    spiked = tuple(longest if k == at else x for k, x in enumerate(lt.longest))
    return replace(sc, lengths=T.LengthTrace(lt.mean, spiked, "test: one long response"),
                   name=name, steps=steps)


def test_an_out_of_memory_crash_restarts_onto_a_plan_that_holds_the_crashed_step():
    """One response of 16,000 tokens at step 12: the controller heard of the step before the
    crash (2,000-token responses) and restarted onto a plan for those, which crashed again on
    the same step 10,000 times and then raised RuntimeError. It now hears of the crashed step's
    lengths, and restarts once onto a plan that holds them."""
    from nereus.sim.policies import make_policies
    sc = _spike(16, 12, 16000)
    sim = simulator(sc)
    pols = make_policies(["nereus", "replan_always"], sim.truth, sc.lengths, sc.control)
    res = sim.run(pols, sc.name)
    for name, r in res.results.items():
        ooms = [e for e in r.events if e.kind == "oom"]
        assert [e.step for e in ooms] == [12], name
        assert len(r.rows) == sc.steps, name
        assert r.restarts == 1, name


def test_an_out_of_memory_crash_reports_only_the_peaks_measured_before_it():
    """At 16,000 tokens critic_train runs out of memory at step 12; actor_train fits but runs
    beside it on other GPUs. The policy heard of actor_train's peak too (every stage that
    held its own), which the crash stopped short of: it now hears of the stages that ended
    before critic_train began -- generation and inference -- and of none after (simulated)."""
    from nereus.sim.policies import make_policies
    sc = _spike(16, 12, 16000)
    sim = simulator(sc)
    (pol,) = make_policies(["nereus"], sim.truth, sc.lengths, sc.control)
    heard = []
    real = pol.failed

    def failed(tel, upcoming):
        heard.append(tel)
        return real(tel, upcoming)

    pol.failed = failed
    crashed = []
    real_run = sim.truth.run_step

    def run_step(plan, pool, k, mean, longest):
        out = real_run(plan, pool, k, mean, longest)
        if not sim.truth.fits(out[2]):
            crashed.append(dict(out[2].peak_bytes))
        return out

    sim.truth.run_step = run_step
    sim.run([pol], sc.name)
    cap = sim.truth.job.cluster.device.memory_bytes
    (peaks,) = crashed
    assert peaks["critic_train"] > cap >= peaks["actor_train"]   # the case this is about
    (tel,) = heard
    assert tel.step == 12
    assert set(tel.peak_mem_bytes) == {"actor_gen", "reference_infer", "reward_infer",
                                       "critic_infer"}
    assert all(tel.peak_mem_bytes[s] == peaks[s] for s in tel.peak_mem_bytes)


def _fake_plan(groups=(), names=("actor_gen", "reference_infer", "reward_infer",
                                 "critic_infer", "actor_train", "critic_train")):
    """What ``measured_before_crash`` reads of a plan: its stages' names and its groups."""
    from types import SimpleNamespace

    from nereus.plan.types import Plan
    plan = SimpleNamespace(groups=tuple(groups),
                           stages=tuple(SimpleNamespace(stage=n) for n in names))
    plan.all_groups = lambda: Plan.all_groups(plan)
    return plan


@pytest.mark.parametrize("times,over,measured", [
    # generation ran out: nothing ended before it
    ({}, {"actor_gen"}, set()),
    # critic_infer after reference_infer on shared GPUs (starts at 12 s); reward_infer beside
    # them ends at 11 s: both earlier stages measured theirs
    ({}, {"critic_infer"}, {"actor_gen", "reference_infer", "reward_infer"}),
    # reward_infer beside them runs until 13 s: it began before the crash at 12 s, and had
    # reached its peak
    ({"reward_infer": 3.0}, {"critic_infer"}, {"actor_gen", "reference_infer", "reward_infer"}),
    # two stages over: the crash is at the first to start (reference_infer, 10 s); reward_infer
    # begins at that instant and measured nothing
    ({}, {"critic_infer", "reference_infer"}, {"actor_gen"}),
    # the weight sync ran out, after every stage: every peak was measured
    ({}, set(), {"actor_gen", "reference_infer", "reward_infer", "critic_infer",
                 "actor_train", "critic_train"}),
])
def test_a_crash_measures_the_peaks_of_the_stages_that_began_before_it(times, over, measured):
    """Synchronous PPO: generation 10 s; reference_infer (2 s) then critic_infer (1 s) on
    one GPU set, reward_infer (1 s) beside them; actor_train and critic_train after."""
    from nereus.sim.simulator import measured_before_crash
    from nereus.spec.workflow import ppo
    secs = {"actor_gen": 10.0, "reference_infer": 2.0, "reward_infer": 1.0,
            "critic_infer": 1.0, "actor_train": 5.0, "critic_train": 4.0, **times}
    cap = 100
    peaks = {s: 150 if s in over else 50 for s in secs}
    got = measured_before_crash(ppo(), _fake_plan([("reference_infer", "critic_infer")]),
                                secs, peaks, cap)
    assert got == {s: 50 for s in measured}


@pytest.mark.parametrize("gen_s", [20.0, 2.5])
def test_asynchronous_generation_is_measured_however_long_it_runs(gen_s):
    """Asynchronous GRPO: generation runs beside inference and training; actor_train runs out
    at 3 s (after reference_infer and reward_infer, 3 s side by side). Generation began at 0 s
    and measured its peak whether it is still running at the crash or not, so the controller
    never takes it for the stage that ran out (a reviewer's case: it learned that generation
    needs the whole device)."""
    from nereus.sim.simulator import measured_before_crash
    from nereus.spec.workflow import Execution, grpo
    names = ("actor_gen", "reference_infer", "reward_infer", "actor_train")
    secs = {"actor_gen": gen_s, "reference_infer": 2.0, "reward_infer": 3.0,
            "actor_train": 5.0}
    peaks = {"actor_gen": 50, "reference_infer": 50, "reward_infer": 50, "actor_train": 150}
    got = measured_before_crash(grpo(Execution.ASYNC), _fake_plan(names=names), secs, peaks,
                                100)
    assert got == {s: 50 for s in ("actor_gen", "reference_infer", "reward_infer")}


def test_a_step_no_plan_holds_stops_the_run_with_an_input_error(monkeypatch):
    """A policy whose every plan runs out of memory on one step stops the run after a few
    tries with an error naming the step and its longest response (the CLI's exit 2), not
    after 10,000 restarts with a RuntimeError."""
    from nereus.errors import InputError
    from nereus.sim import simulator as S
    from nereus.sim.policies import make_policies
    sc = _spike(16, 12, 16000)
    sim = simulator(sc)
    pols = make_policies(["nereus"], sim.truth, sc.lengths, sc.control)
    at = {"step": -1}
    real_fits, real_advance = sim.truth.fits, S._Runner.advance

    def advance(self, k):
        at["step"] = k
        return real_advance(self, k)

    monkeypatch.setattr(S._Runner, "advance", advance)
    # the truth's memory: every plan runs out on step 12
    monkeypatch.setattr(sim.truth, "fits", lambda priced: at["step"] != 12 and real_fits(priced))
    with pytest.raises(InputError, match=r"step 12: nereus ran out of memory 5 times in a row "
                                         r"on this step \(longest response 16000 tokens"):
        sim.run(pols, sc.name)


def test_the_oracle_restarts_where_a_loss_takes_the_last_copy_of_the_state():
    """Node 0 gives way to node 1 mid-step: no GPU holding the state is left. The oracle moved
    it for free (restart 0) where every other policy restarted from the checkpoint; a move of
    state that no longer exists is no transition, so it restarts after a failure as they do
    (its moves stay free)."""
    from itertools import accumulate
    sc = builtin("stationary", steps=12)
    ends = list(accumulate(simulator(sc).nominal))
    av = T.Availability((0.0, ends[5] + 0.5 * (ends[6] - ends[5])),
                        (tuple(range(8)), tuple(range(8, 16))), "test: node 0 gives way")
    res = run_scenario(replace(sc, availability=av, name="all-gone"), workers=1)
    o, s = res.results["oracle"], res.results["static"]
    assert s.restarts == 1
    assert o.restarts == 1 and o.transition_s == 0
    (restart,) = [e for e in o.events if e.kind == "restart"]
    assert restart.seconds > 0 and restart.detail.startswith("no copy of the state left (lost")
    assert "actor_train" in restart.detail
    assert o.restart_s == pytest.approx(s.restart_s) and o.lost_s == pytest.approx(s.lost_s)
