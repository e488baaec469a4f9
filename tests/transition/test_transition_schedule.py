"""Durations over the links, the list schedule, its memory timeline, and calibration."""

from __future__ import annotations

import random

import pytest

from nereus.cost.efficiency import Efficiencies
from nereus.cost.ops import OpClass
from nereus.cost.state import emu_state_bytes
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.transition.calibrate import calibrate_transition
from nereus.transition.cost import LOCAL_OP_S, SETUP_S, predict
from nereus.transition.planner import plan_transition, transition_dag
from nereus.transition.primitives import Merge
from nereus.transition.validate import validate

from transition_testlib import example_a, example_b, job8b, sp


def test_a_copy_inside_a_node_is_faster_than_across_nodes() -> None:
    job = job8b(32)
    cur = Plan((sp("reward_infer", 1, 2, [range(2)]),))
    near = plan_transition(job, cur, Plan((sp("reward_infer", 1, 2, [range(2), [2, 3]]),)))
    far = plan_transition(job, cur, Plan((sp("reward_infer", 1, 2, [range(2), [8, 9]]),)))
    dev = job.cluster.device
    b = max(emu_state_bytes(job.model, job.workflow.model("reward").head,
                            near.final["reward_infer"][0].layout, False, job.workload, 0, r)
            for r in range(2))
    eff = Efficiencies()
    setup = SETUP_S[dev.name] / eff[OpClass.SETUP]
    assert near.estimated_s == pytest.approx(
        setup + (b / dev.intra_node_bw + dev.intra_latency_s) / eff[OpClass.BROADCAST_INTRA])
    assert far.estimated_s == pytest.approx(
        setup + (b / dev.inter_node_bw + dev.inter_latency_s) / eff[OpClass.BROADCAST_INTER])
    assert far.estimated_s > near.estimated_s


def test_schedule_runs_primitives_side_by_side_on_disjoint_gpus_only() -> None:
    job = job8b(32)
    for cur, tgt in (example_a(), example_b()):
        s = plan_transition(job, cur, tgt)
        for p in s.primitives:
            assert all(s.primitives[d].end_s <= p.start_s + 1e-12 for d in p.deps)
            for q in s.primitives:
                if q.index < p.index and q.end_s > p.start_s + 1e-12:
                    assert not set(q.gpus) & set(p.gpus)
        assert s.estimated_s == max(p.end_s for p in s.primitives)
        assert [p.start_s for p in s.primitives] == sorted(p.start_s for p in s.primitives)


def test_memory_timeline_starts_with_the_current_state_and_ends_with_the_target() -> None:
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    head = job.workflow.model("reward").head

    def held(plan: Plan) -> dict[int, int]:
        out: dict[int, int] = {}
        for st in plan.stages:
            for r in st.replicas:
                for i, g in enumerate(r):
                    out[g] = out.get(g, 0) + emu_state_bytes(
                        job.model, head, st.layout, False, job.workload, i % st.tp, i // st.tp)
        return out

    dag, _ = transition_dag(job, cur, tgt)
    assert dag.initial_bytes == held(cur)  # only the stages that change are loaded
    end = held(tgt)
    assert set(s.memory) == set(held(cur)) | set(held(tgt))
    for g, steps in s.memory.items():  # (t, bytes from t on), after what starts at t
        assert steps[0][0] == 0.0
        assert steps[-1][1] == end.get(g, 0)
        assert max(b for _, b in steps) <= s.capacity_bytes
    assert s.capacity_bytes == int(0.9 * job.cluster.device.memory_bytes)


def test_lower_efficiencies_mean_longer_transitions() -> None:
    job = job8b(32)
    cur, tgt = example_a()
    base = plan_transition(job, cur, tgt)
    slow = plan_transition(job, cur, tgt, Efficiencies({OpClass.BROADCAST_INTER: 0.1,
                                                        OpClass.SETUP: 0.5}))
    assert slow.estimated_s > 2 * base.estimated_s
    assert slow.efficiencies[OpClass.BROADCAST_INTER] == 0.1


TRUE = {OpClass.SETUP: 0.4, OpClass.BROADCAST_INTRA: 0.7, OpClass.BROADCAST_INTER: 0.35,
        OpClass.ALLGATHER_INTRA: 0.55, OpClass.ALLGATHER_INTER: 0.3, OpClass.COPY: 0.6}


def synthetic_times(schedule, noise: float, seed: int = 0) -> list[float]:
    """Times the schedule's primitives would take under TRUE efficiencies (+- noise)."""
    rng = random.Random(seed)
    eff = Efficiencies(TRUE)
    out = []
    for p in schedule.primitives:
        t = predict(dict(p.duration.ideal), p.duration.local_s, eff) if p.duration.ideal \
            else p.seconds
        out.append(t * (1 + noise * (2 * rng.random() - 1)))
    return out


def test_calibration_recovers_setup_and_bandwidth_efficiencies() -> None:
    """Exact times from known efficiencies are fitted back exactly, and re-planning with the
    fitted efficiencies predicts those times."""
    job = job8b(64)
    cur = Plan((sp("reward_infer", 4, 4, [range(16)]), sp("critic_train", 2, 4, [range(16, 24)]),
                sp("actor_gen", 2, 2, [range(24, 28)])))
    tgt = Plan((sp("reward_infer", 4, 2, [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15],
                                          range(32, 40)]),
                sp("critic_train", 2, 4, [range(16, 24), range(40, 48)]),
                sp("actor_gen", 2, 2, [range(24, 28), range(28, 32)])))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    classes = {c for p in s.primitives for c, _ in p.duration.ideal}
    assert {OpClass.SETUP, OpClass.BROADCAST_INTRA, OpClass.BROADCAST_INTER,
            OpClass.ALLGATHER_INTRA} <= classes
    measured = synthetic_times(s, 0.0)
    fit = calibrate_transition(s, measured)
    for c in classes:
        assert fit[c] == pytest.approx(TRUE[c], rel=1e-3)
    again = plan_transition(job, cur, tgt, fit)
    by_key = {(p.op, tuple(e.id for e in p.primitive.inputs)): p.seconds for p in again.primitives}
    for p, m in zip(s.primitives, measured):
        assert by_key[(p.op, tuple(e.id for e in p.primitive.inputs))] == pytest.approx(m, rel=1e-4)


