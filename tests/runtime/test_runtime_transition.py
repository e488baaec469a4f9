"""Transitions executed on real workers: bitwise state, capacity, faults (dead and hung
workers), checkpoint restore.

One Ray session for the module; the pool grows and shrinks with each case's plans.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import ray
import torch

from nereus.cost.candidate import Layout
from nereus.plan.types import Plan
from nereus.runtime import movement as mv
from nereus.runtime.checkpoint import DCP_METADATA, Checkpointer
from nereus.runtime.executor import Executor, state_specs
from nereus.runtime.faults import (
    FaultReport,
    Recovery,
    TransitionFailed,
    reconcile,
    recover,
)
from nereus.runtime.loading import seeded_logical
from nereus.runtime.placement import gather_unit, place_current, place_plan
from nereus.runtime.primitives import PrimitiveTiming
from nereus.runtime.state import PARAM, StateSpec
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.job import JobSpec
from nereus.transition.calibrate import calibrate_transition
from nereus.transition.emu import Emu, phi
from nereus.transition.instances import random_pair, stage_names
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Primitive
from nereus.transition.schedule import Schedule

from runtime_testlib import (
    check_stages,
    clear_units,
    cpu_job,
    gone,
    pids,
    plan_of,
    stage_seeds,
    worker_pool,
    worker_resources,
)


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with worker_pool(__name__, 8) as p:
        yield p


# after every test, failing ones included: nothing left behind (conftest.py)
pytestmark = pytest.mark.usefixtures("clean")


def _fit_pool(pool: WorkerPool, ids: Sequence[int], exact: bool = False) -> None:
    """Workers for ``ids`` (started when missing); ``exact`` also stops the others."""
    if exact:
        pool.shrink([d for d in pool.device_ids if d not in ids])
    pool.grow([d for d in ids if d not in pool.device_ids])


def _held_ids(pool: WorkerPool) -> dict[int, list[str]]:
    return {d: r[3] for d, r in worker_resources(pool).items()}




# (model, seed, current pool size, target pool size, device memory in MiB or None, whether
# the Ray workers themselves start and stop with the pool: the growth case transitions onto
# workers started for it, the shrink case stops the workers the target no longer uses)
CASES = [("tiny-llama", 0, 4, 6, None, False), ("tiny-qwen3", 1, 6, 4, None, False),
         ("tiny-llama", 4, 8, 5, 8.0, False), ("tiny-qwen3", 4, 8, 5, None, False),
         ("tiny-qwen3", 3, 4, 8, 6.0, False), ("tiny-llama", 3, 4, 8, None, True),
         ("tiny-llama", 1, 6, 4, None, True),
         ("tiny-qwen2", 2, 4, 8, None, False)]  # q/k/v biases move with their heads


def _restore(pool: WorkerPool, devices: Sequence[int]) -> None:
    """Put killed workers back, a failing test included: a fresh process for one the pool
    still lists, the device grown back where recovery shrank the pool."""
    for d in devices:
        if d in pool.device_ids:
            pool.replace(d)
        else:
            pool.grow([d])


@pytest.mark.parametrize("model,seed,cur,tgt,mem,workers", CASES)
def test_random_transition_keeps_every_copy_bitwise(pool: WorkerPool, model: str, seed: int,
                                                    cur: int, tgt: int, mem: float | None,
                                                    workers: bool) -> None:
    """Random plan pairs (TP, PP, DP, GPU sets, pool growth and shrinkage): after the
    transition every unit of every model-stage equals the state before, bitwise, optimizer
    moments, counters and RNG included; no worker ever holds more than its capacity."""
    job = cpu_job(model, 8, memory_mib=mem)
    pair = random_pair(random.Random(seed), job, stage_names(job, 4), cur, tgt)
    assert pair is not None
    current, target = pair
    schedule = plan_transition(job, current, target)
    assert schedule.feasible, schedule.reason
    if workers:  # only the current plan's workers run; the target's new ones start now
        _fit_pool(pool, current.gpus(), exact=True)
        pool.set_capacity(schedule.capacity_bytes)
        started = [g for g in target.gpus() if g not in pool.device_ids]
        _fit_pool(pool, sorted(set(current.gpus()) | set(target.gpus())))
        assert started or cur >= tgt
    else:
        _fit_pool(pool, sorted(set(current.gpus()) | set(target.gpus())))
        pool.set_capacity(schedule.capacity_bytes)
    specs = state_specs(job)
    seeds = stage_seeds(job, seed)
    place_plan(pool, job, current, specs, seeds)
    report = Executor(pool, specs).run(schedule)

    check_stages(pool, job, report.units, seeds)
    want = {e.id for es in phi(job, target).values() for e in es}
    assert {e.id for es in report.units.values() for e in es} == want
    held = _held_ids(pool)
    for e in (e for es in report.units.values() for e in es):
        for g in e.gpus:
            assert e.id in held[g]
    assert sum(len(v) for v in held.values()) == sum(len(e.gpus) for es in report.units.values()
                                                     for e in es)
    assert report.within_capacity(), (report.peak_bytes, report.capacity_bytes)
    # measured timings, in the schedule's shape
    assert [t.op for t in report.timings] == [p.op for p in schedule.primitives]
    for t, sp in zip(report.timings, schedule.primitives):
        assert isinstance(t, PrimitiveTiming) and t.source == "measured"
        assert 0 <= t.start_s <= t.end_s <= report.wall_s + 1e-6
        assert t.gpus == tuple(sorted({g for e in sp.primitive.inputs + sp.primitive.outputs
                                       for g in e.gpus}))
        if t.op in ("Split", "Extend"):
            assert t.setup_s > 0 and t.bytes > 0 and t.communicators >= 1
        for d in sp.deps:
            assert report.timings[d].end_s <= t.start_s
    if schedule.primitives:
        eff = calibrate_transition(schedule, report.measured_seconds())
        assert eff is not None
    if workers:  # the workers the target does not use stop
        stopped = [d for d in pool.device_ids if d not in target.gpus()]
        old = pids(pool)
        _fit_pool(pool, target.gpus(), exact=True)
        assert gone([old[d] for d in stopped])


def _kill_when(pool: WorkerPool, op: str, pick: int) -> tuple[list[int], object]:
    """An event hook that kills the worker at index ``pick`` of the first ``op`` it sees,
    right after that primitive's calls were submitted (mid-transition)."""
    killed: list[int] = []

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "start" and p.op == op and not killed:
            gpus = [g for e in p.inputs + p.outputs for g in e.gpus]
            killed.append(gpus[pick])
            ray.kill(pool.actor(gpus[pick]), no_restart=True)

    return killed, hook


