"""The independent validator catches every kind of broken schedule it claims to check."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from nereus.cost.candidate import Layout
from nereus.plan.types import Plan
from nereus.spec.job import parse_job
from nereus.spec.sharding import layout_problem
from nereus.transition.cost import Duration, TransitionCost
from nereus.transition.emu import Emu, Holds
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Destroy, Extend, Merge, Primitive, Split
from nereus.transition.schedule import Schedule, ScheduledPrimitive
from nereus.transition.sizes import StateSizes
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
    cur = Plan((sp("reward_infer", 2, 2, [range(4)]),))
    tgt = Plan((sp("reward_infer", 2, 2, [range(8, 12)]),))
    s = plan_transition(job, cur, tgt)
    d = find(s, "Destroy")
    broken = replace(shifted(s, d.index, 0.0), primitives=tuple(
        replace(p, deps=()) if p.op == "Destroy" else p
        for p in shifted(s, d.index, 0.0).primitives))
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
    cur = Plan((sp("reference_infer", 1, 4, [range(4), range(4, 8)]),
                sp("reward_infer", 1, 4, [range(8, 12)])))
    tgt = Plan((sp("reference_infer", 1, 4, [range(4)]),
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
    errs = validate(job, cur, tgt, replace(s, primitives=prims))
    assert any("nesting mapping" in e for e in errs)


def appended(s: Schedule, steps: list[tuple[Primitive, float]]) -> Schedule:
    """The schedule with ``steps`` (primitive, seconds) run one after another at its end."""
    prims = list(s.primitives)
    t = s.estimated_s
    for p, secs in steps:
        deps = (len(prims) - 1,) if prims else ()
        prims.append(ScheduledPrimitive(len(prims), p, t, t + secs, deps, (), Duration(secs),
                                        {}))
        t += secs
    return replace(s, primitives=tuple(prims), estimated_s=t)


def with_replayed_peaks(job, cur, tgt, s: Schedule) -> Schedule:
    """The schedule with the per-GPU peaks the validator's replay finds: a wrong schedule
    whose own figures are consistent, so only the rule it breaks can give it away."""
    found = {int(g): int(b) for g, b in re.findall(
        r"GPU (\d+): the schedule reports a peak of \d+ bytes, the replay finds (\d+)",
        "\n".join(validate(job, cur, tgt, s)))}
    memory = dict(s.memory)
    memory.update({g: ((0.0, b),) for g, b in found.items()})
    return replace(s, memory=memory)


def test_moving_a_stage_the_plans_leave_alone_still_counts_its_memory() -> None:
    """critic_train moves from GPU 2 to GPU 1 (2.6 MB; a GPU holds 2.8 MB). A wrong schedule
    then also takes actor_gen, which both plans keep on GPU 0, through GPU 1 and back (0.4 MB
    more there). The end state is right; GPU 1 held 3.06 MB on the way. The validator counted
    bytes only for the stages the plans change, so this passed."""
    job = tiny_job(4, memory_gib=2.8e6 / 0.9 / 2**30)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]), sp("critic_train", 1, 1, [[2]])))
    tgt = Plan((sp("actor_gen", 1, 1, [[0]]), sp("critic_train", 1, 1, [[1]])))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    gen = s.initial["actor_gen"][0]
    away = Extend.of(gen, [1], "actor_gen/1")
    back = Extend.of(away.output, [0], "actor_gen/2")
    s2 = appended(s, [(away, 0.01), (Destroy(gen), 0.001), (back, 0.01),
                      (Destroy(away.output), 0.001)])
    s2 = replace(s2, final={**s2.final, "actor_gen": (back.output,)})
    errs = validate(job, cur, tgt, s2)
    assert any("GPU 1 holds" in e and "over the capacity" in e for e in errs), errs


def test_a_split_whose_outputs_change_layout_is_caught() -> None:
    """(tp=2, pp=2) on GPUs 0-3 split into (2, 1) units on GPUs 0-1 and 2-3, the second one
    labelled (1, 2), then the first destroyed: the end state looks like the target (1, 2)
    unit on GPUs 2-3, but GPUs 2-3 hold tensor-parallel halves of every layer. Only the first
    output's layout was checked against the nesting mapping, so this passed."""
    job = tiny_job(8)
    cur = Plan((sp("reward_infer", 2, 2, [range(4)]),))
    tgt = Plan((sp("reward_infer", 1, 2, [[2, 3]]),))
    s = plan_transition(job, cur, tgt)
    assert s.feasible and validate(job, cur, tgt, s) == []
    unit = s.initial["reward_infer"][0]
    split = Split.of(unit, Layout(2, 1), ["reward_infer/1", "reward_infer/2"])
    assert [o.gpus for o in split.outputs] == [(0, 1), (2, 3)]
    relabelled = replace(split.outputs[1], layout=Layout(1, 2))
    bad = object.__new__(Split)  # bypass the primitive's own checks, as a bug would
    object.__setattr__(bad, "emu", unit)
    object.__setattr__(bad, "sub", split.sub)
    object.__setattr__(bad, "outputs", (split.outputs[0], relabelled))
    wrong = appended(replace(s, primitives=(), estimated_s=0.0),
                     [(bad, 0.05), (Destroy(split.outputs[0]), 0.001)])
    wrong = with_replayed_peaks(job, cur, tgt, replace(wrong,
                                                       final={"reward_infer": (relabelled,)}))
    errs = validate(job, cur, tgt, wrong)
    assert any("units of one sub-layout" in e for e in errs), errs


