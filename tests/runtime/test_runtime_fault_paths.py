"""Fault and refusal paths of the runtime, without Ray: ``recover``'s decisions (redundant
copies of another layout, a last copy lost without a checkpoint) and the executor's refusals,
its wait for memory a running primitive frees, its stall detection, and its deadlines for calls
that never return.

The pool is a stub whose workers are plain objects: ``run`` applies the real worker-side
functions the driver sends (``held_units``, ``_drop_all``, ``_rename``, ``_reset_peak``) to
them, and ``submit`` plays an Extend's or a Destroy's effect on their units (or a call that
fails, or one that never returns). The ``ray`` of the executor and of the workers module is
replaced by ``_FakeRay`` (every call has ended by the time it is waited for, except one that
never returns), so no Ray session starts.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from nereus.cost.candidate import Layout
from nereus.errors import InfeasibleError
from nereus.plan.types import Plan
from nereus.runtime import executor as executor_module
from nereus.runtime import movement as mv
from nereus.runtime import workers as workers_module
from nereus.runtime.executor import Executor, state_specs
from nereus.runtime.faults import FaultReport, TransitionFailed, _current_plan, recover
from nereus.runtime.memory import MemoryStats
from nereus.runtime.movement import MoveResult
from nereus.runtime.state import StateSpec, position_bytes
from nereus.runtime.workers import WorkerCallsFailed, WorkerHung
from nereus.spec.job import JobSpec
from nereus.transition.emu import Emu, phi
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Destroy, Extend, Merge, Primitive
from nereus.transition.schedule import Schedule

from runtime_testlib import cpu_job, plan_of

STAGE = "actor_train"
REF = "reference_infer"
GEN = "actor_gen"


# ---- stubs: workers, pool, Ray, executor, checkpointer


class _Overdue(BaseException):
    """A test ran past its deadline (a mutated stall check loops for ever). Not an
    ``Exception``: the executor's fault path must not swallow it."""


def _overdue(signum: int, frame: object) -> None:
    raise _Overdue("the test ran past its deadline")


@dataclass
class _Arena:
    nbytes: int


class _Worker:
    """What the worker-side functions touch: ``units`` (id -> arena), ``pending`` (unsettled
    Split or Merge outputs: none here), ``drop``, ``rename``, ``memory`` (``reset_peak``,
    ``stats``)."""

    def __init__(self, device_id: int, capacity: int):
        self.device_id = device_id
        self.capacity = capacity
        self.units: dict[str, _Arena] = {}
        self.offloaded: set[str] = set()  # held in host memory: not counted
        self.in_use: dict[str, str] = {}  # an engine's key -> the unit it computes on
        self.pending: dict[str, Any] = {}
        self.extra = 0  # bytes it holds beyond its units (``_Pool(bloat=...)``)
        self.peak = 0
        self.memory = SimpleNamespace(reset_peak=self.reset_peak, stats=self.stats)

    @property
    def held(self) -> int:
        return self.extra + sum(a.nbytes for u, a in self.units.items()
                                if u not in self.offloaded)

    def offload(self, unit_id: str) -> int:
        self.offloaded.add(unit_id)
        return self.units[unit_id].nbytes

    def load(self, unit_id: str) -> int:
        self.offloaded.discard(unit_id)
        self.peak = max(self.peak, self.held)
        return self.units[unit_id].nbytes

    def reset_peaks(self) -> MemoryStats:
        self.reset_peak()
        return self.stats()

    def add(self, unit_id: str, nbytes: int) -> None:
        assert unit_id not in self.units, (self.device_id, unit_id)
        self.units[unit_id] = _Arena(nbytes)
        self.peak = max(self.peak, self.held)

    def reset_peak(self) -> None:
        self.peak = self.held

    def stats(self) -> MemoryStats:
        return MemoryStats(self.held, self.peak, self.capacity)

    def drop(self, unit_id: str) -> int:
        arena = self.units.pop(unit_id, None)
        host = unit_id in self.offloaded
        self.offloaded.discard(unit_id)
        return 0 if arena is None or host else arena.nbytes

    def rename(self, mapping: Mapping[str, str], token: str) -> bool:
        moved = {new: self.units.pop(old) for old, new in mapping.items() if old in self.units}
        assert not moved.keys() & self.units.keys(), (self.device_id, mapping)
        self.units.update(moved)
        return True

    def refuse_groups(self, prefixes: Sequence[str]) -> None:
        pass  # the stub's calls hold no communicator to abort

    def abort_groups(self, names: Sequence[str] | None) -> list[str]:
        return []


class _Ref:
    """A finished call: its value, or the error it raised; or a call that never returns."""

    def __init__(self, value: Any = None, error: BaseException | None = None,
                 never: bool = False):
        self.value = value
        self.error = error
        self.never = never


class _FakeRay:
    """``ray.get`` / ``ray.wait`` on ``_Ref``s. A wait for a call that never returns sleeps
    out its timeout; without one it would wait for ever, and fails the test instead."""

    exceptions = ray.exceptions

    @staticmethod
    def get(x: Any, timeout: float | None = None) -> Any:
        if isinstance(x, list):
            return [_FakeRay.get(r) for r in x]
        assert not x.never, "a get of a call that never returns"
        if x.error is not None:
            raise x.error
        return x.value

    @staticmethod
    def wait(refs: Sequence[_Ref], num_returns: int = 1, timeout: float | None = None
             ) -> tuple[list[_Ref], list[_Ref]]:
        ready = [r for r in refs if not r.never][:num_returns]
        if len(ready) < num_returns:
            if timeout is None:
                raise _Overdue("an unbounded wait for a call that never returns")
            time.sleep(timeout)
        return ready, [r for r in refs if r not in ready]


