"""Split and Merge staged through host memory (``staged=True``): same bytes as unstaged, a
peak of the larger shard instead of both, and a failure that puts the source back; and a Split
or Merge, staged or not, that fails on one member while the others finish: every source stays.

The first tests run one worker context in this process (no Ray); the others run transitions on
CPU workers (gloo) in one Ray session for the module. Staged primitives come from a planned
schedule whose Splits and Merges are replaced by staged copies (``dataclasses.replace``).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch

from nereus.cost.candidate import Candidate, Layout
from nereus.errors import InfeasibleError
from nereus.plan.types import Plan, StagePlan
from nereus.runtime import movement as mv
from nereus.runtime.comm import GroupSpec, Rendezvous, StoreAddress
from nereus.runtime.executor import Executor, state_specs
from nereus.runtime.faults import TransitionFailed, recover
from nereus.runtime.loading import seeded_meta
from nereus.runtime.placement import place_plan
from nereus.runtime.primitives import (
    launch,
    need_bytes,
    settle_calls,
    split_member_groups,
    workers_of,
)
from nereus.runtime.splitting import staging_bytes
from nereus.runtime.state import ShardedState, StateSpec, arena_layout
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.job import JobSpec
from nereus.spec.model import MODEL_PRESETS
from nereus.transition.instances import random_pair, stage_names
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Merge, Primitive, Split
from nereus.transition.schedule import Schedule
from nereus.transition.sizes import StateSizes

from runtime_testlib import (
    check_stages,
    cpu_job,
    stage_seeds,
    worker_pool,
)

SPEC = StateSpec(MODEL_PRESETS["tiny-llama"])


# ---------------------------------------------------------------- one worker context, no Ray
def _ctx(capacity: int = 1 << 30) -> WorkerContext:
    return WorkerContext(0, torch.device("cpu"), capacity)


def _bytes_of(ctx: WorkerContext, unit: str) -> torch.Tensor:
    return ctx.units[unit].buffer.clone()


@pytest.mark.parametrize("position", [(0, 0), (1, 0)])
def test_staged_merge_cuts_the_same_bytes_at_the_larger_shard(position: tuple[int, int]
                                                              ) -> None:
    """A tp=1 replica merged into position ``position`` of tp=2: staged and unstaged give the
    same arena; staged, the worker's peak is the source (the larger shard), not both. The
    source (staged: its host copy) stays until the Merge settles."""
    old = arena_layout(SPEC, 1, 1, 0, 0).nbytes
    new = arena_layout(SPEC, 2, 1, *position).nbytes
    out = {}
    for staged in (False, True):
        ctx = _ctx()
        mv.place_seeded(ctx, "src", SPEC, (1, 1), (0, 0), seed=3)
        ctx.memory.reset_peak()
        res = mv.merge_member(ctx, "src", "dst", (2, 1), position, staged=staged)
        assert set(ctx.units) == ({"dst"} if staged else {"src", "dst"})
        assert res.held_after == (new if staged else old + new)
        assert set(ctx.pending) == {"dst"}
        assert mv.settle_member(ctx, "dst", keep=True) == new
        assert set(ctx.units) == {"dst"} and not ctx.pending
        assert res.peak == ctx.memory.stats().peak == (max(old, new) if staged else old + new)
        out[staged] = _bytes_of(ctx, "dst")
    assert torch.equal(out[False], out[True])


def test_a_staged_merge_that_fails_puts_the_source_back(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The cut fails half-way, after the source left the device: the partial new shard is
    freed, the source is back under its id, bitwise, and the worker holds what it held."""
    ctx = _ctx()
    mv.place_seeded(ctx, "src", SPEC, (1, 1), (0, 0), seed=4)
    mv.place_seeded(ctx, "other", SPEC, (2, 1), (1, 0), seed=5)
    before, held = _bytes_of(ctx, "src"), ctx.memory.stats().held
    seen = {}

    def broken(target: ShardedState, src: ShardedState) -> None:
        seen["units"] = set(ctx.units)
        seen["held"] = ctx.memory.stats().held
        target.buffer[: target.nbytes // 2].copy_(src.buffer[: target.nbytes // 2])
        raise RuntimeError("injected fault in the cut")

    monkeypatch.setattr(mv, "cut", broken)
    with pytest.raises(RuntimeError, match="injected"):
        mv.merge_member(ctx, "src", "dst", (2, 1), (0, 0), staged=True)
    assert seen["units"] == {"other"}  # the source had left the device when it failed
    assert seen["held"] == held - before.numel() + arena_layout(SPEC, 2, 1, 0, 0).nbytes
    assert set(ctx.units) == {"src", "other"}
    assert torch.equal(_bytes_of(ctx, "src"), before)
    assert ctx.units["src"].meta == seeded_meta(4)
    assert ctx.memory.stats().held == held


@pytest.mark.parametrize("staged", [True, False])
def test_a_merge_settled_without_keeping_puts_the_source_back(staged: bool) -> None:
    """Another member of the Merge failed: this one drops the shard it made and holds its
    source again, bitwise (from the host copy when staged), and what it held before; settling
    again changes nothing."""
    ctx = _ctx()
    mv.place_seeded(ctx, "src", SPEC, (1, 1), (0, 0), seed=7)
    before, held = _bytes_of(ctx, "src"), ctx.memory.stats().held
    mv.merge_member(ctx, "src", "dst", (2, 1), (1, 0), staged=staged)
    assert mv.settle_member(ctx, "dst", keep=False) == held
    assert set(ctx.units) == {"src"} and not ctx.pending
    assert torch.equal(_bytes_of(ctx, "src"), before)
    assert ctx.units["src"].meta == seeded_meta(7)
    assert mv.settle_member(ctx, "dst", keep=True) == held and set(ctx.units) == {"src"}


def test_a_staged_split_that_cannot_join_puts_the_source_back() -> None:
    """The all-gather group cannot be reached after the source left the device: the new
    arena and the staging window are released and the source comes back from host memory."""
    ctx = _ctx()
    mv.place_seeded(ctx, "src", SPEC, (2, 1), (1, 0), seed=6)
    before, held = _bytes_of(ctx, "src"), ctx.memory.stats().held
    members = ((0, 0), (1, 0))
    assert staging_bytes(SPEC, 2, 1, members, (1, 1), mv.BUCKET_BYTES) > 0
    nobody = GroupSpec("split", StoreAddress("127.0.0.1", 1), (1, 0), "split/", 1.0)
    ctx.memory.reset_peak()
    with pytest.raises(Exception):  # noqa: B017 - whatever the store's connection raises
        mv.split_member(ctx, nobody, "src", "dst", (1, 1), members, staged=True)
    assert set(ctx.units) == {"src"}
    assert torch.equal(_bytes_of(ctx, "src"), before)
    st = ctx.memory.stats()
    assert st.held == held
    # it got as far as the new arena and its window, never with the source beside them
    new = arena_layout(SPEC, 1, 1, 0, 0).nbytes
    window = staging_bytes(SPEC, 2, 1, members, (1, 1), mv.BUCKET_BYTES)
    assert st.peak == new + window


# ---------------------------------------------------------------- transitions on Ray workers
@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with worker_pool(__name__, 8) as p:
        yield p



def _staged(schedule: Schedule) -> Schedule:
    """``schedule`` with every Split and Merge staged through host memory."""
    prims = tuple(replace(sp, primitive=replace(sp.primitive, staged=True))
                  if isinstance(sp.primitive, (Split, Merge)) else sp
                  for sp in schedule.primitives)
    return replace(schedule, primitives=prims)


def _plan(job: JobSpec, stage: str, tp: int, pp: int, reps: Sequence[Sequence[int]]) -> Plan:
    return Plan((StagePlan(stage, Candidate(Layout(tp, pp), len(reps), 1, 1),
                           tuple(tuple(r) for r in reps)),))


STAGE = "actor_train"  # the one model-stage the hand-made moves below change


def _move(model: str, gpus: int, seed: int, cur: tuple[int, int, list[list[int]]],
          tgt: tuple[int, int, list[list[int]]]
          ) -> tuple[JobSpec, Plan, Plan, Schedule, dict[str, StateSpec], dict[str, int]]:
    """``STAGE`` of ``model`` on ``gpus`` CPU workers from (tp, pp, replicas) ``cur`` to
    ``tgt``: the job, both plans, the schedule, the state specs and the seeds."""
    job = cpu_job(model, gpus)
    current, target = _plan(job, STAGE, *cur), _plan(job, STAGE, *tgt)
    return (job, current, target, plan_transition(job, current, target),
            state_specs(job), stage_seeds(job, seed))


# (model, seed, current pool size, target pool size): random plan pairs whose schedules hold
# Splits (TP and PP) and Merges
STAGED_CASES = [("tiny-llama", 0, 8, 8), ("tiny-qwen3", 8, 4, 8), ("tiny-llama", 3, 6, 6)]


def _random_staged(pool: WorkerPool, model: str, seed: int, cur: int, tgt: int
                   ) -> tuple[JobSpec, Plan, Schedule, dict[str, StateSpec], dict[str, int]]:
    job = cpu_job(model, 8)
    current, target = random_pair(random.Random(seed), job, stage_names(job, 4), cur, tgt)
    schedule = _staged(plan_transition(job, current, target))
    assert schedule.feasible, schedule.reason
    ops = {sp.op for sp in schedule.primitives if sp.primitive.staged}
    assert ops == {"Split", "Merge"}
    pool.set_capacity(schedule.capacity_bytes)
    specs = state_specs(job)
    seeds = stage_seeds(job, seed)
    place_plan(pool, job, current, specs, seeds)
    return job, target, schedule, specs, seeds


@pytest.mark.parametrize("model,seed,cur,tgt", STAGED_CASES)
def test_staged_schedule_keeps_every_copy_bitwise(clean: WorkerPool, model: str, seed: int,
                                                  cur: int, tgt: int) -> None:
    """The executor runs a schedule of staged Splits and Merges: every unit equals the state
    before, bitwise (moments, counters and RNG included), no worker past its capacity."""
    pool = clean
    job, _, schedule, specs, seeds = _random_staged(pool, model, seed, cur, tgt)
    report = Executor(pool, specs).run(schedule)
    check_stages(pool, job, report.units, seeds)
    assert report.within_capacity(), (report.peak_bytes, report.capacity_bytes)
    assert [t.op for t in report.timings] == [sp.op for sp in schedule.primitives]


def _fresh_count(ctx: WorkerContext) -> int:
    """Restart the peak; returns the bytes held (arenas count their own bytes, a reused
    larger block's slack not)."""
    ctx.memory.reset_peak()
    return ctx.memory.stats().held


def _run_one_by_one(pool: WorkerPool, schedule: Schedule, specs: Mapping[str, StateSpec]
                    ) -> list[tuple[Primitive, dict[int, int], dict[int, int]]]:
    """Each primitive alone, in schedule order (a topological order), with its workers' peaks
    restarted before it: (primitive, bytes held before, peak) per worker."""
    out = []
    with Rendezvous() as rv:
        for sp in schedule.primitives:
            p = sp.primitive
            before = pool.run({g: (_fresh_count, ()) for g in workers_of(p)})
            refs, _ = launch(p, pool, rv, specs[p.stage], f"t{sp.index}", 60.0)
            peak = {g: r.peak for g, r in zip(refs, ray.get(list(refs.values())))}
            pool.run(settle_calls(p, refs, keep=True))
            out.append((p, before, peak))
    return out


@pytest.mark.parametrize("model,seed,cur,tgt", STAGED_CASES[:2])
def test_each_staged_primitive_peaks_where_the_planner_said(clean: WorkerPool, model: str,
                                                            seed: int, cur: int, tgt: int
                                                            ) -> None:
    """Measured on the workers' byte counters, primitive by primitive: a staged Split or
    Merge takes exactly ``need_bytes`` beyond what the worker held, which is the planner's
    charge (``MemStep.during - before``: the larger shard, not both) plus, for a Split, its
    all-gather staging window only; every worker stays within its capacity."""
    pool = clean
    job, _, schedule, specs, seeds = _random_staged(pool, model, seed, cur, tgt)
    sizes = StateSizes(job)
    cap = pool.memory()
    staged_seen = {"Split": 0, "Merge": 0}
    for p, held, peak in _run_one_by_one(pool, schedule, specs):
        planned = p.memory(sizes)
        need = need_bytes(p, specs[p.stage])
        for g, before in held.items():
            measured = peak[g] - before
            assert measured == need.get(g, 0), (p.op, p.staged, g, measured, need.get(g))
            assert peak[g] <= cap[g].capacity
            if not p.staged:
                continue
            staged_seen[p.op] += 1
            window = need[g] - (planned[g].during - planned[g].before)
            assert window >= 0
            if isinstance(p, Merge):
                assert window == 0
                assert planned[g].during == max(planned[g].before, planned[g].after)
            else:
                members = next(ps for ps in _member_positions(p) if p.emu.position(
                    p.emu.gpus.index(g)) in ps)
                assert window <= staging_bytes(specs[p.stage], p.emu.layout.tp,
                                               p.emu.layout.pp, members, (p.sub.tp, p.sub.pp),
                                               mv.BUCKET_BYTES)
            # the worker's own units peaked at the planner's peak (plus the window)
            others = before - planned[g].before
            assert peak[g] - others <= planned[g].during + window
    assert all(staged_seen.values()), staged_seen
    check_stages(pool, job, {s: es for s, es in schedule.final.items()}, seeds)


def _member_positions(p: Split) -> list[tuple[tuple[int, int], ...]]:
    from nereus.runtime.primitives import split_member_groups

    return [ps for _, _, ps in split_member_groups(p)]


def test_a_move_that_fits_a_worker_only_staged(clean: WorkerPool) -> None:
    """Two tp=1 replicas merge into tp=2 and split back, with each worker's capacity the
    whole state plus the Split's smallest staging window: unstaged, the executor refuses
    before anything moves; staged, both run and the state is bitwise the same."""
    pool = clean
    job = cpu_job("tiny-llama", 2)
    stage = "actor_train"
    specs = state_specs(job)
    spec = specs[stage]
    seeds = stage_seeds(job, 21)
    two = _plan(job, stage, 1, 1, [[0], [1]])
    one = _plan(job, stage, 2, 1, [[0, 1]])
    merge = plan_transition(job, two, one)
    split = plan_transition(job, one, two)
    assert [sp.op for sp in merge.primitives] == ["Merge"]
    assert [sp.op for sp in split.primitives] == ["Split"]
    full = arena_layout(spec, 1, 1, 0, 0).nbytes
    window = staging_bytes(spec, 2, 1, ((0, 0), (1, 0)), (1, 1), mv.MIN_BUCKET_BYTES)
    capacity = full + window
    place_plan(pool, job, two, specs, seeds)
    pool.set_capacity(capacity, [0, 1])
    ex = Executor(pool, specs)
    with pytest.raises(InfeasibleError, match="needs more memory"):
        ex.run(merge)
    check_stages(pool, job, {stage: merge.initial[stage]}, seeds)  # nothing moved
    report = ex.run(_staged(merge))
    assert report.within_capacity() and max(report.peak_bytes.values()) == full
    check_stages(pool, job, report.units, seeds)
    with pytest.raises(InfeasibleError, match="needs more memory"):
        ex.run(split)
    report = ex.run(_staged(split))
    assert report.within_capacity(), (report.peak_bytes, capacity)
    assert max(report.peak_bytes.values()) > full  # its window, shrunk to fit
    check_stages(pool, job, report.units, seeds)


def test_a_staged_split_aborted_mid_transition_keeps_its_source(clean: WorkerPool) -> None:
    """A driver error once a staged Split started aborts its communicator after the members
    dropped their source positions: they put them back, the report calls the source unit
    intact, and recovery reaches the target without a checkpoint, bitwise."""
    pool = clean
    job, current, target, schedule, specs, seeds = _move(
        "tiny-qwen3", 4, 22, (2, 2, [[0, 1, 2, 3]]), (1, 1, [[0], [1], [2], [3]]))
    schedule, stage = _staged(schedule), STAGE
    assert [sp.op for sp in schedule.primitives] == ["Split"]
    place_plan(pool, job, current, specs, seeds)
    held = {d: s.held for d, s in pool.memory().items()}

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "start":
            raise RuntimeError("driver bug")

    ex = Executor(pool, specs, min_timeout_s=5.0, on_event=hook)
    with pytest.raises(TransitionFailed, match="driver bug") as info:
        ex.run(schedule)
    rep = info.value.report
    assert rep.dead == frozenset() and set(rep.failed) == {0}
    assert set(rep.failed[0]) == {0, 1, 2, 3}  # every member's call failed, none finished
    assert [e.id for e in rep.intact[stage]] == [schedule.initial[stage][0].id]
    assert {d: s.held for d, s in pool.memory().items()} == held
    check_stages(pool, job, rep.intact, seeds)
    ex.on_event = None
    rec = recover(pool, ex, job, rep, lambda ids: target)
    assert rec.restored == ()
    check_stages(pool, job, rec.units, seeds)


def _break_cut(ctx: WorkerContext) -> None:
    """Make this worker's next cuts fail half-way (a fault inside the worker)."""
    def broken(target: ShardedState, src: ShardedState) -> None:
        target.buffer[: target.nbytes // 2].copy_(src.buffer[: target.nbytes // 2])
        raise RuntimeError("injected fault in the cut")

    ctx.scratch["cut"] = mv.cut
    mv.cut = broken


def _mend_cut(ctx: WorkerContext) -> None:
    if "cut" in ctx.scratch:
        mv.cut = ctx.scratch.pop("cut")


@pytest.mark.parametrize("staged", [True, False])
def test_a_merge_failing_in_one_worker_keeps_every_source(clean: WorkerPool, staged: bool
                                                          ) -> None:
    """One worker of a Merge fails (staged: after its replica left the device, and it puts
    the replica back); the other worker, which made its part, keeps its replica too until
    the Merge settles, so both replicas stay, every byte held as before, and recovery needs
    no checkpoint."""
    pool = clean
    job, current, target, schedule, specs, seeds = _move(
        "tiny-llama", 2, 23, (1, 1, [[0], [1]]), (2, 1, [[0, 1]]))
    schedule, stage = _staged(schedule) if staged else schedule, STAGE
    assert [(sp.op, sp.primitive.staged) for sp in schedule.primitives] == [("Merge", staged)]
    place_plan(pool, job, current, specs, seeds)
    held = {d: s.held for d, s in pool.memory().items()}
    pool.run({1: (_break_cut, ())})
    try:
        ex = Executor(pool, specs, min_timeout_s=5.0)
        with pytest.raises(TransitionFailed, match="injected fault") as info:
            ex.run(schedule)
    finally:
        pool.run({1: (_mend_cut, ())})
    rep = info.value.report
    assert rep.dead == frozenset() and set(rep.failed) == {0} and set(rep.failed[0]) == {1}
    assert rep.intact[stage] == tuple(sorted(schedule.initial[stage], key=lambda e: e.id))
    assert {d: s.held for d, s in pool.memory().items()} == held
    check_stages(pool, job, rep.intact, seeds)
    rec = recover(pool, ex, job, rep, lambda ids: target)
    assert rec.restored == ()
    check_stages(pool, job, rec.units, seeds)


# How long a gated member of the Split below waits for the other group: generous, and below the
# primitive's deadline (its communicators' 5 s timeout plus the executor's 30 s grace), past
# which the executor would take the worker for hung and stop it.
ORDER_TIMEOUT_S = 25.0


def _done_mark(marks: str, g: int) -> str:
    return os.path.join(marks, f"done.{g}")


def _gate_split(ctx: WorkerContext, marks: str, after: Sequence[int], fail: bool) -> None:
    """Make this worker's next Split wait until the workers ``after`` finished their part of it
    (each one's call writes ``done.<worker>`` under the folder ``marks`` once its real Split
    returned), and record which it saw finished (``seen.<worker>``); then fail (``fail``: an
    error inside the worker that is not a death, an allocation failure, say) or make its
    part. Past ``ORDER_TIMEOUT_S`` it fails naming the broken ordering, instead of hanging."""
    real = mv.split_member
    me = ctx.device_id

    def gated(*args: object, **kwargs: object) -> mv.MoveResult:
        deadline = time.monotonic() + ORDER_TIMEOUT_S
        while not all(os.path.exists(_done_mark(marks, g)) for g in after):
            if time.monotonic() > deadline:
                raise RuntimeError(f"test ordering broken: workers {list(after)} did not "
                                   f"finish their part within {ORDER_TIMEOUT_S:g} s")
            time.sleep(0.01)
        seen = sorted(g for g in after if os.path.exists(_done_mark(marks, g)))
        with open(os.path.join(marks, f"seen.{me}"), "w") as f:
            f.write(" ".join(map(str, seen)))
        if fail:
            raise RuntimeError("injected fault in the split")
        result = real(*args, **kwargs)
        with open(_done_mark(marks, me), "w"):
            pass
        return result

    ctx.scratch["split_member"] = real
    mv.split_member = gated


def _mend_split(ctx: WorkerContext) -> None:
    if "split_member" in ctx.scratch:
        mv.split_member = ctx.scratch.pop("split_member")


def test_a_split_failing_in_one_group_keeps_the_only_copy(clean: WorkerPool,
                                                          tmp_path: Path) -> None:
    """A Split of a stage's only unit into two groups ((tp=2, pp=2) into two tp=2 replicas);
    a member of one group fails after the other group finished its part. The members that
    finished keep their source positions until the Split settles, so the source unit stays
    intact, every byte held as before, and recovery reaches the target without a
    checkpoint."""
    pool = clean
    job, current, target, schedule, specs, seeds = _move(
        "tiny-llama", 4, 24, (2, 2, [[0, 1, 2, 3]]), (2, 1, [[0, 1], [2, 3]]))
    stage = STAGE
    assert [sp.op for sp in schedule.primitives] == ["Split"]
    groups = [members for _, members, _ in split_member_groups(schedule.primitives[0].primitive)]
    assert len(groups) == 2
    place_plan(pool, job, current, specs, seeds)
    held = {d: s.held for d, s in pool.memory().items()}
    bad = groups[1][-1]
    # the order, without a race: the first group's members make their part as usual and mark
    # it done; the second group's members wait for those marks before their part (so the
    # first group's time does not count against the second's communicator timeout), and
    # ``bad`` then fails instead of making it
    marks = str(tmp_path)
    gates = {g: (_gate_split, (marks, () if g in groups[0] else groups[0], g == bad))
             for g in (*groups[0], *groups[1])}
    try:
        pool.run(gates)
        ex = Executor(pool, specs, min_timeout_s=5.0)
        with pytest.raises(TransitionFailed, match="injected fault") as info:
            ex.run(schedule)
    finally:
        pool.run({g: (_mend_split, ()) for g in gates})
    with open(os.path.join(marks, f"seen.{bad}")) as f:  # it failed once the others finished
        assert f.read() == " ".join(map(str, sorted(groups[0])))
    rep = info.value.report
    assert rep.dead == frozenset() and set(rep.failed) == {0}
    assert set(rep.failed[0]) == set(groups[1])  # the other group finished its part
    assert rep.intact[stage] == schedule.initial[stage]
    assert {d: s.held for d, s in pool.memory().items()} == held
    check_stages(pool, job, rep.intact, seeds)
    rec = recover(pool, ex, job, rep, lambda ids: target)
    assert rec.restored == () and not rec.rolled_back
    check_stages(pool, job, rec.units, seeds)
