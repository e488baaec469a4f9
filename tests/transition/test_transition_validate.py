"""The independent validator catches every kind of broken schedule it claims to check."""

from __future__ import annotations

from dataclasses import replace

from nereus.plan.types import Plan
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule, ScheduledPrimitive
from nereus.transition.validate import validate

from transition_testlib import example_a, example_b, job8b, sp, tiny_job


def shifted(s: Schedule, index: int, start: float) -> Schedule:
    """The schedule with one primitive moved to ``start`` (same duration)."""
    p = s.primitives[index]
    moved = replace(p, start_s=start, end_s=start + p.seconds)
    prims = tuple(moved if q.index == index else q for q in s.primitives)
    return replace(s, primitives=prims)


def find(s: Schedule, op: str, stage: str | None = None) -> ScheduledPrimitive:
    return next(p for p in s.primitives if p.op == op and (stage is None or p.stage == stage))


def test_a_valid_schedule_passes() -> None:
    job = job8b(32)
    for cur, tgt in (example_a(), example_b()):
        assert validate(job, cur, tgt, plan_transition(job, cur, tgt)) == []


def test_starting_before_a_dependency_ends_is_caught() -> None:
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    errs = validate(job, cur, tgt, shifted(s, find(s, "Merge").index, 0.0))
    assert any("before its dependency" in e for e in errs)
    assert any("not alive" in e for e in errs)  # its inputs do not exist yet


def test_a_cycle_is_caught() -> None:
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    split = find(s, "Split")
    looped = replace(split, deps=(find(s, "Merge").index,))
    s2 = replace(s, primitives=tuple(looped if p is split else p for p in s.primitives))
    assert any("cycle" in e for e in validate(job, cur, tgt, s2))


def test_two_primitives_on_one_gpu_at_once_are_caught() -> None:
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    m = find(s, "Merge")
    errs = validate(job, cur, tgt, shifted(s, m.index, m.start_s - 0.01))
    assert any("at once" in e for e in errs)


def test_destroying_the_last_copy_too_early_is_caught() -> None:
    job = job8b(16)
    cur = Plan((sp("reward_infer", 2, 2, [range(0, 4)]),))
    tgt = Plan((sp("reward_infer", 2, 2, [range(8, 12)]),))
    s = plan_transition(job, cur, tgt)
    d = find(s, "Destroy")
    broken = replace(shifted(s, d.index, 0.0), primitives=tuple(
        replace(p, deps=()) if p.op == "Destroy" else p for p in shifted(s, d.index, 0.0).primitives))
    errs = validate(job, cur, tgt, broken)
    assert any("no complete copy of reward_infer" in e for e in errs)


def test_memory_over_capacity_is_caught() -> None:
    """The same schedule checked against a device with less memory than it needs."""
    cur, tgt = example_b()
    s = plan_transition(job8b(32), cur, tgt)
    errs = validate(job8b(32, device_memory_gib=2.5), cur, tgt, s)
    assert any("over the capacity" in e for e in errs)


def test_concurrent_stages_meeting_on_a_gpu_are_caught() -> None:
    job = job8b(16)
    cur = Plan((sp("reference_infer", 1, 4, [range(0, 4), range(4, 8)]),
                sp("reward_infer", 1, 4, [range(8, 12)])))
    tgt = Plan((sp("reference_infer", 1, 4, [range(0, 4)]),
                sp("reward_infer", 1, 4, [range(4, 8)])))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    ext = find(s, "Extend", "reward_infer")
    early = replace(shifted(s, ext.index, 0.0), primitives=tuple(
        replace(p, deps=()) if p.index == ext.index else p
        for p in shifted(s, ext.index, 0.0).primitives))
    errs = validate(job, cur, tgt, early)
    assert any("run concurrently" in e for e in errs)


def test_a_wrong_end_state_or_wrong_figures_are_caught() -> None:
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    no_merge = replace(s, primitives=tuple(p for p in s.primitives if p.op != "Merge"))
    assert any("does not realize" in e for e in validate(job, cur, tgt, no_merge))
    assert any("estimated_s" in e for e in validate(job, cur, tgt, replace(s, estimated_s=0.5)))
    flat = replace(s, memory={g: ((0.0, 1),) for g in s.memory})
    assert any("reports a peak" in e for e in validate(job, cur, tgt, flat))


def test_a_split_that_breaks_the_nesting_contract_is_caught() -> None:
    job = tiny_job(8)
    cur = Plan((sp("reward_infer", 2, 2, [range(4)]),))
    tgt = Plan((sp("reward_infer", 2, 1, [[0, 1], [2, 3]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    split = find(s, "Split").primitive
    bad = object.__new__(type(split))  # bypass the primitive's own checks, as a bug would
    object.__setattr__(bad, "emu", split.emu)
    object.__setattr__(bad, "sub", split.sub)
    object.__setattr__(bad, "outputs", tuple(reversed(split.outputs)))
    prims = tuple(replace(p, primitive=bad) if p.primitive is split else p for p in s.primitives)
    assert any("nesting mapping" in e for e in validate(job, cur, tgt, replace(s, primitives=prims)))