def _one_stage_plan(job: JobSpec, stage: str, tp: int, pp: int,
                    reps: Sequence[Sequence[int]]) -> Plan:
    return plan_of(job, {stage: (tp, pp, reps)})


@dataclass
class _KilledExtend:
    job: JobSpec
    stage: str
    seeds: dict[str, int]
    killed: list[int]
    ex: Executor
    failure: TransitionFailed


@dataclass
class _Extend:
    job: JobSpec
    stage: str
    target: Plan
    schedule: Schedule
    specs: dict[str, StateSpec]
    seeds: dict[str, int]


def _extend_placed(pool: WorkerPool, seed: int) -> _Extend:
    """Two tp=2 replicas of actor_train on workers 0-3, placed, and the schedule of one Extend
    that adds a third on 4-5."""
    job = cpu_job("tiny-llama", 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    current = _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3]])
    target = _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3], [4, 5]])
    schedule = plan_transition(job, current, target)
    assert [p.op for p in schedule.primitives] == ["Extend"]
    specs = state_specs(job)
    seeds = stage_seeds(job, seed)
    place_plan(pool, job, current, specs, seeds)
    return _Extend(job, stage, target, schedule, specs, seeds)


def _extend_with_receiver_killed(pool: WorkerPool, seed: int, timeout_s: float
                                 ) -> _KilledExtend:
    """The receiving worker of ``_extend_placed``'s Extend dies mid-Extend and the run fails
    (the callers tear down differently: grow or replace)."""
    e = _extend_placed(pool, seed)
    job, stage, schedule, specs, seeds = e.job, e.stage, e.schedule, e.specs, e.seeds
    killed, hook = _kill_when(pool, "Extend", -1)
    ex = Executor(pool, specs, min_timeout_s=timeout_s, on_event=hook)
    with pytest.raises(TransitionFailed) as info:
        ex.run(schedule)
    return _KilledExtend(job, stage, seeds, killed, ex, info.value)