class _Pool:
    """The ``WorkerPool`` methods ``recover`` and ``Executor`` call. ``log`` records, in
    order, what reached the workers: ("shrink", ids), ("run", {device: (function, args)}),
    ("submit", device, function), ("control", device, function), ("kill", ids). A primitive's
    call on a worker of ``hang`` never returns; on one of ``fail`` it raises. A ``run`` call on
    a worker of ``mute`` never returns: ``run`` raises as the real one does at its timeout. A
    worker of ``silent`` never answers ``memory()``."""

    def __init__(self, devices: Sequence[int], capacity: int = 1 << 40,
                 hang: Sequence[int] = (), fail: Sequence[int] = (), mute: Sequence[int] = (),
                 silent: Sequence[int] = (), bloat: Mapping[int, int] | None = None):
        self.workers = {d: _Worker(d, capacity) for d in devices}
        self.bloat = dict(bloat or {})  # device -> bytes it takes beyond each copy it receives
        self.silent = set(silent)  # their memory() never answers
        self.log: list[tuple[Any, ...]] = []
        self.hang = set(hang)
        self.fail = set(fail)
        self.mute = set(mute)
        self.killed: set[int] = set()

    def holding(self, units: Sequence[Emu], nbytes: int = 1) -> _Pool:
        """Every position of ``units`` held by its worker (``nbytes`` each)."""
        for e in units:
            for g in e.gpus:
                self.workers[g].add(e.id, nbytes)
        return self

    def held(self) -> dict[int, list[str]]:
        return {d: sorted(w.units) for d, w in self.workers.items()}

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.workers))

    def shrink(self, device_ids: Sequence[int]) -> None:
        ids = sorted(device_ids)
        self.log.append(("shrink", ids))
        for d in ids:
            self.workers.pop(d, None)

    def run(self, calls: Mapping[int, tuple[Any, tuple[Any, ...]]],
            timeout_s: float | None = None) -> dict[int, Any]:
        self.log.append(("run", {d: (fn.__name__, args) for d, (fn, args) in calls.items()}))
        mute = sorted(self.mute.intersection(calls))
        if mute and timeout_s is None:
            raise _Overdue("an unbounded wait for a worker that never answers")
        results = {d: fn(self.workers[d], *args) for d, (fn, args) in calls.items()
                   if d not in mute}
        if mute:
            raise WorkerCallsFailed({d: WorkerHung(f"worker {d} did not answer within "
                                                   f"{timeout_s} s") for d in mute}, results)
        return results

    def liveness(self, timeout_s: float = 10.0) -> tuple[set[int], set[int]]:
        return {d for d in self.workers if d in self.killed}, set()

    def kill(self, device_ids: Sequence[int]) -> None:
        self.log.append(("kill", sorted(device_ids)))
        self.killed.update(device_ids)

    def submit_control(self, d: int, fn: Any, *args: Any) -> _Ref:
        self.log.append(("control", d, fn.__name__))
        try:
            return _Ref(fn(self.workers[d], *args))
        except Exception as e:  # noqa: BLE001 - the caller's ray.get raises it
            return _Ref(error=e)

    def submit(self, d: int, fn: Any, *args: Any) -> _Ref:
        self.log.append(("submit", d, fn.__name__))
        if d in self.hang:
            return _Ref(never=True)
        if d in self.fail:
            return _Ref(error=RuntimeError(f"{fn.__name__} failed on worker {d}"))
        w = self.workers[d]
        if fn is mv.extend_member:  # (group, source id or None, new id, spec, layout, pos)
            _, src, new, spec, layout, pos = args
            if src is None:  # the receiving rank allocates the copy
                w.add(new, position_bytes(spec, *layout, *pos))
                w.extra += self.bloat.get(d, 0)
                w.peak = max(w.peak, w.held)
        elif fn is mv.merge_member:  # (source id, new id, layout, position, staged)
            src, new, layout, pos, _ = args
            w.add(new, position_bytes(_specs()[STAGE], *layout, *pos))
            w.pending[new] = (src, None, False)  # the source goes as it settles
        elif fn is mv.destroy_member:
            w.drop(args[0])
        else:
            raise AssertionError(f"the stub does not play {fn.__name__}")
        return _Ref(MoveResult(d, 0.0, 0.0, 0.0, 0, 0, w.held, w.peak))

    def actor(self, d: int) -> Any:
        w = self.workers[d]
        if d in self.silent:
            return SimpleNamespace(memory=SimpleNamespace(remote=lambda: _Ref(never=True)))
        return SimpleNamespace(memory=SimpleNamespace(remote=lambda: _Ref(w.stats())))


def _calls(pool: _Pool, kind: str) -> list[tuple[Any, ...]]:
    return [entry for entry in pool.log if entry[0] == kind]


class _StubExecutor:
    """What ``recover`` uses of an ``Executor``: ``specs``, and ``run`` (recorded in the pool's
    log; the report's units are the schedule's final ones)."""

    def __init__(self, pool: _Pool, specs: Mapping[str, Any]):
        self.pool = pool
        self.specs = dict(specs)
        self.schedules: list[Schedule] = []

    def run(self, schedule: Schedule) -> Any:
        self.pool.log.append(("transition", [sp.op for sp in schedule.primitives]))
        self.schedules.append(schedule)
        return SimpleNamespace(units={s: tuple(es) for s, es in schedule.final.items()})