def test_a_copy_that_drops_the_optimizer_state_is_caught() -> None:
    """actor_train moves from GPU 0 to GPU 1; a wrong Extend makes a copy that holds θ only.
    Units were compared by id, layout and GPUs, so the lost ω went unnoticed."""
    job = tiny_job(4)
    cur = Plan((sp("actor_train", 1, 1, [[0]]),))
    tgt = Plan((sp("actor_train", 1, 1, [[1]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    ext = find(s, "Extend")
    good = ext.primitive
    assert good.output.holds is Holds.THETA_OMEGA
    thin: Emu = replace(good.output, holds=Holds.THETA)
    bad = object.__new__(Extend)  # bypass the primitive's own checks, as a bug would
    for name, value in (("emu", good.emu), ("targets", good.targets), ("output", thin)):
        object.__setattr__(bad, name, value)
    prims = tuple(replace(p, primitive=bad) if p is ext else p for p in s.primitives)
    errs = validate(job, cur, tgt, replace(s, primitives=prims, final={"actor_train": (thin,)}))
    assert any("holds theta of actor" in e and "needs theta+omega" in e for e in errs), errs


def test_primitives_shorter_than_their_estimate_are_caught() -> None:
    """The same schedule a thousand times faster: every figure of its own agrees (L_tran is
    its last end, the memory timeline follows the times), but no primitive takes the time
    the cost model gives it, so L_tran is a thousand times too small."""
    job = job8b(32)
    cur, tgt = example_b()
    s = plan_transition(job, cur, tgt)
    k = 1e-3
    fast = replace(s, estimated_s=s.estimated_s * k,
                   primitives=tuple(replace(p, start_s=p.start_s * k, end_s=p.end_s * k)
                                    for p in s.primitives),
                   memory={g: tuple((t * k, b) for t, b in steps)
                           for g, steps in s.memory.items()})
    errs = validate(job, cur, tgt, fast)
    assert errs and all("its estimate is" in e for e in errs), errs


# --- one test per rule the validator checks: each wrong schedule breaks that rule ---


@dataclass(frozen=True)
class DestroyTwo(Destroy):
    """A Destroy as a bug might build one: it tears down two units at once."""

    other: Emu

    @property
    def inputs(self) -> tuple[Emu, ...]:
        return (self.emu, self.other)


def rebuilt(job, cur, tgt, s: Schedule, steps: list[tuple[Primitive, float]],
            final: dict[str, tuple[Emu, ...]]) -> Schedule:
    """Only ``steps``, one after another from ``s``'s initial units, ending at ``final``;
    its peaks as the replay finds them, so only the rule the steps break gives it away."""
    wrong = appended(replace(s, primitives=(), estimated_s=0.0), steps)
    return with_replayed_peaks(job, cur, tgt, replace(wrong, final=final))


def _gen_moves_one_gpu():
    """actor_gen moved from GPU 0 to GPU 1 on a tiny job: its valid schedule, to break."""
    job = tiny_job(4)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]),))
    tgt = Plan((sp("actor_gen", 1, 1, [[1]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    return job, cur, tgt, s


def forged(cls: type, **fields: object) -> Primitive:
    """A primitive built past its own checks, as a bug would."""
    bad = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(bad, name, value)
    return bad


def test_a_merge_that_breaks_the_nesting_mapping_is_caught() -> None:
    """Two (1, 1) units on GPUs 0 and 1 merge into (2, 1); the contract puts input j on TP
    position j, so the output is on GPUs (0, 1). A wrong Merge labels it (1, 0): the end state
    looks like the target, but each GPU holds the other position's shard."""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1]]),))
    tgt = Plan((sp("reward_infer", 2, 1, [[1, 0]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    u0, u1 = s.initial["reward_infer"]
    good = Merge.of([u0, u1], Layout(2, 1), "reward_infer/2")
    assert good.output.gpus == (0, 1)
    out = replace(good.output, gpus=(1, 0))
    bad = forged(Merge, emus=(u0, u1), layout=Layout(2, 1), output=out, staged=False)
    errs = validate(job, cur, tgt, rebuilt(job, cur, tgt, s, [(bad, 0.002)],
                                           {"reward_infer": (out,)}))
    assert any("(Merge): output does not follow the nesting mapping" in e for e in errs), errs


def test_a_merge_of_the_wrong_number_of_units_is_caught() -> None:
    """Three (1, 1) units merged into one (2, 1) unit on GPUs 0-1, which takes two: the unit
    on GPU 2 silently vanishes and the end state realizes the target."""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1], [2]]),))
    tgt = Plan((sp("reward_infer", 2, 1, [[0, 1]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    units = s.initial["reward_infer"]
    out = Merge.of(units[:2], Layout(2, 1), "reward_infer/3").output
    bad = forged(Merge, emus=units, layout=Layout(2, 1), output=out, staged=False)
    errs = validate(job, cur, tgt, rebuilt(job, cur, tgt, s, [(bad, 0.002)],
                                           {"reward_infer": (out,)}))
    assert any("(Merge): 3 inputs cannot merge into" in e for e in errs), errs


def test_a_unit_the_model_cannot_be_sharded_into_is_a_line_not_a_crash() -> None:
    """Three (1, 1) units merged into tp=3 (3 does not divide the tiny model's 4 heads): the
    validator priced the output and raised the cost layer's InputError instead of saying what
    is wrong."""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1], [2]]),))
    tgt = Plan((sp("reward_infer", 2, 1, [[0, 1]]),))
    s = plan_transition(job, cur, tgt)
    units = s.initial["reward_infer"]
    two = Merge.of(units[:2], Layout(2, 1), "reward_infer/3").output
    out = replace(two, layout=Layout(3, 1), gpus=(0, 1, 2))
    bad = forged(Merge, emus=units, layout=Layout(3, 1), output=out, staged=False)
    wrong = appended(replace(s, primitives=(), estimated_s=0.0), [(bad, 0.002)])
    errs = validate(job, cur, tgt, replace(wrong, final={"reward_infer": (out,)}))
    assert errs == [(f"primitive 0 (Merge reward_infer): unit reward_infer/3 has layout "
                     f"{Layout(3, 1)}, which the model cannot take: "
                     f"{layout_problem(job.model, 3, 1)}")]