def test_worker_killed_mid_transition_loses_nothing_while_another_copy_exists(
        pool: WorkerPool) -> None:
    k = _extend_with_receiver_killed(pool, 11, timeout_s=5.0)
    job, stage, seeds, killed, ex = k.job, k.stage, k.seeds, k.killed, k.ex
    try:
        rep = k.failure.report
        assert set(killed) <= rep.dead and rep.dead
        assert len(rep.intact[stage]) == 2  # both replicas survived the failed Extend
        assert not rep.lost_stages([stage])

        def target_for(ids: Sequence[int]) -> Plan:  # the surviving pool: tp=1 replicas
            return _one_stage_plan(job, stage, 1, 1, [[g] for g in ids if g < 6])

        rec = recover(pool, ex, job, rep, target_for)
        assert rec.restored == () and rec.transition is not None
        assert killed[0] not in pool.device_ids
        check_stages(pool, job, rec.units, seeds)
        assert len(rec.units[stage]) == 5
    finally:
        _restore(pool, killed)


STALL_S = 15.0  # past the 5 s ping that once declared a worker dead; within GRACE_S (30 s)


def test_a_worker_slow_to_answer_during_a_fault_keeps_its_shards_and_its_partners(
        pool: WorkerPool) -> None:
    """Worker 2, of the replica on 2-3 that the Extend does not touch, stops answering for
    STALL_S (SIGSTOP: a loaded host, a long pause) as the Extend's receiver dies. Reconcile
    waits for it up to its grace: it is neither dead nor hung, and the replica on 2-3 stays
    intact, its half on worker 3 included (a 5 s ping once called it dead and dropped that
    half as an orphan)."""
    e = _extend_placed(pool, 12)
    pid = pids(pool)[2]
    stopped: list[int] = []

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "start" and not stopped:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            ray.kill(pool.actor(5), no_restart=True)

    wake = threading.Timer(STALL_S, os.kill, (pid, signal.SIGCONT))
    try:
        ex = Executor(pool, e.specs, min_timeout_s=5.0, on_event=hook)
        with pytest.raises(TransitionFailed) as info:
            wake.start()
            ex.run(e.schedule)
        rep = info.value.report
        assert rep.dead == frozenset({5}) and not rep.hung
        assert [(u.id, u.gpus) for u in rep.intact[e.stage]] == [("actor_train/0", (0, 1)),
                                                                 ("actor_train/1", (2, 3))]
        assert _held_by(pool, [2, 3]) == {2: ["actor_train/1"], 3: ["actor_train/1"]}
        check_stages(pool, e.job, rep.intact, e.seeds)
    finally:
        wake.cancel()
        if stopped:
            os.kill(pid, signal.SIGCONT)
        _restore(pool, [5])


def test_a_driver_error_mid_transition_aborts_and_reports_what_is_intact(
        pool: WorkerPool) -> None:
    """An error in the driver (not a worker's) once a primitive runs: its communicators are
    aborted, the report says what is intact and why, and recovery reaches the target."""
    e = _extend_placed(pool, 15)
    job, stage, target, schedule, specs, seeds = e.job, e.stage, e.target, e.schedule, \
        e.specs, e.seeds

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "start":
            raise RuntimeError("driver bug")

    ex = Executor(pool, specs, min_timeout_s=5.0, on_event=hook)
    with pytest.raises(TransitionFailed, match="stopped by RuntimeError: driver bug") as info:
        ex.run(schedule)
    rep = info.value.report
    assert isinstance(info.value.__cause__, RuntimeError)
    assert rep.dead == frozenset()  # the aborted calls fail, no worker died
    # the members whose abort landed first say so; a member still in its receive may see the
    # connection its aborted peer closed before its own abort lands
    errors = [err for errs in rep.failed.values() for err in errs.values()]
    assert not errors or any("aborted" in err for err in errors), rep.failed
    ext = schedule.primitives[0].primitive
    assert {d for errs in rep.failed.values() for d in errs} <= \
        {g for u in ext.inputs + ext.outputs for g in u.gpus}
    assert {e.id for e in rep.intact[stage]} >= {"actor_train/0", "actor_train/1"}
    ex.on_event = None
    rec = recover(pool, ex, job, rep, lambda ids: target)
    assert rec.restored == ()
    assert sorted(e.gpus for e in rec.units[stage]) == [(0, 1), (2, 3), (4, 5)]
    check_stages(pool, job, rec.units, seeds)