class _Checkpointer:
    """Records restores; its latest checkpoint holds ``stages`` (all when None)."""

    root = "ckpt"

    def __init__(self, latest: str | None, stages: Sequence[str] | None = None):
        self._latest = latest
        self._stages = stages
        self.restored: list[tuple[str, tuple[Emu, ...], Any, str]] = []
        self.rebuilt: list[tuple[Emu, tuple[Emu, ...], Any]] = []

    def latest(self) -> str | None:
        return self._latest

    def holds(self, where: str, stage: str) -> bool:
        return where == self._latest and (self._stages is None or stage in self._stages)

    def restore(self, pool: Any, stage: str, emus: Sequence[Emu], spec: Any, where: str
                ) -> None:
        self.restored.append((stage, tuple(emus), spec, where))

    def rebuild(self, pool: Any, source: Emu, emus: Sequence[Emu], spec: Any) -> None:
        self.rebuilt.append((source, tuple(emus), spec))


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The executor and the workers module talk to ``_FakeRay``; a test that runs past 20 s
    fails instead of hanging; Ray is never started."""
    monkeypatch.setattr(executor_module, "ray", _FakeRay)
    monkeypatch.setattr(workers_module, "ray", _FakeRay)
    old = signal.signal(signal.SIGALRM, _overdue)
    signal.setitimer(signal.ITIMER_REAL, 20.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not ray.is_initialized()


# ---- jobs, plans and units


@cache
def _job(memory_mib: float | None = None) -> JobSpec:
    return cpu_job("tiny-llama", 6, memory_mib=memory_mib)


@cache
def _specs(memory_mib: float | None = None) -> dict[str, StateSpec]:
    return state_specs(_job(memory_mib))




def _units(job: JobSpec, stage: str, tp: int, pp: int, reps: Sequence[Sequence[int]],
           ids: Sequence[int] | None = None) -> tuple[Emu, ...]:
    """Φ's units of ``stage`` in that layout, numbered ``ids`` (default 0, 1, ...)."""
    es = phi(job, plan_of(job, {stage: (tp, pp, reps)}))[stage]
    if ids is None:
        return es
    return tuple(replace(e, id=f"{stage}/{i}") for e, i in zip(es, ids, strict=True))


# ---- recover


def test_recovery_keeps_the_layout_with_most_copies_and_destroys_the_other_first() -> None:
    """Worker 3 died: actor_train keeps one tp=2 unit on 0-1 and two tp=1 units on 4 and 5.
    Recovery keeps the tp=1 units (two copies beat the target's layout), drops the tp=2 unit
    from workers 0-1 before anything else, renames the kept ones to Φ(current)'s ids, and
    transitions from them alone to the target."""
    job = _job()
    tp2 = _units(job, STAGE, 2, 1, [[0, 1], [2, 3]])
    tp1 = _units(job, STAGE, 1, 1, [[4], [5]], ids=[2, 3])
    pool = _Pool(range(6)).holding([tp2[0], *tp1])
    report = FaultReport(frozenset({3}), {}, {STAGE: (tp2[0], *tp1)}, (tp2[1],))
    target = plan_of(job, {STAGE: (2, 1, [[0, 1], [4, 5]])})
    asked: list[tuple[int, ...]] = []

    def target_for(ids: Sequence[int]) -> Plan:
        asked.append(tuple(ids))
        return target

    ex = _StubExecutor(pool, _specs())
    rec = recover(pool, ex, job, report, target_for)

    assert asked == [(0, 1, 2, 4, 5)]
    assert rec.destroyed == ("actor_train/0",)
    assert [entry[0] for entry in pool.log] == ["shrink", "run", "run", "transition"]
    assert pool.log[0] == ("shrink", [3])
    assert pool.log[1] == ("run", {0: ("_drop_all", (["actor_train/0"],)),
                                   1: ("_drop_all", (["actor_train/0"],))})
    renames = {d: (fn, args[0]) for d, (fn, args) in pool.log[2][1].items()}
    assert renames == {4: ("_rename", {"actor_train/2": "actor_train/0"}),
                       5: ("_rename", {"actor_train/3": "actor_train/1"})}
    assert pool.held() == {0: [], 1: [], 2: [], 4: ["actor_train/0"], 5: ["actor_train/1"]}
    # the transition starts from the kept tp=1 units only, under their new ids
    (schedule,) = ex.schedules
    assert [(e.id, e.layout, e.gpus) for e in schedule.initial[STAGE]] == \
        [("actor_train/0", Layout(1, 1), (4,)), ("actor_train/1", Layout(1, 1), (5,))]
    assert rec.plan == target and rec.restored == () and rec.checkpoint is None
    assert sorted(e.gpus for e in rec.units[STAGE]) == [(0, 1), (4, 5)]


def test_current_plan_breaks_a_tie_of_copies_by_the_targets_layout() -> None:
    """One copy each of tp=2 (0-1) and tp=1 (2): the target's layout (tp=1) is kept, though
    the other is larger; the tp=2 unit is returned to be destroyed."""
    job = _job()
    big = _units(job, STAGE, 2, 1, [[0, 1]])[0]
    small = _units(job, STAGE, 1, 1, [[2]], ids=[1])[0]
    target = plan_of(job, {STAGE: (1, 1, [[2], [3]])})
    current, extra = _current_plan(job, {STAGE: (big, small)}, target)
    (sp,) = current.stages
    assert (sp.stage, sp.layout, sp.replicas) == (STAGE, Layout(1, 1), ((2,),))
    assert extra == [big]


def _two_stages_with_ref_lost() -> tuple[JobSpec, _Pool, FaultReport, Plan]:
    """actor_train's unit on 0-1 is intact; reference_infer's only unit was on worker 2,
    which died."""
    job = _job()
    actor = _units(job, STAGE, 2, 1, [[0, 1]])
    ref = _units(job, REF, 1, 1, [[2]])
    pool = _Pool(range(6)).holding(actor)
    report = FaultReport(frozenset({2}), {}, {STAGE: actor}, ref)
    target = plan_of(job, {STAGE: (2, 1, [[0, 1]]), REF: (1, 1, [[3]])})
    return job, pool, report, target