def test_an_extend_onto_its_own_gpus_or_to_another_layout_is_caught() -> None:
    """A (1, 2) unit on GPUs 0-1 copied onto GPUs 1-2 (GPU 1 is both a source and a target),
    and one copied to GPUs 2-3 but labelled (2, 1); the source destroyed after each, so both
    end states look like their targets."""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 2, [[0, 1]]),))
    for tgt_unit in (sp("reward_infer", 1, 2, [[1, 2]]), sp("reward_infer", 2, 1, [[2, 3]])):
        tgt = Plan((tgt_unit,))
        s = plan_transition(job, cur, tgt)
        assert validate(job, cur, tgt, s) == []
        (src,) = s.initial["reward_infer"]
        want = tgt_unit.replicas[0]
        out = replace(src, id="reward_infer/1", layout=tgt_unit.layout, gpus=want)
        bad = forged(Extend, emu=src, targets=want, output=out)
        wrong = rebuilt(job, cur, tgt, s, [(bad, 0.02), (Destroy(src), 0.001)],
                        {"reward_infer": (out,)})
        errs = validate(job, cur, tgt, wrong)
        assert any("(Extend): the copy must keep the layout on disjoint GPUs" in e
                   for e in errs), (tgt_unit, errs)


def test_a_destroy_of_two_units_is_caught() -> None:
    """One Destroy that tears down two of three units: a Destroy takes exactly one."""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1], [2]]),))
    tgt = Plan((sp("reward_infer", 1, 1, [[0]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    u0, u1, u2 = s.initial["reward_infer"]
    wrong = rebuilt(job, cur, tgt, s, [(DestroyTwo(u1, u2), 0.001)], {"reward_infer": (u0,)})
    errs = validate(job, cur, tgt, wrong)
    assert any("(Destroy): destroys exactly one unit" in e for e in errs), errs


def test_an_id_created_twice_is_caught() -> None:
    """actor_gen moves from GPU 0 to GPU 1; a wrong schedule then makes a passing copy on
    GPU 2 named actor_gen/0, the id of the unit it destroyed (the runtime keys state by id),
    and destroys it again."""
    job, cur, tgt, s = _gen_moves_one_gpu()
    (moved,) = s.final["actor_gen"]
    again = Extend.of(moved, [2], "actor_gen/0")
    wrong = with_replayed_peaks(job, cur, tgt, appended(s, [(again, 0.01),
                                                            (Destroy(again.output), 0.001)]))
    errs = validate(job, cur, tgt, wrong)
    assert any("Extend creates id actor_gen/0, which was already used" in e
               for e in errs), errs


def test_one_unit_read_by_two_running_primitives_is_caught() -> None:
    """actor_gen/0 on GPU 0 copied to GPUs 1 and 2 by two Extends at the same time."""
    job = tiny_job(4)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]),))
    tgt = Plan((sp("actor_gen", 1, 1, [[1], [2]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    first, second = (p for p in s.primitives if p.op == "Extend")
    errs = validate(job, cur, tgt, shifted(s, second.index, first.start_s))
    assert any("unit actor_gen/0 is used by two running primitives" in e for e in errs), errs


def test_an_initial_unit_that_is_not_a_replica_of_the_current_plan_is_caught() -> None:
    """The schedule says it starts from actor_gen/0 on GPU 3 (the plan has it on GPU 0), or
    from an actor_gen/7 the plan does not have."""
    job, cur, tgt, s = _gen_moves_one_gpu()
    (u,) = s.initial["actor_gen"]
    for initial, name in (((replace(u, gpus=(3,)),), "actor_gen/0"),
                          ((u, replace(u, id="actor_gen/7")), "actor_gen/7")):
        errs = validate(job, cur, tgt, replace(s, initial={"actor_gen": initial}))
        assert any(f"initial unit {name} is not replica {name} of the current plan" in e
                   for e in errs), errs


def test_a_final_unit_that_is_not_the_unit_on_its_replica_is_caught() -> None:
    """The end state is right, but final lists the two replicas the wrong way round, or names
    a unit on the right GPU that does not exist."""
    job = tiny_job(4)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]),))
    tgt = Plan((sp("actor_gen", 1, 1, [[1], [2]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    a, b = s.final["actor_gen"]
    assert (a.gpus, b.gpus) == ((1,), (2,))
    swapped = validate(job, cur, tgt, replace(s, final={"actor_gen": (b, a)}))
    assert any(f"final[actor_gen][0] ({b.id}) is not the unit on replica 0" in e
               for e in swapped), swapped
    ghost = replace(a, id="actor_gen/9")
    errs = validate(job, cur, tgt, replace(s, final={"actor_gen": (ghost, b)}))
    assert any("final[actor_gen][0] (actor_gen/9) is not the unit on replica 0" in e
               for e in errs), errs


def test_a_dependency_that_does_not_exist_is_caught() -> None:
    job, cur, tgt, s = _gen_moves_one_gpu()
    d = find(s, "Destroy")
    for bad in (len(s.primitives), -1):
        broken = replace(d, deps=d.deps + (bad,))
        prims = tuple(broken if p is d else p for p in s.primitives)
        errs = validate(job, cur, tgt, replace(s, primitives=prims))
        assert any(f"primitive {d.index}: dependency {bad} does not exist" in e
                   for e in errs), errs


def test_a_negative_start_or_duration_is_caught() -> None:
    """The Extend moved to start half a second before the transition does, or the Destroy
    ending before it starts."""
    job, cur, tgt, s = _gen_moves_one_gpu()
    early = shifted(s, find(s, "Extend").index, -0.5)
    d = find(s, "Destroy")
    backwards = replace(d, start_s=d.end_s, end_s=d.start_s)
    reversed_ = replace(s, primitives=tuple(backwards if p is d else p for p in s.primitives))
    for wrong in (early, reversed_):
        errs = validate(job, cur, tgt, wrong)
        assert "a primitive has a negative duration or start" in errs, errs


def test_a_primitive_with_units_of_another_model_stage_is_caught() -> None:
    """reference_infer moves from GPU 2 to GPU 1; a wrong Extend copies actor_gen's unit to
    GPU 1 and labels the copy reference_infer/1. The end state looks like the target, but
    reference_infer now holds the policy being trained, not the frozen reference."""
    job = tiny_job(4)
    cur = Plan((sp("actor_gen", 1, 1, [[0]]), sp("reference_infer", 1, 1, [[2]])))
    tgt = Plan((sp("actor_gen", 1, 1, [[0]]), sp("reference_infer", 1, 1, [[1]])))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    (gen,) = s.initial["actor_gen"]
    (ref,) = s.initial["reference_infer"]
    out = replace(gen, id="reference_infer/1", stage="reference_infer", gpus=(1,))
    bad = forged(Extend, emu=gen, targets=(1,), output=out)
    wrong = rebuilt(job, cur, tgt, s, [(bad, 0.01), (Destroy(ref), 0.001)],
                    {"actor_gen": (gen,), "reference_infer": (out,)})
    errs = validate(job, cur, tgt, wrong)
    assert any("(Extend): units of another model-stage" in e for e in errs), errs


def test_a_primitive_shortened_with_its_recorded_duration_is_caught() -> None:
    """The check compared each primitive's time with the duration the schedule itself carried:
    an Extend made a thousand times faster, duration and end together, passed."""
    job = job8b(32)
    cur, tgt = example_a()
    s = plan_transition(job, cur, tgt)
    e = find(s, "Extend")
    fast = e.duration.seconds / 1000
    cheat = replace(e, end_s=e.start_s + fast, duration=Duration(fast))
    errs = validate(job, cur, tgt, replace(s, primitives=tuple(
        cheat if p is e else p for p in s.primitives)))
    assert any(f"primitive {e.index} (Extend {e.stage}) lasts {fast:.6f} s in the schedule, its "
               f"estimate is {e.duration.seconds:.6f} s" in x for x in errs), errs


# --- rules the schedules above never isolate: each wrong schedule below breaks the rule it is
# --- named for (at the moments it asserts, that rule alone), its primitives lasting their
# --- estimates and its figures the replay's, so no other rule speaks for it


def priced(job, cur, tgt, s: Schedule, steps: list[tuple[Primitive, float, tuple[int, ...]]],
           final: dict[str, tuple[Emu, ...]]) -> Schedule:
    """``steps`` (primitive, start, deps) from ``s``'s initial units, each lasting its estimate
    under ``s``'s efficiencies, ending at ``final``, with the peaks the replay finds."""
    cost = TransitionCost(job.cluster, StateSizes(job), s.efficiencies)
    prims = []
    for i, (p, start, deps) in enumerate(steps):
        secs = cost.seconds(p)
        prims.append(ScheduledPrimitive(i, p, start, start + secs, deps, (), Duration(secs), {}))
    wrong = replace(s, primitives=tuple(prims), estimated_s=max(p.end_s for p in prims),
                    final=final)
    return with_replayed_peaks(job, cur, tgt, wrong)


def test_a_unit_that_does_not_hold_every_tensor_is_no_copy() -> None:
    """reward_infer as two (tp=3, pp=1) replicas, one of them destroyed: the end state is the
    target, but tiny-llama's 4 attention heads do not split 3 ways, so the replica left
    holds no complete copy of the state. (Neither unit is read or made by a primitive, whose
    pricing would refuse the layout, and neither is loaded, so no bytes are counted for them.)"""
    job = tiny_job(8)
    cur = Plan((sp("reward_infer", 3, 1, [[0, 1, 2], [3, 4, 5]]),))
    tgt = Plan((sp("reward_infer", 3, 1, [[0, 1, 2]]),))
    # a valid schedule of (1, 1) units on GPUs 0 and 3: its initial units, relabelled (3, 1)
    s = plan_transition(job, Plan((sp("reward_infer", 1, 1, [[0], [3]]),)),
                        Plan((sp("reward_infer", 1, 1, [[0]]),)))
    keep, drop = (replace(e, layout=Layout(3, 1), gpus=g)
                  for e, g in zip(s.initial["reward_infer"], [(0, 1, 2), (3, 4, 5)]))
    s = replace(s, initial={"reward_infer": (keep, drop)})
    wrong = priced(job, cur, tgt, s, [(Destroy(drop), 0.0, ())], {"reward_infer": (keep,)})
    end = wrong.primitives[0].end_s
    errs = validate(job, cur, tgt, wrong)
    assert errs == [f"t={t:.6f}: no complete copy of reward_infer's state survives"
                    for t in (0.0, end)], errs


def test_a_unit_being_destroyed_is_no_surviving_copy() -> None:
    """reward_infer's two replicas destroyed by Destroys that overlap: from when the second
    starts until the first ends both are being destroyed, and then the only unit left is. (The
    end state is wrong too, and once both end no unit is left; but the moments while a Destroy
    runs are caught by this rule only. A replacement copy cannot come in time without another
    rule firing: its source is a copy alive all the while it is read, and one being destroyed
    meanwhile is a unit used by two running primitives.)"""
    job = tiny_job(4)
    cur = Plan((sp("reward_infer", 1, 1, [[0], [1]]),))
    tgt = Plan((sp("reward_infer", 1, 1, [[0]]),))
    s = plan_transition(job, cur, tgt)
    assert validate(job, cur, tgt, s) == []
    a, b = s.initial["reward_infer"]
    d = TransitionCost(job.cluster, StateSizes(job), s.efficiencies).seconds(Destroy(a))
    wrong = priced(job, cur, tgt, s, [(Destroy(b), 0.0, ()), (Destroy(a), d / 2, ())],
                   {"reward_infer": (a,)})
    errs = validate(job, cur, tgt, wrong)
    # at d/2 both units are being destroyed; at d the first is gone, the second is dying
    for t in (d / 2, d):
        assert f"t={t:.6f}: no complete copy of reward_infer's state survives" in errs, errs
    assert not [e for e in errs if e.startswith((f"t={d / 2:.6f}", f"t={d:.6f}"))
                and "no complete copy" not in e], errs


def test_asynchronous_generation_meeting_another_stage_on_a_gpu_is_caught() -> None:
    """Asynchronous execution: actor_gen (GPU 0) generates the next step while reward_infer
    scores this one, so the two run side by side. reward_infer moves from GPU 2 to GPU 1, a
    wrong schedule by way of GPU 0: there it meets actor_gen. (Synchronous execution runs the
    two phases one after the other, and the same detour is allowed.)"""
    for execution in ("async", "sync"):
        job = parse_job({"model": "tiny-llama", "gpus": 4, "execution": execution,
                         "cluster": {"device": "cpu", "devices_per_node": 4}})
        cur = Plan((sp("actor_gen", 1, 1, [[0]]), sp("reward_infer", 1, 1, [[2]])))
        tgt = Plan((sp("actor_gen", 1, 1, [[0]]), sp("reward_infer", 1, 1, [[1]])))
        s = plan_transition(job, cur, tgt)
        assert validate(job, cur, tgt, s) == []
        (gen,) = s.initial["actor_gen"]
        (rew,) = s.initial["reward_infer"]
        there = Extend.of(rew, [0], "reward_infer/1")
        back = Extend.of(there.output, [1], "reward_infer/2")
        cost = TransitionCost(job.cluster, StateSizes(job), s.efficiencies)
        t = [0.0]
        for p in (there, Destroy(rew), back):
            t.append(t[-1] + cost.seconds(p))
        wrong = priced(job, cur, tgt, s, [(there, t[0], ()), (Destroy(rew), t[1], (0,)),
                                          (back, t[2], (1,)),
                                          (Destroy(there.output), t[3], (2,))],
                       {"actor_gen": (gen,), "reward_infer": (back.output,)})
        errs = validate(job, cur, tgt, wrong)
        if execution == "sync":
            assert errs == [], errs
            continue
        assert errs and all(re.fullmatch(r"t=[\d.]+: GPU 0 is held by actor_gen and "
                                         r"reward_infer, which run concurrently", e)
                            for e in errs), errs