def test_an_extends_source_stays_intact_when_the_run_fails_after_it(pool: WorkerPool) -> None:
    """An Extend copies its source: a fault after it ended (here a driver error at its end
    event) reports the source intact beside the new copy, and keeps its arenas (the fault path
    had counted the source as consumed and dropped it as an orphan)."""
    e = _extend_placed(pool, 17)

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "end":
            raise RuntimeError("driver bug after the Extend")

    ex = Executor(pool, e.specs, min_timeout_s=5.0, on_event=hook)
    with pytest.raises(TransitionFailed, match="driver bug after the Extend") as info:
        ex.run(e.schedule)
    rep = info.value.report
    assert {u.id for u in rep.intact[e.stage]} == {"actor_train/0", "actor_train/1",
                                                   "actor_train/2"}
    assert not any(rep.dropped_bytes.values())
    held = _held_ids(pool)
    assert all("actor_train/0" in held[g] for g in (0, 1))
    check_stages(pool, e.job, {e.stage: rep.intact[e.stage]}, e.seeds)


# (target replicas, the renames to Φ(target)'s ids, the worker killed, the unit that stays
# intact, the unit lost): ids that shift (2 -> 0 and 0 -> 1), and one that stays (0 -> 0)
RENAME_CASES = [
    ([[4, 5], [0, 1]], {"actor_train/2": "actor_train/0", "actor_train/0": "actor_train/1"},
     4, ("actor_train/1", (0, 1)), ("actor_train/0", (4, 5))),
    ([[0, 1], [4, 5]], {"actor_train/0": "actor_train/0", "actor_train/2": "actor_train/1"},
     5, ("actor_train/0", (0, 1)), ("actor_train/1", (4, 5))),
]


@pytest.mark.parametrize("reps,renames,killed,intact,lost", RENAME_CASES)
def test_a_worker_dying_before_the_final_rename_is_a_fault_with_a_report(
        pool: WorkerPool, reps: list[list[int]], renames: dict[str, str], killed: int,
        intact: tuple[str, tuple[int, ...]], lost: tuple[str, tuple[int, ...]]) -> None:
    """Every primitive ends, then a worker dies before the rename to Φ(target)'s ids. The run
    fails with a report, not a bare error: the live workers hold their units under the new
    ids, each intact unit is listed once (a unit whose id stays was listed twice, and recovery
    then planned one GPU twice), the unit on the dead worker is lost, and recovery reaches the
    target from what is left."""
    job = cpu_job("tiny-llama", 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    current = _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3]])
    target = _one_stage_plan(job, stage, 2, 1, reps)
    schedule = plan_transition(job, current, target)
    assert schedule.renames() == renames
    specs = state_specs(job)
    seeds = stage_seeds(job, 18)
    place_plan(pool, job, current, specs, seeds)
    last = len(schedule.primitives) - 1

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "end" and index == last:  # after the last primitive, before the rename
            ray.kill(pool.actor(killed), no_restart=True)

    ex = Executor(pool, specs, min_timeout_s=5.0, on_event=hook)
    partner = 9 - killed  # the other GPU of the lost unit: 4 <-> 5
    try:
        with pytest.raises(TransitionFailed) as info:
            ex.run(schedule)
        rep = info.value.report
        assert rep.dead == frozenset({killed}) and rep.cause and not rep.failed
        assert [(u.id, u.gpus) for u in rep.intact[stage]] == [intact]
        assert [(u.id, u.gpus) for u in rep.lost] == [lost]
        assert len(rep.timings) == len(schedule.primitives)  # every primitive had completed
        held = pool.run({d: (mv.held_units, ()) for d in (0, 1, partner)})
        assert {d: sorted(h) for d, h in held.items()} == {0: [intact[0]], 1: [intact[0]],
                                                            partner: []}
        ex.on_event = None
        rec = recover(pool, ex, job, rep,
                      lambda ids: _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3]]))
        assert rec.restored == ()
        assert sorted(u.gpus for u in rec.units[stage]) == [(0, 1), (2, 3)]
        check_stages(pool, job, rec.units, seeds)
    finally:
        _restore(pool, [killed])