def test_recovery_refuses_a_lost_last_copy_without_a_checkpointer() -> None:
    job, pool, report, target = _two_stages_with_ref_lost()
    ex = _StubExecutor(pool, _specs())
    with pytest.raises(RuntimeError) as info:
        recover(pool, ex, job, report, lambda ids: target)
    assert str(info.value) == ("cannot restore reference_infer (no copy survived): no "
                               "checkpoint is configured")
    assert ex.schedules == []  # refused before any transition
    assert pool.log == [("shrink", [2])]
    assert pool.held()[0] == ["actor_train/0"]


def test_recovery_refuses_a_lost_last_copy_when_no_checkpoint_was_saved() -> None:
    job, pool, report, target = _two_stages_with_ref_lost()
    ck = _Checkpointer(latest=None)
    with pytest.raises(RuntimeError) as info:
        recover(pool, _StubExecutor(pool, _specs()), job, report,
                lambda ids: target, ck)
    assert str(info.value) == ("cannot restore reference_infer (no copy survived): no "
                               "checkpoint was saved under ckpt")
    assert ck.restored == []
    assert pool.log == [("shrink", [2])]  # refused before anything was dropped or moved


def test_recovery_restores_a_lost_last_copy_into_its_target_layout() -> None:
    """The counterpart of the two refusals: with a saved checkpoint, the lost stage (only it)
    is restored into Φ(target)'s units, with its own state spec."""
    job, pool, report, target = _two_stages_with_ref_lost()
    ck = _Checkpointer(latest="ckpt/step-3")
    specs = {STAGE: "actor spec", REF: "ref spec"}
    rec = recover(pool, _StubExecutor(pool, specs), job, report,
                  lambda ids: target, ck)
    want = phi(job, target)[REF]
    assert ck.restored == [(REF, want, "ref spec", "ckpt/step-3")]
    assert rec.restored == (REF,) and rec.checkpoint == "ckpt/step-3"
    assert rec.units[REF] == want and rec.transition is None
    assert not rec.rolled_back  # a frozen model's weights: the intact actor stays


def _actor_train_lost() -> tuple[JobSpec, _Pool, FaultReport, Plan, tuple[Emu, ...]]:
    """actor_train's only unit was on workers 2-3, which died; actor_gen (the same trained
    model's generation copy, on 0) and reference_infer (frozen, on 1) are intact."""
    job = _job()
    gen = _units(job, GEN, 1, 1, [[0]])
    ref = _units(job, REF, 1, 1, [[1]])
    train = _units(job, STAGE, 2, 1, [[2, 3]])
    pool = _Pool(range(6)).holding(gen + ref)
    report = FaultReport(frozenset({2, 3}), {}, {GEN: gen, REF: ref}, train)
    target = plan_of(job, {GEN: (1, 1, [[0]]), REF: (1, 1, [[1]]),
                           STAGE: (2, 1, [[4, 5]])})
    return job, pool, report, target, gen


def test_losing_a_trained_models_last_copy_rolls_every_trained_stage_back() -> None:
    """actor_gen survived, but it holds a newer θ than the checkpoint actor_train comes back
    from: generation would sample with a policy training has not got. So the job rolls back:
    actor_gen's intact unit is dropped and both actor stages are restored from the same
    checkpoint; the frozen reference keeps its unit."""
    job, pool, report, target, gen = _actor_train_lost()
    ck = _Checkpointer(latest="ckpt/step-3")
    rec = recover(pool, _StubExecutor(pool, _specs()), job, report, lambda ids: target, ck)
    want = phi(job, target)
    assert [(s, u) for s, u, _, _ in ck.restored] == [(GEN, want[GEN]), (STAGE, want[STAGE])]
    assert rec.rolled_back and rec.restored == (GEN, STAGE)
    assert rec.destroyed == tuple(e.id for e in gen)
    assert pool.held()[0] == [] and pool.held()[1] == [REF + "/0"]
    assert rec.units[GEN] == want[GEN] and rec.units[STAGE] == want[STAGE]


def _actor_gen_lost() -> tuple[JobSpec, _Pool, FaultReport, Plan, tuple[Emu, ...]]:
    """actor_gen's only unit was on worker 0, which died; actor_train (the stage training the
    same model, on 2-3) and reference_infer (frozen, on 1) are intact."""
    job = _job()
    gen = _units(job, GEN, 1, 1, [[0]])
    ref = _units(job, REF, 1, 1, [[1]])
    train = _units(job, STAGE, 2, 1, [[2, 3]])
    pool = _Pool(range(6)).holding(train + ref)
    report = FaultReport(frozenset({0}), {}, {STAGE: train, REF: ref}, gen)
    target = plan_of(job, {GEN: (1, 1, [[4]]), REF: (1, 1, [[1]]),
                           STAGE: (2, 1, [[2, 3]])})
    return job, pool, report, target, train


def test_losing_a_copy_of_theta_rebuilds_it_from_the_training_stage() -> None:
    """Generation's last copy is gone but actor_train holds the newest θ: generation is
    rebuilt from it into its target unit (what the next weight sync would give it), nothing is
    read from the checkpoint and nothing rolls back; with no checkpointer to go through, the
    rebuild is refused before anything moves."""
    job, pool, report, target, train = _actor_gen_lost()
    ck = _Checkpointer(latest=None)  # no checkpoint saved: none is needed
    specs = {STAGE: "actor spec", REF: "ref spec", GEN: "gen spec"}
    rec = recover(pool, _StubExecutor(pool, specs), job, report, lambda ids: target, ck)
    want = phi(job, target)
    assert ck.restored == [] and ck.rebuilt == [(train[0], want[GEN], "gen spec")]
    assert rec.rebuilt == {GEN: STAGE} and rec.restored == () and not rec.rolled_back
    assert rec.units[GEN] == want[GEN] and rec.destroyed == ()
    job, pool, report, target, _ = _actor_gen_lost()
    with pytest.raises(RuntimeError) as info:
        recover(pool, _StubExecutor(pool, specs), job, report, lambda ids: target)
    assert str(info.value) == ("cannot rebuild actor_gen from actor_train (no copy survived): "
                               "no checkpoint folder is configured, and the rebuild goes "
                               "through it")
    assert pool.log == [("shrink", [0])]