def test_calibration_with_noisy_times_stays_close() -> None:
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    fit = calibrate_transition(s, synthetic_times(s, 0.05, seed=1))
    again = plan_transition(job, cur, tgt, fit)
    truth = plan_transition(job, cur, tgt, Efficiencies(TRUE))
    assert again.estimated_s == pytest.approx(truth.estimated_s, rel=0.1)
    assert calibrate_transition(s, {}) == s.efficiencies  # nothing measured: nothing learned
    with pytest.raises(InputError, match="measured"):
        calibrate_transition(s, [1.0])
    with pytest.raises(InputError, match="> 0"):
        calibrate_transition(s, {0: -1.0})


def test_no_link_is_fitted_above_its_datasheet_peak() -> None:
    """Times ten times faster than the links and HBM allow are a mislabelled link or a bad
    timer: link and copy efficiencies stop at 1 on a datasheet device (set-up has no peak)."""
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    fast = [p.duration.local_s + 0.1 * (p.seconds - p.duration.local_s) for p in s.primitives]
    fit = calibrate_transition(s, fast)
    bounded = {c for p in s.primitives for c, _ in p.duration.ideal if c is not OpClass.SETUP}
    assert OpClass.COPY in bounded and all(fit[c] <= 1.0 for c in bounded)


def test_a_merge_is_priced_as_a_copy_at_the_copy_efficiency() -> None:
    """A Merge reads and writes its largest new shard once at HBM bandwidth: that is its one
    ideal term (class copy: no set-up, no link), on top of the dispatch constant, and its
    seconds follow eff[copy]."""
    job = job8b(32)
    cur, tgt = example_a()
    dev = job.cluster.device
    dag, cost = transition_dag(job, cur, tgt)
    _, slow = transition_dag(job, cur, tgt, Efficiencies({OpClass.COPY: 0.35}, dev.name))
    merges = [p for p in dag.primitives if isinstance(p, Merge)]
    assert merges and not any(p.staged for p in merges)
    for p in merges:
        d = cost.duration(p)
        ((cls, ideal),) = d.ideal
        assert cls is OpClass.COPY
        assert ideal == pytest.approx(2 * max(cost.sizes.of(p.output)) / dev.hbm_bw)
        assert d.local_s == LOCAL_OP_S
        assert d.seconds == pytest.approx(LOCAL_OP_S + ideal / cost.eff[OpClass.COPY])
        assert slow.seconds(p) == pytest.approx(LOCAL_OP_S + ideal / 0.35)
        assert predict(dict(d.ideal), d.local_s, slow.eff) == pytest.approx(slow.seconds(p))