def test_an_emptied_worker_dying_at_the_end_does_not_fail_the_transition(
        pool: WorkerPool) -> None:
    """A source worker that the transition emptied dies once every primitive ended: it held
    no final unit, so the transition stands (its peak is left out), where reading its memory
    had failed the whole run."""
    job = cpu_job("tiny-llama", 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    current = _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3]])
    target = _one_stage_plan(job, stage, 2, 1, [[0, 1], [4, 5]])
    schedule = plan_transition(job, current, target)
    specs = state_specs(job)
    seeds = stage_seeds(job, 19)
    place_plan(pool, job, current, specs, seeds)
    last = len(schedule.primitives) - 1

    def hook(kind: str, index: int, p: Primitive) -> None:
        if kind == "end" and index == last:
            ray.kill(pool.actor(2), no_restart=True)

    try:
        report = Executor(pool, specs, min_timeout_s=5.0, on_event=hook).run(schedule)
        assert 2 not in report.peak_bytes and {0, 1, 4, 5} <= set(report.peak_bytes)
        assert sorted(u.gpus for u in report.units[stage]) == [(0, 1), (4, 5)]
        check_stages(pool, job, report.units, seeds)
    finally:
        pool.replace(2)


def test_a_driver_error_before_anything_moved_is_raised_as_it_is(pool: WorkerPool) -> None:
    e = _extend_placed(pool, 16)
    ex = Executor(pool, {}, min_timeout_s=5.0)  # no state spec: fails at the first primitive
    with pytest.raises(KeyError, match=e.stage):
        ex.run(e.schedule)
    assert sorted(_held_ids(pool)[0]) == ["actor_train/0"]


def _parked(ctx: WorkerContext) -> int:
    """Aborted groups this worker still parks (looked at without reaping: the worker's entry
    point is what must have freed them)."""
    return len(ctx.zombies)


def test_survivors_of_a_fault_free_aborted_groups_at_their_next_call(pool: WorkerPool) -> None:
    """The groups aborted when a worker dies mid-transition are freed by the survivors' next
    calls once their operations timed out, not left parked until the next abort."""
    killed = _extend_with_receiver_killed(pool, 14, timeout_s=2.0).killed
    try:
        survivors = [d for d in pool.device_ids if d not in killed]
        deadline = time.monotonic() + 60.0  # the aborted operations end by their gloo timeout
        parked = pool.run({d: (_parked, ()) for d in survivors})
        while any(parked.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            parked = pool.run({d: (_parked, ()) for d in survivors})
        assert not any(parked.values()), parked
    finally:
        _restore(pool, killed)


class _Overdue(BaseException):
    """The hang guard fired: the executor waited past any bound. Not an ``Exception``, so the
    executor's fault path does not take it for a driver error."""


@contextmanager
def _hang_guard(seconds: float) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block runs past ``seconds``; a generous
    bound, not a measurement."""

    def overdue(signum: int, frame: object) -> None:
        raise _Overdue(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, overdue)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


HANG_TIMEOUT_S = 2.0  # the communicators' timeout in the hang tests
HANG_GRACE_S = 5.0    # short enough for a test; a healthy call here returns in well under it


def _seize_lock(ctx: WorkerContext) -> None:
    """Take the worker's state lock and never give it back: the worker stays alive (its
    control threads answer) but a call that needs the lock, as a Destroy does, never returns."""
    ctx._lock.acquire()


def _stall(ctx: WorkerContext, seconds: float) -> None:
    """Occupy the worker's call thread: the calls queued behind this one never start."""
    time.sleep(seconds)


def _held_by(pool: WorkerPool, devices: Sequence[int]) -> dict[int, list[str]]:
    return {d: sorted(h) for d, h in pool.run({d: (mv.held_units, ()) for d in devices}).items()}