def test_a_rollback_is_refused_before_anything_moves_when_the_checkpoint_lacks_a_stage(
) -> None:
    """The checkpoint holds actor_train but not actor_gen: rolling back would leave
    generation without θ, so nothing is dropped (actor_gen's newer copy stays) and the error
    names the missing stage."""
    job, pool, report, target, _ = _actor_train_lost()
    ck = _Checkpointer(latest="ckpt/step-3", stages=[STAGE, REF])
    with pytest.raises(RuntimeError) as info:
        recover(pool, _StubExecutor(pool, _specs()), job, report, lambda ids: target, ck)
    assert str(info.value) == (
        "cannot restore actor_gen, actor_train (a training stage's last copy is lost, so every "
        "trained model's stage rolls back to the checkpoint): the checkpoint ckpt/step-3 "
        "holds no actor_gen")
    assert ck.restored == [] and pool.log == [("shrink", [2, 3])]
    assert pool.held()[0] == [GEN + "/0"]


# ---- Executor: refusals before anything moves


def _extend_schedule() -> tuple[Schedule, tuple[Emu, ...]]:
    """One Extend: actor_train's tp=2 unit on 0-1 gets a copy on 2-3."""
    job = _job()
    schedule = plan_transition(job, plan_of(job, {STAGE: (2, 1, [[0, 1]])}),
                               plan_of(job, {STAGE: (2, 1, [[0, 1], [2, 3]])}))
    assert [sp.op for sp in schedule.primitives] == ["Extend"]
    return schedule, schedule.initial[STAGE]


def test_executor_refuses_an_infeasible_schedule_before_touching_a_worker() -> None:
    job = _job(memory_mib=0.5)
    schedule = plan_transition(job, plan_of(job, {STAGE: (2, 1, [[0, 1]])}),
                               plan_of(job, {STAGE: (1, 1, [[0], [1]])}))
    assert not schedule.feasible and "GPUs 0-1" in schedule.reason
    pool = _Pool(range(6)).holding(schedule.initial[STAGE])
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs(0.5)).run(schedule)
    assert str(info.value) == f"transition: {schedule.reason}"
    assert pool.log == []


def test_executor_refuses_a_schedule_with_devices_the_pool_lacks() -> None:
    schedule, initial = _extend_schedule()
    pool = _Pool([0, 1]).holding(initial)
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs()).run(schedule)
    assert str(info.value) == "transition: no worker for devices [2, 3]; grow the pool"
    assert pool.log == []


def test_executor_refuses_when_a_worker_lacks_an_input_unit() -> None:
    """Worker 1 lost its half of actor_train/0 (it holds another unit): refused after asking
    the input workers what they hold, before any primitive or memory reset."""
    schedule, initial = _extend_schedule()
    pool = _Pool(range(4)).holding(initial)
    pool.workers[1].units = {"actor_train/9": _Arena(1)}
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs()).run(schedule)
    assert str(info.value) == "transition: worker 1 does not hold ['actor_train/0']"
    assert pool.log == [("run", {0: ("held_units", ()), 1: ("held_units", ())})]


def test_executor_refuses_an_input_missing_from_the_initial_collection() -> None:
    schedule, initial = _extend_schedule()
    pool = _Pool(range(4)).holding(initial)
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs()).run(replace(schedule, initial={}))
    assert str(info.value) == ("transition: Extend needs unit actor_train/0, which the "
                               "schedule's initial collection lacks")
    assert pool.log == []


# ---- Executor: waiting for memory, stalls


def _schedule(prims: Sequence[tuple[Primitive, tuple[int, ...]]],
              initial: Sequence[Emu], final: Sequence[Emu]) -> Schedule:
    """A hand-made schedule of actor_train (primitive, deps); the rest borrowed from a real
    one."""
    base, _ = _extend_schedule()
    sp0 = base.primitives[0]
    return replace(base, primitives=tuple(replace(sp0, index=i, primitive=p, deps=d,
                                                  resource_deps=())
                                          for i, (p, d) in enumerate(prims)),
                   initial={STAGE: tuple(initial)}, final={STAGE: tuple(final)}, memory={})


def _three_tp1_units() -> tuple[tuple[Emu, ...], Extend, Extend, Destroy, int]:
    """tp=1 units of actor_train on workers 0, 1 and 2; Extends of the first to 3 and of the
    second to 2, the Destroy of the third; the bytes of one unit."""
    u = _units(_job(), STAGE, 1, 1, [[0], [1], [2]])
    to3 = Extend.of(u[0], (3,), "actor_train/3")
    to2 = Extend.of(u[1], (2,), "actor_train/4")
    return u, to3, to2, Destroy(u[2]), position_bytes(_specs()[STAGE], 1, 1, 0, 0)


