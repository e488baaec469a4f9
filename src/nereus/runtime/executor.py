"""Runs a transition ``Schedule`` on the workers: real data movement, measured per primitive.

The schedule (``nereus.transition.schedule``) gives the primitives, their dependencies and the
estimated times. The executor starts a primitive when its dependencies have ended, every
primitive before it in the schedule's order that shares a worker with it has ended, and every
worker it touches has the bytes it will allocate (checked against the worker's capacity with
the bytes it holds now); primitives on disjoint workers run at the same time. The schedule's
indices follow its planned start times and its primitives on one GPU never overlap, so each
worker runs its primitives in the planner's order, one at a time: its bytes step through the
same values as the planner's timeline of that GPU (from the bytes it holds at the start), and a
primitive never finds less memory free than the planner gave it. (Started as soon as its
dependencies ended, one could run ahead and take memory the timeline gave an earlier one: an
Extend onto a GPU before the Split the planner ran there first, which then did not fit.)

Before anything moves, the current units are held as the planner assumed
(``nereus.runtime.residency``: read ones on their devices, at the start or loaded by their
first reader; the others offloaded to host memory), and a preflight replays each worker's
primitives in that order with the bytes the memory check will ask (``need_bytes``,
``held_change``) from what the worker holds then, another model-stage's state included:
a transition that would be refused part-way is refused before it starts, naming the
primitive and the workers short. Each primitive's measured start, end, communicator set-up
and bytes are reported in the schedule's shape (same index), so the transition cost model can be
calibrated against them. At the end, units are renamed to the ids Φ(target) gives them, so the
next transition's Φ(current) finds them.

If a worker dies or a primitive fails, the executor stops starting primitives, aborts the
communicators of primitives that include a failed or dead worker (by name, and by instance for
calls that have not joined yet), then closes the rendezvous, waits for the others, reconciles
what the live workers hold, and raises ``TransitionFailed`` with a ``FaultReport`` of the
intact units (``nereus.runtime.faults``). A worker that dies during the final rename takes the
same path: the live workers finish the rename (each applies it once, so a swap of ids is never
undone), and the report lists the final units under their new ids (under their old ones
where no live worker could rename them). A worker that dies after the rename fails the
transition only if it holds a final unit. An error in the driver itself once the first
primitive has started (a failed launch, a memory check that no longer passes, an interrupt)
takes the same path with every running communicator aborted, the error as the report's
``cause``: state has moved by then, and the caller needs to know what is intact. Before that,
nothing has moved and the error is raised as it is.

No wait on a worker is unbounded, since a worker may hang: alive, its control threads
answering, but a call that never returns. Each primitive's calls are due by a deadline, its
communicators' timeout plus ``grace_s`` from its start; a call still running then fails as
hung (``WorkerHung``), and the run takes the fault path with a cause that names the primitive
and its hung workers. There, an aborted call returns at once, so its deadline becomes
``grace_s`` after the abort; calls still running at their deadline are given up on, and
``reconcile`` stops their workers (``WorkerPool.kill``) and reports them dead and hung. Short
calls (memory, listings, aborts, the rename) get ``grace_s`` each.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from nereus.errors import InfeasibleError
from nereus.runtime import movement as mv
from nereus.runtime.comm import GroupSpec, Rendezvous, _abort_all
from nereus.runtime.faults import FaultReport, TransitionFailed, reconcile
from nereus.runtime.memory import MemoryStats
from nereus.runtime.primitives import (
    PrimitiveTiming,
    fit_bucket,
    held_change,
    launch,
    need_bytes,
    settle_calls,
    workers_of,
)
from nereus.runtime.residency import Residency, residency
from nereus.runtime.state import StateSpec
from nereus.runtime.workers import (
    GRACE_S,
    WorkerCallsFailed,
    WorkerHung,
    WorkerPool,
    is_actor_death,
    wait_each,
)
from nereus.transition.emu import Emu
from nereus.transition.primitives import Primitive
from nereus.transition.schedule import Schedule

log = logging.getLogger(__name__)
EventHook = Callable[[str, int, Primitive], None]
SLOW_BW = 50e6  # bytes/s: the slowest transfer rate a live worker is assumed to reach


@dataclass(frozen=True)
class ExecutionReport:
    """What a transition did, measured. ``timings[k]`` is schedule primitive k."""

    timings: tuple[PrimitiveTiming, ...]
    wall_s: float
    units: Mapping[str, tuple[Emu, ...]]
    peak_bytes: Mapping[int, int]
    capacity_bytes: Mapping[int, int]
    estimated_s: float
    source: str = "measured"
    # workers that held no unit of the target and did not answer afterwards: stopped (their
    # slots stay, as a dead worker's do, until the caller shrinks or replaces them)
    stopped: tuple[int, ...] = ()
    # ``peak_bytes`` is counted (the runtime's byte counter: arenas and buffers it reserved),
    # not measured; on GPU workers torch.cuda.max_memory_allocated is measured, here
    device_peak_bytes: Mapping[int, int] = field(default_factory=dict)

    def measured_seconds(self) -> dict[int, float]:
        """Measured seconds of each primitive, by schedule index."""
        return {t.index: t.duration_s for t in self.timings}

    @property
    def setup_s(self) -> float:
        return sum(t.setup_s for t in self.timings)

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.timings)

    def within_capacity(self) -> bool:
        return all(self.peak_bytes[g] <= self.capacity_bytes[g] for g in self.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "wall_s": self.wall_s, "estimated_s": self.estimated_s,
                "bytes": self.bytes, "setup_s": self.setup_s,
                "primitives": [t.to_dict() for t in self.timings],
                "peak_bytes": {str(g): b for g, b in sorted(self.peak_bytes.items())},
                "device_peak_bytes": {str(g): b for g, b in
                                      sorted(self.device_peak_bytes.items())},
                "capacity_bytes": {str(g): b for g, b in sorted(self.capacity_bytes.items())}}


@dataclass
class _Running:
    index: int
    prim: Primitive
    refs: dict[int, Any]
    groups: dict[str, GroupSpec]
    start: float
    deadline: float  # time.monotonic() by which every call is due; later, a call is hung
    due: str         # how the deadline came about, for the report
    results: dict[int, mv.MoveResult] = field(default_factory=dict)
    errors: dict[int, BaseException] = field(default_factory=dict)

    def pending(self) -> list[Any]:
        return [r for d, r in self.refs.items() if d not in self.results and d not in self.errors]

    def late(self, now: float) -> list[int]:
        """Workers whose calls are still running past the deadline."""
        if now < self.deadline:
            return []
        return [d for d in self.refs if d not in self.results and d not in self.errors]

    @property
    def name(self) -> str:
        return f"{self.prim.op}({self.prim.stage}) #{self.index}"


def replay(prims: Sequence[Primitive], specs: Mapping[str, StateSpec], held: Mapping[int, int],
           cap: Mapping[int, int], offloaded: AbstractSet[str]) -> dict[int, int]:
    """The most bytes each worker holds while ``prims`` run in their order on it, from
    ``held`` (with the current units ``offloaded`` in host memory): at each primitive's start
    what it holds plus what the memory check asks (``need_bytes`` at the smallest all-gather
    chunk), and after it. ``InfeasibleError`` for the first primitive that would not fit
    ``cap``, as the executor's check would refuse it part-way."""
    now, off = dict(held), set(offloaded)
    peak = dict(now)
    for i, p in enumerate(prims):
        spec = specs[p.stage]
        need = need_bytes(p, spec, mv.MIN_BUCKET_BYTES, off)
        why = _short(p, need, now, cap)
        if why:
            raise InfeasibleError(f"{why}, when its turn comes (#{i}; nothing has moved)")
        for g, n in need.items():
            peak[g] = max(peak.get(g, 0), now.get(g, 0) + n)
        for g, n in held_change(p, spec, off).items():
            now[g] = now.get(g, 0) + n
            peak[g] = max(peak[g], now[g])
        off.difference_update(e.id for e in p.inputs)
    return peak