def test_a_worker_hung_in_a_primitive_is_stopped_and_reported(pool: WorkerPool) -> None:
    """Worker 3 hangs inside #0, the Destroy of actor_train/1 on 2-3 (no communicator, so no
    peer's timeout notices). Past #0's deadline the run fails with a cause that names #0 and
    worker 3; worker 3's process is stopped and reported dead and hung; the copy on 0-1 and
    the Extend's new one on 4-5 are reported intact and are, bitwise."""
    job = cpu_job("tiny-llama", 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    current = _one_stage_plan(job, stage, 2, 1, [[0, 1], [2, 3]])
    schedule = plan_transition(job, current, _one_stage_plan(job, stage, 2, 1, [[0, 1], [4, 5]]))
    assert [sp.op for sp in schedule.primitives] == ["Destroy", "Extend"]
    specs = state_specs(job)
    seeds = stage_seeds(job, 21)
    # placed as the schedule assumes (actor_train/1, only destroyed, offloaded): the executor
    # has nothing to move on worker 3 before #0
    place_current(pool, schedule, specs, seeds)
    pid = pids(pool)[3]
    ray.get(pool.submit_control(3, _seize_lock))
    ex = Executor(pool, specs, min_timeout_s=HANG_TIMEOUT_S, grace_s=HANG_GRACE_S)
    try:
        with _hang_guard(120.0), pytest.raises(TransitionFailed, match="3 hung") as info:
            ex.run(schedule)
        rep = info.value.report
        assert rep.cause is not None and rep.cause.startswith(
            "WorkerHung: Destroy(actor_train) #0: worker 3 did not return within its"), \
            rep.cause
        assert rep.dead == rep.hung == frozenset({3})
        assert list(rep.failed) == [0] and list(rep.failed[0]) == [3]
        assert gone([pid])
        assert [(u.id, u.gpus) for u in rep.intact[stage]] == [("actor_train/0", (0, 1)),
                                                               ("actor_train/2", (4, 5))]
        assert [u.id for u in rep.lost] == ["actor_train/1"]
        assert [t.index for t in rep.timings] == [1]
        assert _held_by(pool, [0, 1, 2, 4, 5]) == {
            0: ["actor_train/0"], 1: ["actor_train/0"], 2: [], 4: ["actor_train/2"],
            5: ["actor_train/2"]}
        check_stages(pool, job, rep.intact, seeds)
    finally:
        _restore(pool, [3])


def test_a_worker_hung_in_an_extend_is_stopped_after_its_peer_fails(pool: WorkerPool) -> None:
    """Worker 5, a receiver of the Extend, is stuck in an earlier call, so its part never
    starts. Its sender's join times out and the run takes the fault path, whose wait for
    worker 5 ends at a deadline: worker 5 is stopped and reported dead and hung, the Extend
    failed there, both replicas that were intact before are intact, and the half-made copy on
    worker 4 is dropped."""
    e = _extend_placed(pool, 22)
    pid = pids(pool)[5]
    pool.submit(5, _stall, 3600.0)
    ex = Executor(pool, e.specs, min_timeout_s=HANG_TIMEOUT_S, grace_s=HANG_GRACE_S)
    try:
        with _hang_guard(120.0), pytest.raises(TransitionFailed, match="5 hung") as info:
            ex.run(e.schedule)
        rep = info.value.report
        assert rep.dead == rep.hung == frozenset({5})
        assert rep.failed[0][5].startswith(
            "WorkerHung: Extend(actor_train) #0 did not return on worker 5 within"), rep.failed
        assert gone([pid])
        assert [(u.id, u.gpus) for u in rep.intact[e.stage]] == [("actor_train/0", (0, 1)),
                                                                 ("actor_train/1", (2, 3))]
        assert [u.id for u in rep.lost] == ["actor_train/2"]
        assert _held_by(pool, [0, 1, 2, 3, 4]) == {
            0: ["actor_train/0"], 1: ["actor_train/0"], 2: ["actor_train/1"],
            3: ["actor_train/1"], 4: []}
        check_stages(pool, e.job, rep.intact, e.seeds)
    finally:
        _restore(pool, [5])


def test_last_copy_lost_mid_transition_restores_from_the_checkpoint(pool: WorkerPool,
                                                                     tmp_path) -> None:
    job = cpu_job("tiny-qwen3", 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    current = _one_stage_plan(job, stage, 2, 2, [[0, 1, 2, 3]])
    target = _one_stage_plan(job, stage, 2, 1, [[4, 5], [2, 3]])
    schedule = plan_transition(job, current, target)
    specs = state_specs(job)
    seeds = stage_seeds(job, 12)
    units = place_plan(pool, job, current, specs, seeds)
    ck = Checkpointer(tmp_path / "ckpt")
    ck.save(pool, units, tag=1)
    killed, hook = _kill_when(pool, schedule.primitives[0].op, 0)
    ex = Executor(pool, specs, min_timeout_s=5.0, on_event=hook)
    try:
        with pytest.raises(TransitionFailed) as info:
            ex.run(schedule)
        rep = info.value.report
        assert rep.lost_stages([stage]) == (stage,)

        def target_for(ids: Sequence[int]) -> Plan:
            return _one_stage_plan(job, stage, 2, 1, [[4, 5], [2, 3]] if killed[0] < 2
                                   else [[4, 5], [0, 1]])

        rec = recover(pool, ex, job, rep, target_for, ck)
        assert rec.restored == (stage,) and rec.checkpoint is not None
        check_stages(pool, job, rec.units, seeds)
    finally:
        _restore(pool, killed)


def _step_on(ctx: WorkerContext, unit_id: str) -> None:
    """Stand-in for the steps since the checkpoint: every parameter of the unit moves."""
    for t in ctx.units[unit_id].params.values():
        t.add_(1.0)


def _actor_plan(job: JobSpec, gen: int, train: list[int]) -> Plan:
    """actor_gen (tp 1) on GPU ``gen``, actor_train (tp 2) on ``train``, the frozen reference
    model on GPU 5: the plans the rollback and rebuild tests move between."""
    return plan_of(job, {"actor_gen": (1, 1, [[gen]]), "reference_infer": (1, 1, [[5]]),
                         "actor_train": (2, 1, [train])})


def _lose(pool: WorkerPool, job: JobSpec, specs: Mapping[str, StateSpec],
          units: Mapping[str, Sequence[Emu]], worker: int, target: Plan,
          ck: Checkpointer) -> tuple[FaultReport, Recovery]:
    """Kill ``worker``, take stock of what survived and recover towards ``target``: the
    report and the recovery (the caller restores the worker)."""
    ray.kill(pool.actor(worker), no_restart=True)
    rep = reconcile(pool, [e for es in units.values() for e in es], {worker}, {})
    rec = recover(pool, Executor(pool, specs, min_timeout_s=5.0), job, rep,
                  lambda ids: target, ck)
    return rep, rec


def test_losing_training_rolls_generation_back_to_the_checkpoint(pool: WorkerPool,
                                                                 tmp_path) -> None:
    """After the checkpoint actor_gen's θ moved on (the steps since); then worker 0, half of
    actor_train's only unit, dies. Restoring actor_train alone would pair its checkpointed θ
    with generation's newer one, so recovery restores both actor stages from the checkpoint:
    every unit equals the checkpointed (seeded) state again, and the frozen reference model
    keeps its unit where it was."""
    job = cpu_job("tiny-qwen3", 6)
    _fit_pool(pool, range(6))
    current, target = _actor_plan(job, 4, [0, 1]), _actor_plan(job, 4, [2, 3])
    specs = state_specs(job)
    seeds = stage_seeds(job, 14)
    units = place_plan(pool, job, current, specs, seeds)
    ck = Checkpointer(tmp_path / "ckpt")
    ck.save(pool, units, tag=1)
    (gen,) = units["actor_gen"]
    pool.run({4: (_step_on, (gen.id,))})
    assert gather_unit(pool, gen).first_difference(
        seeded_logical(specs["actor_gen"], seeds["actor_gen"])) is not None
    try:
        rep, rec = _lose(pool, job, specs, units, 0, target, ck)
        assert rep.lost_stages(["actor_gen", "actor_train"]) == ("actor_train",)
        assert rec.rolled_back and rec.restored == ("actor_gen", "actor_train")
        assert rec.units["reference_infer"] == units["reference_infer"]
        check_stages(pool, job, rec.units, seeds)
    finally:
        _restore(pool, [0])


def test_losing_generation_rebuilds_it_from_training_without_a_rollback(pool: WorkerPool,
                                                                       tmp_path) -> None:
    """Training's θ moved on (the steps since the last weight sync); then worker 4, actor_gen's
    only unit, dies. actor_train holds the newest θ, so generation is rebuilt from it into
    its target layout (tp=1 from training's tp=2), bitwise equal to training's θ; training
    keeps its state and steps, nothing is read from a checkpoint (none was saved), and the
    scratch folder is gone after."""
    job = cpu_job("tiny-qwen3", 6)
    _fit_pool(pool, range(6))
    current, target = _actor_plan(job, 4, [0, 1]), _actor_plan(job, 2, [0, 1])
    specs = state_specs(job)
    units = place_plan(pool, job, current, specs, stage_seeds(job, 15))
    (train,) = units["actor_train"]
    pool.run({0: (_step_on, (train.id,)), 1: (_step_on, (train.id,))})
    trained = gather_unit(pool, train)
    ck = Checkpointer(tmp_path / "ckpt")
    try:
        rep, rec = _lose(pool, job, specs, units, 4, target, ck)
        assert rep.lost_stages(["actor_gen", "actor_train"]) == ("actor_gen",)
        assert rec.rebuilt == {"actor_gen": "actor_train"}
        assert rec.restored == () and not rec.rolled_back and rec.checkpoint is None
        (gen,) = rec.units["actor_gen"]
        assert gen.gpus == (2,) and (gen.layout.tp, gen.layout.pp) == (1, 1)
        got = gather_unit(pool, gen)
        theta = {k: t for k, t in trained.tensors.items() if k[0] == PARAM}
        assert got.tensors.keys() == theta.keys()
        assert all(torch.equal(got.tensors[k], t) for k, t in theta.items())
        assert got.meta == trained.meta  # the version generation now samples with
        assert gather_unit(pool, rec.units["actor_train"][0]).equal(trained)  # no rollback
        assert list((tmp_path / "ckpt").iterdir()) == []
    finally:
        _restore(pool, [4])


@pytest.mark.parametrize("model,save,load", [
    ("tiny-llama", (2, 2), [(1, 1), (1, 1)]), ("tiny-llama", (1, 1), [(4, 1), (1, 2)]),
    # saved from replicated KV heads and their biases (tp 4 over 2 KV heads), loaded without
    ("tiny-qwen2", (4, 1), [(2, 1), (1, 2)])])
def test_checkpoint_restores_into_any_layout(pool: WorkerPool, tmp_path, model: str,
                                            save: tuple[int, int],
                                            load: list[tuple[int, int]]) -> None:
    job = cpu_job(model, 6)
    stage = "actor_train"
    _fit_pool(pool, range(6))
    specs = state_specs(job)
    seeds = stage_seeds(job, 13)
    n = save[0] * save[1]
    units = place_plan(pool, job, _one_stage_plan(job, stage, *save, [list(range(n))]),
                       specs, seeds)
    ck = Checkpointer(tmp_path / "ckpt")
    where = ck.save(pool, units, tag=3)
    clear_units(pool)
    emus, first = [], 0
    for i, (tp, pp) in enumerate(load):
        gpus = tuple(range(first, first + tp * pp))
        emus.append(Emu(f"{stage}/{i}", stage, "actor", Layout(tp, pp), gpus,
                        units[stage][0].holds))
        first += tp * pp
    ck.restore(pool, stage, emus, specs[stage], where)
    check_stages(pool, job, {stage: emus}, seeds)
    # the metadata DCP writes last is what a restore needs first: without it the stage is
    # not in the checkpoint, which recover checks before it drops anything
    assert ck.holds(where, stage) and not ck.holds(where, "critic_train")
    (where / stage / DCP_METADATA).unlink()
    assert not ck.holds(where, stage)
    with pytest.raises(FileNotFoundError, match=f"no checkpoint of {stage}"):
        ck.restore(pool, stage, emus, specs[stage], where)