def _tight_pool(units: Sequence[Emu], size: int) -> _Pool:
    """Workers 0-3 with room for one unit and a half; ``units`` placed."""
    return _Pool(range(4), capacity=size + size // 2).holding(units, size)


def _recorder() -> tuple[list[tuple[str, int]], Any]:
    events: list[tuple[str, int]] = []

    def hook(kind: str, index: int, p: Primitive) -> None:
        events.append((kind, index))

    return events, hook


def test_executor_waits_for_a_running_primitive_before_a_memory_refusal() -> None:
    """#2 (Extend onto worker 2) is ready at once but worker 2 is full: #0 reads worker 2's
    unit (so it is loaded), and #1 (its Destroy) waits for #0. The executor waits instead of
    refusing (its turn on worker 2 comes after #0 and #1): #1 frees worker 2, then #2 runs;
    worker 2 never holds two units."""
    u, _, to2, _, size = _three_tp1_units()
    from3 = Extend.of(u[2], (3,), "actor_train/3")
    schedule = _schedule([(from3, ()), (Destroy(u[2]), (0,)), (to2, ())], u,
                         [u[0], u[1], from3.output, to2.output])
    pool = _tight_pool(u, size)
    events, hook = _recorder()
    report = Executor(pool, _specs(), on_event=hook).run(schedule)
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1),
                      ("start", 2), ("end", 2)]
    assert [(d, fn) for _, d, fn in _calls(pool, "submit")] == [
        (2, "extend_member"), (3, "extend_member"), (2, "destroy_member"),
        (1, "extend_member"), (2, "extend_member")]
    assert report.peak_bytes == {1: size, 2: size, 3: size}  # worker 0's unit: offloaded
    assert report.within_capacity()
    assert pool.held() == {0: ["actor_train/0"], 1: ["actor_train/1"], 2: ["actor_train/3"],
                           3: ["actor_train/2"]}


def test_executor_refuses_memory_before_anything_moves_where_nothing_frees_it() -> None:
    """The same without the Destroy: worker 2 keeps the unit #0 reads, and #1 needs a second
    unit's bytes there. The preflight replays each worker's primitives in the schedule's
    order and refuses #1 before any call: the error names worker 2 and the bytes short."""
    u, _, to2, _, size = _three_tp1_units()
    from3 = Extend.of(u[2], (3,), "actor_train/3")
    schedule = _schedule([(from3, ()), (to2, ())], u, [*u, from3.output, to2.output])
    pool = _tight_pool(u, size)
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs()).run(schedule)
    assert str(info.value) == (
        f"transition: Extend(actor_train) needs more memory than workers [2] have free "
        f"(2: {size} > {size // 2}), when its turn comes (#1; nothing has moved)")
    assert _calls(pool, "submit") == []
    assert all(not w.offloaded for w in pool.workers.values())  # residency left as it was


def _extend_beside_ref(worker: int) -> tuple[tuple[Emu, ...], tuple[Emu, ...], Schedule, int]:
    """The three tp=1 units' Extend onto worker 3, with an unchanged stage's unit on
    ``worker``: (units, that unit, schedule, unit bytes)."""
    u, to3, _, _, size = _three_tp1_units()
    ref = _units(_job(), REF, 1, 1, [[worker]])
    schedule = _schedule([(to3, ())], u, [*u, to3.output])
    return u, ref, replace(schedule, initial={**schedule.initial, REF: ref}), size


def test_a_worker_the_transition_does_not_touch_is_left_alone() -> None:
    """Worker 5 holds only a unit of a stage that does not change, and is stuck in a call:
    the transition, which runs nowhere near it, runs, and worker 5's unit stays resident
    (before, every worker holding a current unit was asked to offload it, and the stuck one
    failed the transition before it began)."""
    u, ref, schedule, size = _extend_beside_ref(5)
    pool = _Pool(range(6), mute=[5]).holding([*u, *ref], size)
    report = Executor(pool, _specs()).run(schedule)
    assert report.units[STAGE][-1].gpus == (3,)
    assert not pool.workers[5].offloaded and ref[0].id in pool.workers[5].units


def test_a_unit_an_engine_computes_on_is_not_offloaded_under_it() -> None:
    """Worker 0, the source of the Extend, also holds a unit of a stage that does not
    change, which the planner takes as offloaded at the boundary, while an engine computes
    on it: refused in one line before anything changes, not offloaded under the engine's
    views."""
    u, ref, schedule, size = _extend_beside_ref(0)
    pool = _Pool(range(4)).holding([*u, *ref], size)
    pool.workers[0].in_use["ref-engine"] = ref[0].id
    with pytest.raises(InfeasibleError) as info:
        Executor(pool, _specs()).run(schedule)
    assert str(info.value) == (
        f"transition: it holds idle state offloaded, and an engine computes on worker 0's "
        f"{ref[0].id} (detach it first)")
    assert _calls(pool, "submit") == []
    assert all(not w.offloaded for w in pool.workers.values())


def test_executor_refuses_memory_once_nothing_runs_that_could_free_it() -> None:
    """Worker 2 takes more than the copy it receives in #0 (another allocation, which the
    preflight could not foresee): after #1 frees that copy, #2 does not fit, nothing runs
    that could free it, and the run fails with a report whose cause names worker 2 and the
    bytes short."""
    u, _, to2, _, size = _three_tp1_units()
    to2_first = Extend.of(u[0], (2,), "actor_train/3")
    schedule = _schedule([(to2_first, ()), (Destroy(to2_first.output), (0,)), (to2, ())], u,
                         [*u, to2.output])
    pool = _Pool(range(4), capacity=size + size // 2, bloat={2: size // 2 + 1}).holding(
        u, size)
    events, hook = _recorder()
    with pytest.raises(TransitionFailed) as info:
        Executor(pool, _specs(), on_event=hook).run(schedule, rename=False)
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]
    rep = info.value.report
    assert rep.cause == (f"InfeasibleError: transition: Extend(actor_train) needs more memory "
                         f"than workers [2] have free (2: {size} > {size - 1})")
    assert [t.index for t in rep.timings] == [0, 1]
    assert {e.id for e in rep.intact[STAGE]} == {"actor_train/0", "actor_train/1",
                                                 "actor_train/2"}


