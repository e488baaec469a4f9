"""Ray workers, one per device, and the pool that owns them.

The contract: ``WorkerPool`` owns one Ray actor per device; an actor's ``call(fn,
*args, **kwargs)`` runs a picklable module-level ``fn(ctx, *args, **kwargs)`` inside the worker,
where ``ctx`` is its ``WorkerContext``: the device, the device id (the GPU id plans use), the
``ShardedState`` units it holds keyed by EMU id, the process groups it belongs to keyed by name,
and its byte counter. The runtime's own data movement runs through ``call`` too, so the engine,
the executor and the state share one set of processes.

Placement: a placement group per batch of workers (``PACK``), one bundle per device:
``{"GPU": 1}`` on a GPU cluster, ``{"nereus_slot": 1}`` on a CPU machine, where a device slot is
a custom resource (``ray.init(resources={"nereus_slot": n})`` or ``ray start --resources``).
Works on a local ``ray.init()`` and on an existing cluster (``address=``).

Each actor has two concurrency groups: ``work`` (one thread: calls run one at a time, so
collectives of different primitives never interleave on a worker) and ``control`` (abort a
blocked collective, ping, memory stats), which answers while ``work`` is blocked.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nereus.errors import InfeasibleError, InputError, first_line
from nereus.interrupts import ctrl_c_deferred
from nereus.runtime.comm import Group, PendingJoin, node_ip
from nereus.runtime.inventory import SLOT_RESOURCE, detect_inventory
from nereus.runtime.memory import ArenaCache, ByteCounter, MemoryStats
from nereus.runtime.state import ShardedState, StateMeta, StateSpec, arena_layout

if TYPE_CHECKING:
    from typing_extensions import Self

DEFAULT_CPU_CAPACITY = int(0.9 * 2 * 1024**3)  # 90 % of the ``cpu`` device preset's 2 GiB
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
GPU_HEADROOM = 0.9                               # capacity = 90 % of memory, as the planner's
# How long past its expected end a worker call may take before its worker is taken as hung
# (alive, but the call never returns) and stopped. A communicator raises by its own timeout,
# and a short call (an abort, a listing of units) answers at once, so a live call has
# returned by then; the grace covers Ray handing the result back on a loaded host. Generous,
# since a worker taken as hung is killed and its units are lost.
GRACE_S = 30.0


class WorkerContext:
    """What ``fn`` sees inside a worker (see module docstring). Thread-safe where it counts."""

    def __init__(self, device_id: int, device: torch.device, capacity_bytes: int):
        self.device_id = device_id
        self.device = device
        self.node_ip = node_ip()
        self.memory = ByteCounter(device_id, capacity_bytes)
        # CUDA's caching allocator already reuses GPU memory; CPU workers reuse arenas here.
        self.cache = ArenaCache() if device.type == "cpu" else None
        self.units: dict[str, ShardedState] = {}
        # held units that are offloaded (the transition planner's idle state): their arenas
        # live in host memory and are not counted against the capacity until ``load``ed. On a
        # CPU worker host and device memory are one, so only the count differs.
        self.offloaded: set[str] = set()
        # what computes on a unit's views (an engine: ``engine.remote.attach``): key -> unit
        # id; such a unit is not offloaded under it (its views would keep the old arena)
        self.in_use: dict[str, str] = {}
        # a Split's or Merge's new units whose primitive has not settled (``movement.
        # settle_member``): new id -> (source id, the host copy of a staged source, whether
        # that source was held offloaded)
        self.pending: dict[str, tuple[str, ShardedState | None, bool]] = {}
        self.groups: dict[str, Group] = {}
        self.zombies: list[Any] = []  # aborted groups / joins whose backend is still busy
        self._joining: dict[str, PendingJoin] = {}  # by group name
        self._refused: set[str] = set()  # prefixes of aborted group instances
        self.scratch: dict[str, Any] = {}  # the engine's per-worker objects (models, caches)
        self._renames: set[str] = set()  # tokens of the renames applied here
        self._lock = threading.Lock()

    # ---- state units (bytes counted)
    # A unit counts its arena's bytes, what the transition planner counts: a block reused from
    # the cache may be up to ``ArenaCache.max_slack`` larger, and that slack is not counted (it
    # would refuse work that fits by the planner's bytes). It is bounded, CPU only (GPU workers
    # have no arena cache), and the capacity of a CPU worker is an emulated budget anyway.
    # ``allocate`` reserves exactly what ``drop``/``free`` release.
    def allocate(self, spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int,
                 meta: StateMeta, what: str = "state") -> ShardedState:
        """A new empty arena for one position, its bytes reserved first (CapacityError)."""
        n = arena_layout(spec, tp, pp, tp_rank, pp_rank).nbytes
        self.memory.reserve(n, what)
        try:
            buf = self.buffer(n, what)
        except BaseException:
            self.memory.release(n)
            raise
        try:
            return ShardedState(spec, tp, pp, tp_rank, pp_rank, buf, meta)
        except BaseException:
            self.memory.release(n)
            raise

    def buffer(self, nbytes: int, what: str = "arena") -> torch.Tensor:
        """Uninitialised bytes for an arena whose ``nbytes`` are already reserved: reused from
        the cache where a block fits (a view of its first ``nbytes``), else new (after evicting
        cached memory past the capacity). The caller releases ``nbytes`` (the result's
        ``numel()``)."""
        if self.cache is not None:
            buf = self.cache.take(nbytes)
            if buf is not None:
                return buf
            self.cache.evict(max(0, self.memory.capacity - self.memory.stats().held))
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def _recycle(self, buf: torch.Tensor) -> None:
        """Offer a freed arena's memory to the cache (only the caller's ``buf`` may still
        reference it)."""
        if self.cache is not None:
            self.cache.give(buf)
            self.cache.evict(max(0, self.memory.capacity - self.memory.stats().held))

    def hold(self, unit_id: str, state: ShardedState, offloaded: bool = False) -> None:
        """Keep an arena made by ``allocate`` under ``unit_id``; ``offloaded``: an arena in
        host memory, not counted (see ``host_arena``)."""
        with self._lock:
            if unit_id in self.units:
                raise KeyError(f"worker {self.device_id} already holds unit {unit_id}")
            self.units[unit_id] = state
            if offloaded:
                self.offloaded.add(unit_id)

    def host_arena(self, nbytes: int) -> torch.Tensor:
        """Uncounted bytes in host memory for an offloaded unit's arena: pinned on a GPU
        worker (its loads copy asynchronously-capable memory), plain on a CPU one."""
        if self.device.type == "cuda":
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return torch.empty(nbytes, dtype=torch.uint8)

    def drop(self, unit_id: str) -> int:
        """Free a unit's arena; returns the device bytes released (0 if not held, or held
        offloaded: its host memory goes, no counted bytes)."""
        with self._lock:
            state = self.units.pop(unit_id, None)
            host = unit_id in self.offloaded
            self.offloaded.discard(unit_id)
        if state is None:
            return 0
        buf = state.buffer
        del state  # callers drop their own references to the unit before dropping it
        n = 0 if host else buf.numel()
        self.memory.release(n)
        if self.device.type == "cpu" or not host:
            self._recycle(buf)
        return n

    def take_offloaded(self, unit_id: str) -> ShardedState | None:
        """Remove an offloaded unit and hand its host arena to the caller (a staged primitive
        reads its source from there); None, and nothing removed, when the unit is not held
        offloaded."""
        with self._lock:
            if unit_id not in self.offloaded:
                return None
            self.offloaded.discard(unit_id)
            return self.units.pop(unit_id)

    def load(self, unit_id: str) -> int:
        """Bring an offloaded unit onto the device, its bytes counted first (CapacityError
        when they do not fit: it stays offloaded); returns the bytes loaded (0 when it was
        resident). On a GPU worker the arena is copied into device memory and the host copy
        freed; on a CPU worker it stays where it is and is counted from now on."""
        with self._lock:
            if unit_id not in self.units:
                raise KeyError(f"worker {self.device_id} holds no unit {unit_id}")
            if unit_id not in self.offloaded:
                return 0
            host = self.units[unit_id]
        n = host.nbytes
        if self.device.type == "cpu":
            self.memory.reserve(n, f"load {unit_id}")
            dev = host
        else:
            dev = self.allocate(host.spec, host.tp, host.pp, *host.position, host.meta,
                                f"load {unit_id}")
            try:
                dev.buffer.copy_(host.buffer)
                torch.cuda.synchronize(self.device)
            except BaseException:
                self.free(dev)
                raise
        with self._lock:
            self.units[unit_id] = dev
            self.offloaded.discard(unit_id)
        return n

    def offload(self, unit_id: str) -> int:
        """Move a resident unit to host memory (pinned on a GPU worker), its device bytes
        released; returns them (0 when it was offloaded already)."""
        with self._lock:
            if unit_id not in self.units:
                raise KeyError(f"worker {self.device_id} holds no unit {unit_id}")
            if unit_id in self.offloaded:
                return 0
            users = sorted(k for k, u in self.in_use.items() if u == unit_id)
            if users:
                raise RuntimeError(f"worker {self.device_id}: unit {unit_id} is in use by "
                                   f"{', '.join(users)}; detach before it is offloaded")
            dev = self.units[unit_id]
        n = dev.nbytes
        host = dev
        if self.device.type != "cpu":
            buf = self.host_arena(n)
            buf.copy_(dev.buffer)
            host = ShardedState(dev.spec, dev.tp, dev.pp, *dev.position, buf, dev.meta)
        with self._lock:
            self.units[unit_id] = host
            self.offloaded.add(unit_id)
        del dev, host
        self.memory.release(n)  # the device arena is freed with the last reference to it
        return n

    def rename(self, mapping: Mapping[str, str], token: str) -> bool:
        """Rename held units (old id -> new id) in two phases, so swaps (a -> b, b -> a) work.
        Once per ``token``: a rename sent again (the driver finishing one that a fault cut
        short on other workers) changes nothing, so a swap is never undone. False when this
        token was applied before."""
        with self._lock:
            if token in self._renames:
                return False
            moved = {new: self.units.pop(old) for old, new in mapping.items()
                     if old in self.units}
            clash = sorted(new for new in moved if new in self.units)
            if clash:
                for old, new in mapping.items():  # put back what was taken
                    if new in moved:
                        self.units[old] = moved.pop(new)
                raise KeyError(f"worker {self.device_id}: units {clash} exist already")
            self.units.update(moved)
            host = {new for old, new in mapping.items() if new in moved
                    and old in self.offloaded}
            self.offloaded = (self.offloaded - {old for old, new in mapping.items()
                                                if new in moved}) | host
            self._renames.add(token)
            return True

    def free(self, state: ShardedState) -> None:
        """Release an arena from ``allocate`` that was never held (a failed primitive)."""
        buf = state.buffer
        del state
        self.memory.release(buf.numel())
        self._recycle(buf)

    def memory_stats(self) -> MemoryStats:
        st = self.memory.stats()
        cached = self.cache.bytes if self.cache is not None else 0
        device_peak = (int(torch.cuda.max_memory_allocated(self.device))
                       if self.device.type == "cuda" else None)
        return MemoryStats(st.held, st.peak, st.capacity, cached, device_peak)

    def reset_peaks(self) -> MemoryStats:
        """Restart the counted peak (and, on a GPU worker, torch's measured one)."""
        self.memory.reset_peak()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self.memory_stats()

    # ---- process groups
    def add_group(self, group: Group) -> None:
        with self._lock:
            if group.name in self.groups:
                raise KeyError(f"worker {self.device_id} is already in group {group.name}")
            self.groups[group.name] = group

    def pop_group(self, name: str) -> Group | None:
        with self._lock:
            return self.groups.pop(name, None)

    def add_pending(self, join: PendingJoin) -> None:
        """Register a join in progress; one of a refused group instance is aborted at once."""
        with self._lock:
            self._joining[join.spec.name] = join
            if join.spec.prefix in self._refused:
                join.aborted.set()

    def refuse_groups(self, prefixes: Iterable[str]) -> None:
        """Group instances (by their unique prefix) this worker must not join: their peers
        were aborted. Kept for the worker's life (a few dozen bytes per aborted group)."""
        with self._lock:
            self._refused.update(prefixes)

    def finish_join(self, join: PendingJoin, group: Group | None) -> bool:
        """End a join atomically with respect to ``abort_groups``: register ``group`` unless
        the join was aborted (then park it until its thread ends). True when registered."""
        with self._lock:
            if self._joining.get(join.spec.name) is join:
                del self._joining[join.spec.name]
            if group is None or join.aborted.is_set():
                if join.aborted.is_set():
                    self.zombies.append(join)  # its backend is freed once the thread ends
                return False
            if group.name in self.groups:
                raise KeyError(f"worker {self.device_id} is already in group {group.name}")
            self.groups[group.name] = group
            return True

    def abort_groups(self, names: Iterable[str] | None = None) -> list[str]:
        """Abort and forget groups (all when ``names`` is None), those still joining
        included: a member died. Blocked calls on them return at once."""
        with self._lock:
            want = None if names is None else set(names)
            chosen = [n for n in self.groups if want is None or n in want]
            groups = [self.groups.pop(n) for n in chosen]
            self.zombies.extend(groups)
            joins = [j for n, j in self._joining.items() if want is None or n in want]
        for g in groups:
            g.abort()
        for j in joins:
            j.aborted.set()
        self.reap()
        return chosen + [j.spec.name for j in joins]

    def reap(self) -> int:
        """Free aborted groups whose backend has finished (its operations timed out);
        returns how many are still parked. Every entry point of the worker calls it while any
        is parked, so a survivor of a fault frees them at its next call, not at the next abort.
        A failed call leaves its frames (and the operations and backend they reference) in
        reference cycles through its traceback, so the cycles are collected here: that is what
        closes the backend's sockets."""
        with self._lock:
            # one look at each: a zombie that turns idle between two looks would be dropped
            # from the list without being closed
            idle = [(g, g.idle()) for g in self.zombies]
            done = [g for g, i in idle if i]
            self.zombies = [g for g, i in idle if not i]
        for g in done:
            g.close()
        if done or not self.zombies:
            # only after closing something (or when asked with nothing parked): a group still
            # parked gains nothing from a collection, and entry points call this while one is
            del done
            gc.collect()
        return len(self.zombies)


@dataclass(frozen=True)
class WorkerInfo:
    device_id: int
    pid: int
    node_ip: str
    node_id: str
    device: str
    capacity_bytes: int


class Worker:
    """The actor body; see the module docstring for its two concurrency groups."""

    def __init__(self, device_id: int, kind: str, capacity_bytes: int, threads: int):
        torch.set_num_threads(threads)
        # On an NCCL error or timeout, abort the communicator and let the call raise (2),
        # instead of tearing the process down (torch's default, 3): a worker whose peer died
        # keeps its units for the fault path (read when a ProcessGroupNCCL is made; a user's
        # own setting wins).
        os.environ.setdefault(NCCL_ERROR_HANDLING, "2")
        if kind == "gpu":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
            device = torch.device("cuda", 0)
        else:
            device = torch.device("cpu")
        self.ctx = WorkerContext(device_id, device, capacity_bytes)

    def _reap(self) -> None:
        """Free the groups aborted after a fault whose backends have finished (every entry
        point starts here; one list check when none is parked)."""
        if self.ctx.zombies:
            self.ctx.reap()

    @ray.method(concurrency_group="work")
    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._reap()
        return fn(self.ctx, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def control(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._reap()
        return fn(self.ctx, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def info(self) -> WorkerInfo:
        self._reap()
        return WorkerInfo(self.ctx.device_id, os.getpid(), self.ctx.node_ip,
                          ray.get_runtime_context().get_node_id(), str(self.ctx.device),
                          self.ctx.memory.capacity)

    @ray.method(concurrency_group="control")
    def memory(self) -> MemoryStats:
        self._reap()
        return self.ctx.memory_stats()


# ray's overloads of remote() lack the actor option concurrency_groups
RemoteWorker = ray.remote(  # type: ignore[call-overload]
    concurrency_groups={"work": 1, "control": 4})(Worker)


class WorkerHung(TimeoutError):
    """A worker's call did not return by its deadline: the worker is alive but stuck, or
    silent."""


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the task names in its error text


def describe_error(e: BaseException) -> str:
    """One line, ``Type: message`` (``Type`` alone for an empty message): the worker's own
    exception where Ray wrapped it (a
    ``RayTaskError``'s ``cause``), without Ray's traceback and colour codes."""
    cause = getattr(e, "cause", None)
    inner = cause if isinstance(cause, BaseException) else e
    said = str(inner).strip()
    text = _ANSI.sub("", f"{type(inner).__name__}: {said}" if said else type(inner).__name__)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if isinstance(cause, BaseException) and len(lines) > 1 else lines[0])[:300]


class WorkerCallsFailed(RuntimeError):
    """Some calls of a batch failed; ``errors`` by device id, ``results`` of the others."""

    def __init__(self, errors: Mapping[int, BaseException], results: Mapping[int, Any]):
        self.errors = dict(errors)
        self.results = dict(results)
        first = next(iter(self.errors.items()))
        # one line: the full errors (Ray's tracebacks) stay in ``errors``
        super().__init__(f"{len(self.errors)} worker call(s) failed; worker {first[0]}: "
                         f"{describe_error(first[1])}")

    @property
    def dead(self) -> set[int]:
        return {d for d, e in self.errors.items() if is_actor_death(e)}

    @property
    def hung(self) -> set[int]:
        """Workers whose calls did not return in time."""
        return {d for d, e in self.errors.items() if isinstance(e, WorkerHung)}


def is_actor_death(e: BaseException) -> bool:
    return isinstance(e, ray.exceptions.RayActorError)


@dataclass
class _Slot:
    actor: Any
    group: PlacementGroup
    bundle: int


class RayStartFailed(RuntimeError):
    """Ray itself could not start or join a cluster (no temp folder, a dead address): no
    worker ever ran."""


def _init_ray(address: str | None, slots: int, slot_resource: str) -> None:
    if ray.is_initialized():
        return
    # Ctrl-C while Ray starts waits until it has started, then stops it: shutting down a
    # half-started Ray crashed the process (SIGSEGV) and left its agents running
    sigterm = signal.getsignal(signal.SIGTERM) \
        if threading.current_thread() is threading.main_thread() else None
    with ctrl_c_deferred() as interrupted:
        try:
            if address is None:  # a local Ray: this machine offers the device slots (a
                # RAY_ADDRESS in the environment would make ray.init join that cluster)
                ray.init(address="local", include_dashboard=False,
                         resources={slot_resource: slots}, object_store_memory=512 * 1024**2)
            else:
                ray.init(address=address)
        except KeyboardInterrupt:  # a second Ctrl-C: stop what started, as well as it goes
            ray.shutdown()
            raise
        except SystemExit as e:  # Ray's SIGTERM handler, set while ray.init runs: sys.exit(15)
            ray.shutdown()  # its agents would outlive the process
            if callable(sigterm) and e.code == signal.SIGTERM:
                sigterm(signal.SIGTERM, None)  # the caller's: its exception, not exit 15
            raise
        except (OSError, RuntimeError, ValueError) as e:  # ConnectionError is an OSError
            ray.shutdown()
            raise RayStartFailed(f"Ray could not start ({type(e).__name__}: "
                                 f"{first_line(e)})") from e
        finally:
            # (not where the caller's handler ran and ignores a second SIGTERM: it cleans up)
            if callable(sigterm) and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
                # the caller's SIGTERM handler (its clean-up on SIGTERM) back in place of
                # Ray's: ray.init sets its own (sys.exit), and its core worker a native one
                # that prints a crash dump before the process dies
                signal.signal(signal.SIGTERM, sigterm)
    if interrupted():
        ray.shutdown()
        raise KeyboardInterrupt


class WorkerPool:
    """One Ray actor per device id; grows and shrinks with the job's pool."""

    def __init__(self, kind: str, capacity_bytes: int, slot_resource: str, threads: int,
                 ready_timeout_s: float):
        self.kind = kind
        self.capacity_bytes = capacity_bytes
        self.slot_resource = slot_resource
        self.threads = threads
        self.ready_timeout_s = ready_timeout_s
        self._slots: dict[int, _Slot] = {}
        # bundles that ``shrink`` emptied in placement groups other workers still use: Ray
        # frees a placement group whole, so ``grow`` spawns into these first
        self._spare: list[tuple[PlacementGroup, int]] = []

    @classmethod
    def start(cls, devices: int | Sequence[int], *, kind: str = "auto",
              capacity_bytes: int | None = None, address: str | None = None,
              slot_resource: str = SLOT_RESOURCE, threads: int = 1,
              ready_timeout_s: float = 60.0) -> WorkerPool:
        """Start workers for ``devices`` (a count, or the device ids plans use).

        ``kind``: "gpu", "cpu" or "auto" (GPU when the cluster has GPUs). ``capacity_bytes``:
        bytes each worker may hold; default 90 % of the GPU's memory per NVML, or of the ``cpu``
        device preset's 2 GiB. Connects to ``address`` or starts a local Ray when none runs.
        """
        ids = list(range(devices)) if isinstance(devices, int) else list(devices)
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
            raise InputError("devices", f"{devices!r}", "distinct device ids >= 0")
        _init_ray(address, max(ids) + 1, slot_resource)
        inv = detect_inventory(slot_resource)
        if kind == "auto":
            kind = inv.kind
        if kind not in ("cpu", "gpu"):
            raise InputError("kind", f"{kind!r}", ["auto", "cpu", "gpu"])
        if capacity_bytes is None:
            mem = inv.device_memory_bytes() if kind == "gpu" else None
            capacity_bytes = int(GPU_HEADROOM * mem) if mem else DEFAULT_CPU_CAPACITY
        pool = cls(kind, int(capacity_bytes), slot_resource, threads, ready_timeout_s)
        pool.grow(ids)
        return pool

    # ---- membership
    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._slots))

    def actor(self, device_id: int) -> Any:
        if device_id not in self._slots:
            raise InputError("device", f"no worker for device {device_id}", self.device_ids)
        return self._slots[device_id].actor

    def _bundle(self) -> dict[str, float]:
        return {"GPU": 1.0} if self.kind == "gpu" else {self.slot_resource: 1.0}

    def _spawn(self, device_id: int, group: PlacementGroup, bundle: int) -> Any:
        opts: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(group, bundle),
            "num_cpus": 0, "max_restarts": 0}
        if self.kind == "gpu":
            opts["num_gpus"] = 1
        else:
            opts["resources"] = {self.slot_resource: 1}
        return RemoteWorker.options(**opts).remote(device_id, self.kind, self.capacity_bytes,
                                                   self.threads)

    def grow(self, device_ids: Iterable[int]) -> None:
        """Add workers for new device ids: first into bundles ``shrink`` left spare, the rest
        in one new placement group for the batch. All or nothing: on any error (no room, a
        worker not ready in time) the workers started are stopped, the spare bundles stay
        spare and the placement group made for the batch is removed before the error is
        raised."""
        ids = list(dict.fromkeys(d for d in device_ids if d not in self._slots))
        if not ids:
            return
        reused = dict(zip(ids, self._spare))
        fresh = ids[len(reused):]
        group = placement_group([self._bundle() for _ in fresh], strategy="PACK") \
            if fresh else None
        actors: dict[int, Any] = {}
        try:
            if group is not None and not group.wait(self.ready_timeout_s):
                res = "GPU" if self.kind == "gpu" else self.slot_resource
                have = ray.available_resources().get(res, 0)
                raise InfeasibleError(f"pool: {len(ids)} more {self.kind} device(s) requested, "
                                      f"the Ray cluster has {have:g} free ({res})"
                                      + (f" beyond {len(reused)} spare" if reused else ""))
            for d, (g, b) in reused.items():
                actors[d] = self._spawn(d, g, b)
            for i, d in enumerate(fresh):
                assert group is not None  # made above, fresh being non-empty
                actors[d] = self._spawn(d, group, i)
            ray.get([a.info.remote() for a in actors.values()], timeout=self.ready_timeout_s)
        except BaseException:
            # the error being raised is the one to report, not a failure to clean up after it
            for a in actors.values():
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            if group is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(group)
            raise
        del self._spare[:len(reused)]
        for d, (g, b) in reused.items():
            self._slots[d] = _Slot(actors[d], g, b)
        for i, d in enumerate(fresh):
            assert group is not None  # made above, fresh being non-empty
            self._slots[d] = _Slot(actors[d], group, i)

    def shrink(self, device_ids: Iterable[int]) -> None:
        """Stop the workers of ``device_ids`` and free their placement bundles: a placement
        group no worker uses any more is removed; a bundle of one that others still use is
        kept for the next ``grow`` (Ray frees a placement group only whole)."""
        for d in list(device_ids):
            slot = self._slots.pop(d, None)
            if slot is None:
                continue
            ray.kill(slot.actor, no_restart=True)
            if any(s.group.id == slot.group.id for s in self._slots.values()):
                self._spare.append((slot.group, slot.bundle))
            else:
                self._spare = [(g, b) for g, b in self._spare if g.id != slot.group.id]
                remove_placement_group(slot.group)

    def kill(self, device_ids: Iterable[int]) -> None:
        """Stop the actors of hung workers (alive, but a call of theirs never returns: every
        later call would queue behind it). Their slots stay, as a crashed worker's do, until
        ``shrink`` or ``replace``."""
        for d in device_ids:
            slot = self._slots.get(d)
            if slot is not None:
                ray.kill(slot.actor, no_restart=True)

    def replace(self, device_id: int) -> None:
        """Start a fresh worker in a dead worker's bundle (same device id, empty state)."""
        slot = self._slots[device_id]
        ray.kill(slot.actor, no_restart=True)
        slot.actor = self._spawn(device_id, slot.group, slot.bundle)
        ray.get(slot.actor.info.remote(), timeout=self.ready_timeout_s)

    def shutdown(self) -> None:
        """Stop every worker and free every placement group."""
        groups = {s.group.id: s.group for s in self._slots.values()}
        for s in self._slots.values():
            ray.kill(s.actor, no_restart=True)
        for g in groups.values():
            remove_placement_group(g)
        self._slots.clear()
        self._spare.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- calls
    def submit(self, device_id: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(fn, ...)`` on one worker; returns the Ray ObjectRef."""
        return self.actor(device_id).call.remote(fn, *args, **kwargs)

    def submit_control(self, device_id: int, fn: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
        return self.actor(device_id).control.remote(fn, *args, **kwargs)

    def run(self, calls: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]],
            timeout_s: float | None = None,
            release: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]] | None = None
            ) -> dict[int, Any]:
        """Run one call per worker concurrently and wait for all; raises ``WorkerCallsFailed``
        (after every call ended) when any failed, and ``InputError`` for a device without a
        worker before any call starts.

        ``release`` (one call per worker) frees the peers of a failed call: a worker that
        raised leaves the others inside a collective, which ends only at the communicators'
        timeout. Once a call failed, each worker's ``release`` runs as soon as its own call has
        ended (on the ``work`` thread, so never under a running call): closing a worker's
        communicators makes the peers' operations with it fail at once ("connection closed by
        peer"), whose calls then end and are released in turn. The first failure is the
        first error raised; the other calls are waited for ``GRACE_S`` at most after it, and
        one still running then is reported as hung (``WorkerHung``), not stopped: its worker
        keeps its state."""
        actors = {d: self.actor(d) for d in calls}  # every id checked before anything runs
        refs = {d: actors[d].call.remote(fn, *args) for d, (fn, args) in calls.items()}
        if release is None:
            return wait_all(refs, timeout_s)
        return _wait_releasing(actors, refs, release, timeout_s)

    def run_all(self, fn: Callable[..., Any], *args: Any,
                device_ids: Iterable[int] | None = None) -> dict[int, Any]:
        ids = self.device_ids if device_ids is None else tuple(device_ids)
        return self.run({d: (fn, args) for d in ids})

    def set_capacity(self, capacity_bytes: int, device_ids: Iterable[int] | None = None) -> None:
        """Change the bytes workers may hold (a job's capacity rule changed); refused by a
        worker that already holds more."""
        ids = self.device_ids if device_ids is None else tuple(device_ids)
        ray.get([self.submit_control(d, _set_capacity, int(capacity_bytes)) for d in ids])
        if device_ids is None:
            self.capacity_bytes = int(capacity_bytes)

    def infos(self) -> dict[int, WorkerInfo]:
        return {d: ray.get(s.actor.info.remote()) for d, s in self._slots.items()}

    def memory(self) -> dict[int, MemoryStats]:
        refs = {d: s.actor.memory.remote() for d, s in self._slots.items()}
        return {d: ray.get(r) for d, r in refs.items()}

    def liveness(self, timeout_s: float = 10.0) -> tuple[set[int], set[int]]:
        """(dead, silent): the workers whose actor died, and those that did not answer within
        ``timeout_s`` (all asked at once). A silent worker may only be slow (a loaded host, a
        long pause, swapping): it still holds its state, so it is not dead until stopped. A
        worker whose ``call`` is stuck still answers here (its control threads do)."""
        _, errors = wait_each({d: s.actor.info.remote() for d, s in self._slots.items()},
                              timeout_s)
        other = [e for e in errors.values() if not (is_actor_death(e) or
                                                     isinstance(e, WorkerHung))]
        if other:
            raise other[0]
        silent = {d for d, e in errors.items() if isinstance(e, WorkerHung)}
        return set(errors) - silent, silent


def _set_capacity(ctx: WorkerContext, capacity_bytes: int) -> None:
    ctx.memory.set_capacity(capacity_bytes)


def wait_each(refs: Mapping[int, Any], timeout_s: float | None = None
              ) -> tuple[dict[int, Any], dict[int, BaseException]]:
    """Wait for every ref, ``timeout_s`` at most in all; (results, errors) by key, where a
    call still running then has a ``WorkerHung`` error."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    if not refs:
        return results, errors
    _, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for d, r in refs.items():
        if r in pending:
            errors[d] = WorkerHung(f"worker {d} did not answer within {timeout_s} s")
            continue
        try:
            results[d] = ray.get(r)
        except Exception as e:  # noqa: BLE001 - handed to the caller
            errors[d] = e
    return results, errors


def _wait_releasing(actors: Mapping[int, Any], refs: Mapping[int, Any],
                    release: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]],
                    timeout_s: float | None) -> dict[int, Any]:
    """``wait_all`` that stops waiting for the collective timeout once a call failed (see
    ``WorkerPool.run``): results by key, or ``WorkerCallsFailed`` whose first error is the
    first failure (the errors after it are mostly its peers, freed by the releases)."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    released: list[Any] = []
    pending = dict(refs)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed_at: float | None = None
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=left)
        if not ready:
            break
        d = next(k for k, r in pending.items() if r == ready[0])
        del pending[d]
        try:
            results[d] = ray.get(ready[0])
        except Exception as e:  # noqa: BLE001 - handed to the caller
            errors[d] = e
        if errors:
            if failed_at is None:  # release every call that has ended, then each as it ends
                failed_at = time.monotonic()
                cut = failed_at + GRACE_S
                deadline = cut if deadline is None else min(deadline, cut)
                ended = [*results, *errors]
            else:
                ended = [d]
            released += [actors[k].call.remote(release[k][0], *release[k][1])
                         for k in ended if k in release]
    for d in pending:
        errors[d] = WorkerHung(
            f"worker {d} did not answer within {timeout_s} s" if failed_at is None else
            f"worker {d} did not return within {GRACE_S:g} s of the first failed call")
    if released:  # their own errors change nothing: the caller closes the groups anyway
        ray.wait(released, num_returns=len(released), timeout=GRACE_S)
    if errors:
        raise WorkerCallsFailed(errors, results)
    return results


def wait_all(refs: Mapping[int, Any], timeout_s: float | None = None) -> dict[int, Any]:
    """Wait for every ref; results by key, or ``WorkerCallsFailed`` with each error."""
    results, errors = wait_each(refs, timeout_s)
    if errors:
        raise WorkerCallsFailed(errors, results)
    return results