def _short(p: Primitive, need: Mapping[int, int], held: Mapping[int, int],
           cap: Mapping[int, int]) -> str:
    """'transition: Split(s) needs more memory than workers [..] have free (g: need > free)'
    where ``p`` does not fit the workers' ``held`` bytes and capacities; '' where it does."""
    short = sorted(g for g, n in need.items() if held.get(g, 0) + n > cap[g])
    if not short:
        return ""
    return (f"transition: {p.op}({p.stage}) needs more memory than workers {short} have free "
            "(" + ", ".join(f"{g}: {need[g]} > {cap[g] - held.get(g, 0)}" for g in short) + ")")


def _reset_peak(ctx: Any) -> MemoryStats:
    return ctx.reset_peaks()


def _rename(ctx: Any, mapping: Mapping[str, str], token: str) -> bool:
    return bool(ctx.rename(mapping, token))


def state_specs(job: Any) -> dict[str, StateSpec]:
    """The ``StateSpec`` of every model-stage of ``job`` (a ``JobSpec``)."""
    return {s.name: StateSpec.for_stage(job, s.name) for s in job.workflow.stages}


class Executor:
    """Executes schedules on ``pool``; ``specs`` gives each model-stage's ``StateSpec``.

    ``min_timeout_s``: per-operation timeout of the transition's communicators (grown with the
    bytes an operation moves); a dead peer is noticed through Ray at once, this bounds how long
    an aborted backend lingers. ``grace_s``: how long past that timeout a primitive's call may
    take before its worker is taken as hung (see the module docstring). ``on_event(kind,
    index, primitive)`` is called with "start" after a primitive's calls are submitted and
    "end" when it ends (tests use it to inject faults).
    """

    def __init__(self, pool: WorkerPool, specs: Mapping[str, StateSpec], *,
                 min_timeout_s: float = 60.0, grace_s: float = GRACE_S,
                 on_event: EventHook | None = None):
        self.pool = pool
        self.specs = dict(specs)
        self.min_timeout_s = min_timeout_s
        self.grace_s = grace_s
        self.on_event = on_event

    def run(self, schedule: Schedule, rename: bool = True) -> ExecutionReport:
        if not schedule.feasible:
            raise InfeasibleError(f"transition: {schedule.reason}")
        prims = [sp.primitive for sp in schedule.primitives]
        deps = [set(sp.deps) for sp in schedule.primitives]
        involved = sorted({g for p in prims for g in workers_of(p)})
        missing = [g for g in involved if g not in self.pool.device_ids]
        if missing:
            raise InfeasibleError(f"transition: no worker for devices {missing}; grow the pool")
        units: dict[str, Emu] = {e.id: e for es in schedule.initial.values() for e in es}
        self._check_held(units, involved, prims)
        plan = residency(schedule)
        self._hold_as_planned(prims, plan, involved)
        stats = ray.get([self.pool.submit_control(d, _reset_peak) for d in involved],
                        timeout=self.grace_s)
        held = {d: s.held for d, s in zip(involved, stats)}
        cap = {d: s.capacity for d, s in zip(involved, stats)}
        offloaded = set(plan.offloaded_at_start)  # current units in host memory now
        # each worker's primitives in the schedule's order: one starts when it is first of
        # those not ended on every worker it touches (``turn``; the module docstring says why)
        queue: dict[int, list[int]] = {}
        for i, p in enumerate(prims):
            for g in workers_of(p):
                queue.setdefault(g, []).append(i)
        turn = dict.fromkeys(queue, 0)  # worker -> position in its queue of its next one

        timings: dict[int, PrimitiveTiming] = {}
        done: set[int] = set()
        running: dict[int, _Running] = {}
        busy: set[int] = set()
        rv = Rendezvous()
        t0 = time.perf_counter()
        try:
            while len(done) < len(prims):
                for i, p in enumerate(prims):
                    if i in done or i in running or not deps[i] <= done:
                        continue
                    ws = workers_of(p)
                    if busy.intersection(ws) or any(queue[g][turn[g]] != i for g in ws):
                        continue
                    spec = self.specs[p.stage]
                    bucket = fit_bucket(p, spec, {g: cap[g] - held[g] for g in ws}, offloaded)
                    if bucket is None:  # the memory check before each primitive
                        if running:
                            continue  # wait: a running primitive may release memory
                        need = need_bytes(p, spec, mv.MIN_BUCKET_BYTES, offloaded)
                        raise InfeasibleError(_short(p, need, held, cap) or
                                              f"transition: {p.op}({p.stage}) does not fit")
                    running[i] = self._start(i, p, spec, bucket, rv, time.perf_counter() - t0,
                                             offloaded)
                    busy.update(ws)
                    self._event("start", i, p)
                if not running:
                    raise RuntimeError("executor stalled: primitives wait on unmet dependencies")
                self._collect(running)
                hung = _give_up_late(running)
                for i in [i for i, r in running.items() if not r.pending() and not r.errors]:
                    r = running[i]
                    settled = self._settle(r, keep=True)
                    if r.errors:  # a worker died as it settled
                        continue
                    del running[i]
                    end = time.perf_counter() - t0
                    timings[i] = PrimitiveTiming.of(i, r.prim, r.start, end, r.results,
                                                    len(r.groups))
                    for d, res in r.results.items():
                        held[d] = settled.get(d, res.held_after)
                    for e in r.prim.consumed:  # an Extend's source stays
                        units.pop(e.id, None)
                    offloaded.difference_update(e.id for e in r.prim.inputs)  # loaded or gone
                    units.update({e.id: e for e in r.prim.outputs})
                    busy.difference_update(workers_of(r.prim))
                    for g in workers_of(r.prim):
                        turn[g] += 1
                    done.add(i)
                    self._event("end", i, r.prim)
                if hung or any(r.errors for r in running.values()):
                    raise _Abort(hung)
        except _Abort as stop:
            # the rendezvous stays open until the aborts have landed: a member still joining
            # then fails as aborted, not with the store's connection error
            report = self._fail(running, units, timings, t0, cause=stop.cause)
            raise TransitionFailed(report) from stop.cause
        except (Exception, KeyboardInterrupt) as e:
            if not done and not running:
                raise  # nothing has moved
            report = self._fail(running, units, timings, t0, cause=e, abort_all=True)
            raise TransitionFailed(report) from e
        finally:
            rv.close()
        wall = time.perf_counter() - t0
        final_units = {s: tuple(es) for s, es in schedule.final.items()}
        mapping = schedule.renames() if rename else {}
        token = uuid.uuid4().hex
        try:  # a worker may still die here: the fault path covers the rename too
            self._rename(final_units, mapping, token)
        except (Exception, KeyboardInterrupt) as e:
            report = self._fail_renaming(final_units, mapping, token, timings, e)
            raise TransitionFailed(report) from e
        final_units = {s: tuple(_renamed(e, mapping.get(e.id, e.id)) for e in es)
                       for s, es in final_units.items()}
        peaks, stopped, device = self._peaks(involved, final_units, timings)
        return ExecutionReport(
            tuple(timings[i] for i in range(len(prims))), wall, final_units, peaks, cap,
            schedule.estimated_s, stopped=stopped, device_peak_bytes=device)

    def _peaks(self, involved: Sequence[int], units: Mapping[str, Sequence[Emu]],
               timings: Mapping[int, PrimitiveTiming]
               ) -> tuple[dict[int, int], tuple[int, ...], dict[int, int]]:
        """Each worker's peak bytes during the transition. A worker that died after the
        rename is a fault only where it holds a final unit; one that holds none (an emptied
        source) is left out of the peaks, and the transition stands; one such worker that is
        stuck rather than dead is stopped, so that the next call to it fails at once as a
        dead worker's does instead of queueing behind the stuck one (the report lists it).
        Returns the counted peaks, the workers stopped, and the GPU workers' measured peaks
        (torch.cuda.max_memory_allocated)."""
        stats, gone = wait_each({d: self.pool.actor(d).memory.remote() for d in involved},
                                self.grace_s)  # a worker that died since, or is stuck
        hung = {d for d, e in gone.items() if isinstance(e, WorkerHung)}
        if gone.keys() & {g for es in units.values() for e in es for g in e.gpus}:
            cause = gone[min(gone)]
            report = reconcile(self.pool, [e for es in units.values() for e in es],
                               set(gone) - hung, {}, _in_order(timings), cause, hung,
                               self.grace_s)
            raise TransitionFailed(report) from cause
        if hung:
            log.warning("workers %s hold no unit of the new plan and did not answer within "
                        "%.0f s: stopped", sorted(hung), self.grace_s)
            self.pool.kill(hung)
        return ({d: st.peak for d, st in stats.items()}, tuple(sorted(hung)),
                {d: st.device_peak for d, st in stats.items() if st.device_peak is not None})

    def _rename(self, units: Mapping[str, Sequence[Emu]], mapping: Mapping[str, str],
                token: str, device_ids: Iterable[int] | None = None) -> None:
        """Rename ``units`` to the ids ``mapping`` gives them on their workers (those of
        ``device_ids`` only, if given), once per ``token``."""
        per: dict[int, dict[str, str]] = {}
        for es in units.values():
            for e in es:
                new = mapping.get(e.id, e.id)
                if new != e.id:
                    for g in e.gpus:
                        per.setdefault(g, {})[e.id] = new
        if device_ids is not None:
            keep = set(device_ids)
            per = {g: m for g, m in per.items() if g in keep}
        if per:
            self.pool.run({g: (_rename, (m, token)) for g, m in per.items()}, self.grace_s)

    def _fail_renaming(self, units: Mapping[str, Sequence[Emu]], mapping: Mapping[str, str],
                       token: str, timings: Mapping[int, PrimitiveTiming],
                       cause: BaseException) -> FaultReport:
        """Every primitive ended, then the rename failed, most likely because a worker died.
        The live workers finish the rename (a worker that did it already ignores the same
        ``token``), then each final unit is intact under its new id, or under its old one
        where no worker renamed it (a live worker whose rename failed for another reason).
        A worker whose rename did not return in time is hung: it is not asked again."""
        # a worker slow to answer is asked too (it holds its shards): the rename waits
        # ``grace_s`` for it, and reconcile stops it if it stays silent
        dead, _ = self.pool.liveness(timeout_s=5.0)
        hung = cause.hung if isinstance(cause, WorkerCallsFailed) else set()
        try:
            self._rename(units, mapping, token,
                         [d for d in self.pool.device_ids if d not in dead and d not in hung])
        except WorkerCallsFailed as e:
            dead |= e.dead
            hung |= e.hung
        except Exception:
            log.debug("finishing the rename failed", exc_info=True)
        final = [_renamed(e, mapping.get(e.id, e.id)) for es in units.values() for e in es]
        # a renamed unit may be held under either id; one whose id stays is a candidate once
        both = final + [e for es in units.values() for e in es
                        if mapping.get(e.id, e.id) != e.id]
        rep = reconcile(self.pool, both, dead, {}, _in_order(timings), cause, hung,
                        self.grace_s)
        # a unit is lost when it is intact under neither id; it is listed under its new one
        kept = {(e.stage, e.gpus) for es in rep.intact.values() for e in es}
        return replace(rep, lost=tuple(sorted((e for e in final if (e.stage, e.gpus) not in kept),
                                              key=lambda e: e.id)))

    # ---- helpers
    def _start(self, i: int, p: Primitive, spec: StateSpec, bucket: int, rv: Rendezvous,
               start: float, offloaded: AbstractSet[str] = frozenset()) -> _Running:
        """Submit primitive ``i``'s calls (loading the ``offloaded`` units it reads first).
        Its communicators time out after ``timeout``; a call that has not returned
        ``grace_s`` after that is hung."""
        need = need_bytes(p, spec, bucket, offloaded)
        timeout = self.min_timeout_s + max(need.values(), default=0) / SLOW_BW
        refs, groups = launch(p, self.pool, rv, spec, f"t{i}", timeout, bucket, offloaded)
        return _Running(i, p, refs, groups, start, time.monotonic() + timeout + self.grace_s,
                        f"within its {timeout:.6g} s timeout + {self.grace_s:g} s grace")

    def _settle(self, r: _Running, keep: bool, skip: AbstractSet[int] = frozenset()
                ) -> dict[int, int]:
        """The second phase of a Split or Merge whose calls have all ended, on the members
        that made their part (``mv.settle_member``) and are not in ``skip`` (dead or hung):
        ``keep`` the new units (every member made its part) or the sources (one did not). A
        worker that fails to settle joins ``r.errors``. Returns the bytes each member that
        settled holds after."""
        calls = settle_calls(r.prim, [d for d in r.results if d not in skip], keep)
        if not calls:
            return {}
        try:
            return self.pool.run(calls, self.grace_s)
        except WorkerCallsFailed as e:
            r.errors.update(e.errors)
            return e.results

    def _event(self, kind: str, i: int, p: Primitive) -> None:
        if self.on_event is not None:
            self.on_event(kind, i, p)

    def _hold_as_planned(self, prims: Sequence[Primitive], res: Residency,
                         involved: Sequence[int]) -> None:
        """Before anything moves: hold the current units as the schedule assumes
        (``nereus.runtime.residency``), offloading those it takes as offloaded and loading
        those it takes as loaded at the start, after a preflight: from the bytes each worker
        would then hold (another model-stage's state included), its primitives replayed in
        the schedule's order (the order the executor runs them in on that worker) with the
        bytes the memory check will ask; the first that would not fit is refused in one line
        (``InfeasibleError``), as it would be part-way. Only the transition's own workers
        are touched: elsewhere no primitive runs, and a stage's state there stays as it is
        (a worker busy with other work does not hold the transition up). A unit an engine
        computes on is not offloaded under it: refused here, before anything changes. Reads
        go to the workers' control threads (one stuck in a call still answers); the moves
        wait as long as their bytes take at the slowest rate a live worker is assumed to
        reach (``SLOW_BW``), as a primitive's calls do."""
        got = dict(zip(involved, ray.get([self.pool.submit_control(g, mv.unit_residency)
                                          for g in involved], timeout=self.grace_s)))
        calls: dict[int, tuple[Any, tuple[Any, ...]]] = {}
        held: dict[int, int] = {}
        cap: dict[int, int] = {}
        moved: dict[int, int] = {}
        busy: dict[int, list[str]] = {}
        for g, (stats, here, in_use) in got.items():
            off = [u for u, (_, host) in here.items()
                   if u in res.units and not host and u not in res.loaded_at_start]
            on = [u for u, (_, host) in here.items() if host and u in res.loaded_at_start]
            held[g] = stats.held - sum(here[u][0] for u in off) + sum(here[u][0] for u in on)
            cap[g] = stats.capacity
            moved[g] = sum(here[u][0] for u in off + on)
            if in_use & set(off):
                busy[g] = sorted(in_use & set(off))
            if off or on:
                calls[g] = (mv.set_residency, (off, on))
        if busy:
            raise InfeasibleError(
                "transition: it holds idle state offloaded, and an engine computes on "
                + "; ".join(f"worker {g}'s {', '.join(us)}" for g, us in busy.items())
                + " (detach it first)")
        over = sorted(g for g in involved if held[g] > cap[g])
        if over:
            raise InfeasibleError(
                "transition: the units it reads do not fit on their workers at the start "
                "(" + ", ".join(f"{g}: {held[g]} > {cap[g]}" for g in over) + ")")
        replay(prims, self.specs, held, cap, res.offloaded_at_start)
        if calls:
            most = max(moved[g] for g in calls)
            self.pool.run(calls, self.min_timeout_s + most / SLOW_BW + self.grace_s)

    def _check_held(self, units: Mapping[str, Emu], involved: Sequence[int],
                    prims: Sequence[Primitive]) -> None:
        need: dict[int, set[str]] = {}
        produced = {e.id for p in prims for e in p.outputs}
        for p in prims:
            for e in p.inputs:
                if e.id in produced:
                    continue
                if e.id not in units:
                    raise InfeasibleError(f"transition: {p.op} needs unit {e.id}, which the "
                                          "schedule's initial collection lacks")
                for g in e.gpus:
                    need.setdefault(g, set()).add(e.id)
        if not need:
            return
        held = self.pool.run({g: (mv.held_units, ()) for g in need}, self.grace_s)
        for g, ids in need.items():
            lacking = ids - set(held[g])
            if lacking:
                raise InfeasibleError(f"transition: worker {g} does not hold {sorted(lacking)}")

    def _collect(self, running: Mapping[int, _Running]) -> None:
        """Wait until a call ends or the earliest deadline of a running primitive passes; fill
        results and errors of the calls that ended."""
        waiting = [r for r in running.values() if r.pending()]
        if not waiting:
            return
        refs = [ref for r in waiting for ref in r.pending()]
        until = min(r.deadline for r in waiting)
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, until - time.monotonic()))
        if ready:  # take everything else that is ready too
            more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = list({*ready, *more})
        ready_set = set(ready)
        for r in waiting:
            for d, ref in r.refs.items():
                if ref in ready_set and d not in r.results and d not in r.errors:
                    try:
                        r.results[d] = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - a failed call is a fault
                        r.errors[d] = e

    def _fail(self, running: dict[int, _Running], units: dict[str, Emu],
              timings: dict[int, PrimitiveTiming], t0: float,
              cause: BaseException | None = None, abort_all: bool = False) -> FaultReport:
        """Abort, wait (each call until its deadline), reconcile. ``cause``: what stopped the
        run, for the report. ``abort_all``: a driver-side error; every running primitive's
        communicators are aborted then (none of its workers failed, but its calls may wait on
        peers that were never called)."""
        errors = {d: e for r in running.values() for d, e in r.errors.items()}
        dead = {d for d, e in errors.items() if is_actor_death(e)}
        involved = {d for r in running.values() for d in r.refs}
        log.debug("fault at %.3f s: errors from %s", time.perf_counter() - t0, sorted(errors))
        # a worker that died is skipped by the aborts below; one that is only slow to answer
        # is asked to abort like the others, and counts as hung if it never answers
        died, silent_now = self.pool.liveness(timeout_s=5.0)
        log.debug("liveness at %.3f s: dead %s, silent %s", time.perf_counter() - t0,
                  sorted(died), sorted(silent_now))
        dead |= involved & died
        silent = self._abort(running, dead, dead | set(errors), abort_all)
        log.debug("aborted at %.3f s", time.perf_counter() - t0)
        while any(r.pending() for r in running.values()):
            self._collect(running)
            _give_up_late(running)
        for r in running.values():  # the sources of a failed Split or Merge stay
            self._settle(r, keep=not r.errors, skip=dead | silent)
        log.debug("running primitives ended at %.3f s", time.perf_counter() - t0)
        hung = silent | {d for r in running.values() for d, e in r.errors.items()
                         if isinstance(e, WorkerHung)}
        failed: dict[int, dict[int, BaseException]] = {}
        candidates = dict(units)
        for i, r in running.items():
            end = time.perf_counter() - t0
            if r.errors:
                failed[i] = dict(r.errors)
                candidates.update({e.id: e for e in r.prim.outputs})
                dead |= {d for d, e in r.errors.items() if is_actor_death(e)}
                continue
            timings[i] = PrimitiveTiming.of(i, r.prim, r.start, end, r.results, len(r.groups))
            for e in r.prim.consumed:
                candidates.pop(e.id, None)
            candidates.update({e.id: e for e in r.prim.outputs})
        return reconcile(self.pool, candidates.values(), dead, failed,
                         _in_order(timings), cause, hung, self.grace_s)

    def _abort(self, running: Mapping[int, _Running], dead: set[int], bad: set[int],
               abort_all: bool) -> set[int]:
        """Abort the communicators of the running primitives that include a ``bad`` worker (of
        all, with ``abort_all``) on their members not ``dead``, by name and by instance (a
        call may not have reached its join yet). An aborted call returns at once, so it is due
        ``grace_s`` after the abort landed. Members that died meanwhile join ``dead``; returns
        those that did not answer (hung)."""
        chosen = [r for r in running.values()
                  if r.groups and (abort_all or bad.intersection(r.refs))]
        refs = {}
        for r in chosen:
            for d in r.refs:
                if d not in dead:
                    mine = [gs for gs in r.groups.values() if d in gs.members]
                    refs[d] = self.pool.submit_control(d, _abort_all, [gs.name for gs in mine],
                                                       [gs.prefix for gs in mine])
        _, errors = wait_each(refs, self.grace_s)
        silent = {d for d, e in errors.items() if isinstance(e, WorkerHung)}
        dead |= set(errors) - silent  # it may have died meanwhile
        for r in chosen:
            r.deadline = time.monotonic() + self.grace_s
            r.due = f"within {self.grace_s:g} s of its abort"
        return silent