def test_executor_runs_each_workers_primitives_in_the_schedules_order() -> None:
    """#1 merges two tp=1 units on workers 0-1 (both held until it settles), #2 extends a
    tp=2 unit onto 0-1; the planner ran the Merge first, which fits (a unit and a half at its
    peak, half a unit after). #1 waits for #0 on other workers, #2 is ready at once: started
    as soon as its dependencies ended, #2 took half a unit on 0-1 first and the Merge no
    longer fit; the executor keeps each worker's primitives in the schedule's order, so #2
    waits for #1, and the run ends within capacity."""
    job = _job()
    u = _units(job, STAGE, 1, 1, [[0], [1], [4]])
    v = _units(job, STAGE, 2, 1, [[2, 3]], ids=[3])[0]
    merge = Merge.of(u[:2], Layout(2, 1), "actor_train/4")
    aside = Extend.of(u[2], (5,), "actor_train/5")
    onto = Extend.of(v, (0, 1), "actor_train/6")
    schedule = _schedule([(aside, ()), (merge, (0,)), (onto, ())], [*u, v],
                         [merge.output, u[2], aside.output, v, onto.output])
    spec = _specs()[STAGE]
    full, half = (position_bytes(spec, 1, 1, 0, 0), position_bytes(spec, 2, 1, 0, 0))
    pool = _Pool(range(6), capacity=full + half).holding(u, full).holding([v], half)
    events, hook = _recorder()
    report = Executor(pool, _specs(), on_event=hook).run(schedule, rename=False)
    assert events.index(("end", 1)) < events.index(("start", 2)), events
    assert report.within_capacity(), (report.peak_bytes, report.capacity_bytes)
    assert report.peak_bytes[0] == full + half and pool.workers[0].held == 2 * half


def test_executor_reports_a_stall_before_anything_moved_as_it_is() -> None:
    """A primitive that waits on itself can never start: a plain error, nothing launched."""
    u, to3, _, _, size = _three_tp1_units()
    schedule = _schedule([(to3, (0,))], u[:1], [u[0], to3.output])
    pool = _tight_pool(u[:1], size)
    with pytest.raises(RuntimeError) as info:
        Executor(pool, _specs()).run(schedule)
    assert type(info.value) is RuntimeError
    assert str(info.value) == "executor stalled: primitives wait on unmet dependencies"
    assert _calls(pool, "submit") == []


def test_executor_reports_a_stall_after_progress_as_a_fault() -> None:
    """#0 runs; #1 waits on itself: the run stops with a report (cause: the stall) that
    lists #0 as done and its copy as intact."""
    u, to3, to2, _, size = _three_tp1_units()
    schedule = _schedule([(to3, ()), (to2, (1,))], u[:2], [u[0], u[1], to3.output,
                                                           to2.output])
    pool = _Pool(range(4)).holding(u[:2], size)
    events, hook = _recorder()
    with pytest.raises(TransitionFailed) as info:
        Executor(pool, _specs(), on_event=hook).run(schedule)
    assert events == [("start", 0), ("end", 0)]
    rep = info.value.report
    assert rep.cause == ("RuntimeError: executor stalled: primitives wait on unmet "
                         "dependencies")
    assert [t.index for t in rep.timings] == [0] and not rep.failed and not rep.dead
    assert {e.id for e in rep.intact[STAGE]} == {"actor_train/0", "actor_train/1",
                                                 "actor_train/3"}


# ---- Executor: calls that never return (a hung worker)

TINY_S = 0.05  # the communicators' timeout and the grace: the stub's calls end at once or never


def test_executor_gives_up_on_a_call_past_its_deadline_and_stops_its_worker() -> None:
    """Worker 2 hangs in #1 (a Destroy: no communicator whose timeout would fail a peer).
    Past the deadline the run stops with a cause that names #1 and worker 2; worker 2 is
    stopped before anything else is asked of the workers, and reported dead and hung; every
    unit elsewhere is intact, the Extend that ended included."""
    u, to3, _, destroy, size = _three_tp1_units()
    schedule = _schedule([(to3, ()), (destroy, ())], u, [u[0], u[1], to3.output])
    pool = _Pool(range(4), hang=[2]).holding(u, size)
    events, hook = _recorder()
    ex = Executor(pool, _specs(), min_timeout_s=TINY_S, grace_s=TINY_S, on_event=hook)
    with pytest.raises(TransitionFailed, match=r"2 hung: a call never returned") as info:
        ex.run(schedule)
    rep = info.value.report
    due = f"within its {TINY_S:.6g} s timeout \\+ {TINY_S:g} s grace"
    assert rep.cause is not None
    assert re.fullmatch(f"WorkerHung: Destroy\\(actor_train\\) #1: worker 2 did not return "
                        f"{due}", rep.cause), rep.cause
    assert isinstance(info.value.__cause__, WorkerHung)
    assert events == [("start", 0), ("start", 1), ("end", 0)]
    assert rep.dead == rep.hung == frozenset({2})
    assert list(rep.failed) == [1] and list(rep.failed[1]) == [2]
    assert re.fullmatch(f"WorkerHung: Destroy\\(actor_train\\) #1 did not return on worker 2 "
                        f"{due}", rep.failed[1][2]), rep.failed[1][2]
    assert [t.index for t in rep.timings] == [0]
    assert {e.id for e in rep.intact[STAGE]} == {"actor_train/0", "actor_train/1",
                                                 "actor_train/3"}
    assert [e.id for e in rep.lost] == ["actor_train/2"]
    # stopped first; nothing is asked of it afterwards
    after = pool.log[pool.log.index(("kill", [2])):]
    assert [entry[0] for entry in after] == ["kill", "run"]
    assert sorted(after[1][1]) == [0, 1, 3]
    assert pool.held() == {0: ["actor_train/0"], 1: ["actor_train/1"], 2: ["actor_train/2"],
                           3: ["actor_train/3"]}