def test_seconds_is_the_durations_seconds_for_every_primitive() -> None:
    """What the scheduler reads (``seconds``) is what the breakdown adds up to, for all four
    primitives, staged or not, and ``predict`` rebuilds it from the breakdown."""
    staged = (Plan((sp("actor_train", 2, 2, [range(8, 12), range(12, 16)]),)),
              Plan((sp("actor_train", 4, 1, [range(8, 12), range(12, 16), range(16, 20),
                                             range(20, 24)]),)))
    seen = set()
    for job, (cur, tgt) in ((job8b(32), example_a()), (job8b(32), example_b()),
                            (job8b(24), staged)):
        dag, cost = transition_dag(job, cur, tgt)
        for p in dag.primitives:
            d = cost.duration(p)
            assert cost.seconds(p) == d.seconds
            assert predict(dict(d.ideal), d.local_s, cost.eff) == pytest.approx(d.seconds)
            seen.add((p.op, p.staged))
    assert {("Split", False), ("Split", True), ("Merge", False), ("Merge", True),
            ("Extend", False), ("Destroy", False)} <= seen


def test_calibration_fits_the_copy_efficiency_from_merge_times() -> None:
    """Merges measured at 1.5x their estimate: the fitted copy efficiency reproduces those
    times, whether the Merges are calibrated alone (rows with a copy term only, no set-up) or
    with the schedule's other primitives at their estimates (which keep their classes)."""
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    merges = {p.index: 1.5 * p.seconds for p in s.primitives if p.op == "Merge"}
    assert merges
    everything = [merges.get(p.index, p.seconds) for p in s.primitives]
    for measured in (merges, everything):
        fit = calibrate_transition(s, measured)
        assert fit[OpClass.COPY] < s.efficiencies[OpClass.COPY]
        again = plan_transition(job, cur, tgt, fit)
        for p, q in zip(s.primitives, again.primitives):
            assert q.op == p.op and q.gpus == p.gpus
            want = merges.get(p.index, p.seconds)
            assert q.seconds == pytest.approx(want, rel=1e-3)
    assert set(calibrate_transition(s, merges).measured()) == {OpClass.COPY}


def test_planning_is_deterministic() -> None:
    job = job8b(64)
    cur = Plan((sp("reward_infer", 4, 4, [range(16)]), sp("critic_train", 2, 4, [range(16, 24)])))
    tgt = Plan((sp("reward_infer", 2, 2, [range(4), range(32, 36), range(40, 44)]),
                sp("critic_train", 2, 4, [range(16, 24), range(48, 56)])))
    a, b = plan_transition(job, cur, tgt), plan_transition(job, cur, tgt)
    assert [(p.op, p.start_s, p.gpus) for p in a.primitives] == \
        [(p.op, p.start_s, p.gpus) for p in b.primitives]


def test_a_merge_timed_at_its_dispatch_constant_teaches_nothing() -> None:
    """A Merge measured at about its 1 ms dispatch constant leaves (almost) nothing for its
    copy: it must not pin the copy efficiency at its bound."""
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    for factor in (0.9, 1.0001, 1.01):
        quick = {p.index: factor * LOCAL_OP_S for p in s.primitives if p.op == "Merge"}
        assert quick
        assert calibrate_transition(s, quick)[OpClass.COPY] == s.efficiencies[OpClass.COPY]


def test_plans_of_different_stages_name_the_plan_that_lacks_one() -> None:
    """With critic_train only in the target, the error said 'target.stages'."""
    job = job8b(16)
    both = Plan((sp("actor_train", 2, 1, [[0, 1]]),))
    more = Plan((sp("actor_train", 2, 1, [[0, 1]]), sp("critic_train", 2, 1, [[2, 3]])))
    with pytest.raises(InputError) as info:
        plan_transition(job, both, more)
    assert str(info.value).startswith("current.stages: lacks critic_train, which the target "
                                      "plan lists"), info.value
    with pytest.raises(InputError) as info:
        plan_transition(job, more, both)
    assert str(info.value).startswith("target.stages: lacks critic_train, which the current "
                                      "plan lists"), info.value


def test_a_layout_that_cannot_shard_the_model_lists_the_sizes_that_can() -> None:
    job = job8b(16)
    with pytest.raises(InputError) as info:
        plan_transition(job, Plan((sp("actor_train", 1, 3, [[0, 1, 2]]),)),
                        Plan((sp("actor_train", 1, 1, [[0]]),)))
    assert info.value.field == "current.actor_train"
    assert info.value.allowed == "tp in 1, 2, 4, 8, 16, 32; pp in 1, 2, 4, 8, 16, 32"