def _give_up_late(running: Mapping[int, _Running]) -> WorkerHung | None:
    """Calls still running past their primitive's deadline fail as hung (``WorkerHung``);
    returns an error that names each such primitive and its hung workers, if any."""
    now = time.monotonic()
    named = []
    for _, r in sorted(running.items()):
        late = r.late(now)
        for d in late:
            r.errors[d] = WorkerHung(f"{r.name} did not return on worker {d} {r.due}")
        if late:
            who = ", ".join(map(str, late))
            named.append(f"{r.name}: worker{'s' if len(late) > 1 else ''} {who} did not "
                         f"return {r.due}")
    return WorkerHung("; ".join(named)) if named else None


def _in_order(timings: Mapping[int, PrimitiveTiming]) -> tuple[PrimitiveTiming, ...]:
    """The completed primitives' timings in schedule order, as a fault report lists them."""
    return tuple(sorted(timings.values(), key=lambda t: t.index))


class _Abort(Exception):
    """Internal: leave the scheduling loop for the fault path; ``cause`` names calls that
    hung (a worker's failure is in its primitive's errors)."""

    def __init__(self, cause: BaseException | None = None):
        super().__init__()
        self.cause = cause


def _renamed(e: Emu, new_id: str) -> Emu:
    if new_id == e.id:
        return e
    return Emu(new_id, e.stage, e.model, e.layout, e.gpus, e.holds)