def test_executor_bounds_its_wait_for_running_calls_after_a_fault() -> None:
    """The Extend fails on worker 3 while a Destroy runs on worker 2 and never returns: the
    fault path aborts the Extend's communicators, waits for the Destroy until its deadline
    only, then stops worker 2 as hung. The Extend's source stays intact; its copy does not."""
    u, to3, _, destroy, size = _three_tp1_units()
    schedule = _schedule([(to3, ()), (destroy, ())], u, [u[0], u[1], to3.output])
    pool = _Pool(range(4), hang=[2], fail=[3]).holding(u, size)
    ex = Executor(pool, _specs(), min_timeout_s=TINY_S, grace_s=TINY_S)
    with pytest.raises(TransitionFailed) as info:
        ex.run(schedule)
    rep = info.value.report
    assert rep.cause is None
    assert rep.dead == rep.hung == frozenset({2})
    assert rep.failed == {0: {3: "RuntimeError: extend_member failed on worker 3"},
                          1: {2: rep.failed[1][2]}}
    assert rep.failed[1][2].startswith("WorkerHung: Destroy(actor_train) #1 did not return "
                                       "on worker 2")
    assert sorted((d, fn) for kind, d, fn in _calls(pool, "control") if fn == "_abort_all") \
        == [(0, "_abort_all"), (3, "_abort_all")]
    assert _calls(pool, "kill") == [("kill", [2])]
    assert {e.id for e in rep.intact[STAGE]} == {"actor_train/0", "actor_train/1"}
    assert [e.id for e in rep.lost] == ["actor_train/2", "actor_train/3"]
    assert rep.timings == ()


def test_a_stuck_worker_that_holds_nothing_after_the_move_is_stopped() -> None:
    """The Destroy emptied worker 2, which then does not answer for its peak: the transition
    stands (it holds no unit of the target) and the stuck worker is stopped, so the next call
    to it fails at once rather than queueing behind the stuck one."""
    u, _, _, destroy, size = _three_tp1_units()
    schedule = _schedule([(destroy, ())], u, u[:2])
    pool = _Pool(range(4), silent=[2]).holding(u, size)
    report = Executor(pool, _specs(), min_timeout_s=TINY_S, grace_s=TINY_S).run(schedule)
    assert {e.id for e in report.units[STAGE]} == {"actor_train/0", "actor_train/1"}
    assert 2 not in report.peak_bytes and report.stopped == (2,)
    assert _calls(pool, "kill") == [("kill", [2])]


def test_a_worker_whose_rename_never_returns_is_stopped_and_the_rest_renamed() -> None:
    """Every primitive ended; worker 3's rename (of the Extend's copy to Φ(target)'s id) does
    not return in time. The run fails with a report, bounded: worker 3 is stopped, not asked
    again, and reported dead and hung; the units elsewhere are intact, the copy on 3 lost."""
    u, to3, _, _, size = _three_tp1_units()
    schedule = _schedule([(to3, ())], u[:2], [u[0], u[1], to3.output])
    assert {a: b for a, b in schedule.renames().items() if a != b} == \
        {"actor_train/3": "actor_train/2"}
    pool = _Pool(range(4), mute=[3]).holding(u[:2], size)
    ex = Executor(pool, _specs(), min_timeout_s=TINY_S, grace_s=TINY_S)
    with pytest.raises(TransitionFailed, match="3 hung") as info:
        ex.run(schedule)
    rep = info.value.report
    assert rep.cause == (f"WorkerCallsFailed: 1 worker call(s) failed; worker 3: WorkerHung: "
                         f"worker 3 did not answer within {TINY_S} s")
    assert rep.dead == rep.hung == frozenset({3})
    assert [d for kind, calls in _calls(pool, "run") for d, (fn, _) in calls.items()
            if fn == "_rename"] == [3]  # asked once
    assert _calls(pool, "kill") == [("kill", [3])]
    assert {e.id for e in rep.intact[STAGE]} == {"actor_train/0", "actor_train/1"}
    assert [(e.id, e.gpus) for e in rep.lost] == [("actor_train/2", (3,))]
    assert [t.index for t in rep.timings] == [0]


def test_a_target_that_leaves_out_a_held_stage_is_refused_before_anything_moves() -> None:
    """actor_train lost its last copy and the target placed actor_train and the reference
    only: actor_train alone was restored, and actor_gen's newer unit stayed on worker 0
    outside any plan (a reviewer's case); with actor_train left out, nothing rolled back."""
    job, pool, report, _, _ = _actor_train_lost()
    ck = _Checkpointer(latest="ckpt/step-3")
    for target in (plan_of(job, {REF: (1, 1, [[1]]), STAGE: (2, 1, [[4, 5]])}),
                   plan_of(job, {GEN: (1, 1, [[0]]), REF: (1, 1, [[1]])})):
        with pytest.raises(RuntimeError) as info:
            recover(pool, _StubExecutor(pool, _specs()), job, report,
                    lambda ids, target=target: target, ck)
        left = sorted({GEN, REF, STAGE} - set(target.names))
        assert str(info.value).startswith(f"the target plan places no {left[0]}, which the "
                                          "job holds"), info.value
        assert ck.restored == [] and pool.held()[0] == [GEN + "/0"]
