"""Communicators among any subset of workers, made for a purpose and destroyed after it.

No global ``init_process_group``: a job's groups change with every transition, and a world that
must be torn down and rebuilt to change one group would stop every model-stage. Instead

- the driver hosts one ``Rendezvous`` (a ``TCPStore`` server on a port the OS picks: the socket
  is bound to port 0 and handed to the store as ``master_listen_fd``, so no other process can
  take the port between choosing and listening; closing the rendezvous frees it);
- each communicator gets a ``PrefixStore`` under a unique prefix in that store, and every member
  builds ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU) on it with its group-local
  rank; calls are made on the ``Group`` object (``broadcast``, ``all_gather``, ``all_reduce``,
  ``send`` / ``recv``, ``barrier``);
- set-up (store connect + rendezvous + backend init, plus one tiny collective on NCCL, whose
  communicator is created lazily) is timed, since it is part of a transition's cost.

Engine use (issue 5): ``open_groups(pool, {"tp.0": (0, 1), "dp": (0, 2)}, rv)`` makes long-lived
groups; inside ``call(fn, ...)`` a worker finds them as ``ctx.groups["tp.0"]``;
``close_groups(pool, names)`` destroys them. A worker joins its groups in one global order, so
groups that share workers never wait on each other.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from typing_extensions import Self

    from nereus.runtime.workers import WorkerContext, WorkerPool

DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StoreAddress:
    host: str
    port: int


def node_ip() -> str:
    """This process's node address as Ray sees it (reachable from the other nodes)."""
    import ray.util

    try:
        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - outside Ray: loopback is the only safe choice
        return "127.0.0.1"


class Rendezvous:
    """A TCPStore server in this process on a free port, released by ``close``."""

    def __init__(self, host: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.host = host or node_ip()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.host, 0))
            sock.listen(1024)
            self.port = int(sock.getsockname()[1])
            self._store: dist.TCPStore | None = dist.TCPStore(
                self.host, self.port, None, True, datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False, master_listen_fd=sock.fileno(), use_libuv=True)
        except BaseException:
            sock.close()
            raise
        sock.detach()  # the store owns the descriptor now and closes it when destroyed
        self.timeout_s = timeout_s

    @property
    def address(self) -> StoreAddress:
        return StoreAddress(self.host, self.port)

    @property
    def closed(self) -> bool:
        return self._store is None

    def close(self) -> None:
        """Stop the server: frees the port, and rendezvous still waiting on it fail at once."""
        self._store = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class GroupSpec:
    """What a member needs to join a communicator: its name, the store, the members in rank
    order (device ids) and a prefix unique to this instance of the group."""

    name: str
    store: StoreAddress
    members: tuple[int, ...]
    prefix: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def new(cls, name: str, members: Sequence[int], rv: Rendezvous,
            timeout_s: float | None = None) -> GroupSpec:
        if len(set(members)) != len(members):
            raise ValueError(f"group {name}: a worker appears twice in {tuple(members)}")
        return cls(name, rv.address, tuple(members), f"{name}/{uuid.uuid4().hex[:12]}/",
                   rv.timeout_s if timeout_s is None else timeout_s)


class GroupAborted(RuntimeError):
    """A collective was abandoned because its group was aborted (a member died)."""


class _P2PWait:
    """A gloo send or receive, waited for in a helper thread. Gloo marks these complete only
    inside ``wait`` (``is_completed`` stays False however long ago the peer answered), so a
    poll on the work itself would never end; this one reports the helper's wait instead."""

    def __init__(self, work: Any):
        self.work = work
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name="p2p-wait", daemon=True).start()

    def _run(self) -> None:
        try:
            self.work.wait()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error


class Group:
    """One member's handle on a communicator: group-local rank, collectives on the group.

    Collectives wait by polling, so ``abort`` (from the worker's control thread) makes a blocked
    call return at once: gloo does not wake a receive whose peer died before the operation's
    timeout, so an aborted backend is parked (``WorkerContext.zombies``) until that timeout
    frees it, instead of blocking the worker in its destructor.
    """

    def __init__(self, spec: GroupSpec, rank: int, backend: Any, device: torch.device,
                 setup_s: float):
        self.spec = spec
        self.rank = rank
        self.backend = backend
        self.device = device
        self.setup_s = setup_s
        self.aborted = threading.Event()
        # operations started on gloo and not yet seen complete: ``idle`` reads them from the
        # control thread, so an operation is in the list from the moment it starts (``_start``
        # holds the lock over both)
        self._pending: list[Any] = []
        self._lock = threading.Lock()

    def _start(self, op: Callable[[Any], Any]) -> Any:
        """Start ``op`` on the live backend and track it until ``_wait`` sees it complete (on
        gloo: closing a backend waits for its operations, so a group with one in flight must
        stay parked; NCCL's abort unblocks them)."""
        if self.device.type == "cuda":  # NCCL may block in its first operation: no lock
            return op(self._live())
        with self._lock:
            work = op(self._live())
            self._pending.append(work)
        return work

    def _wait(self, work: Any) -> None:
        if self.aborted.is_set():
            raise GroupAborted(f"group {self.name} was aborted")
        if self.device.type != "cuda":  # NCCL: abort() unblocks the stream; wait enqueues
            delay = 20e-6
            while not work.is_completed():
                if self.aborted.is_set():
                    raise GroupAborted(f"group {self.name} was aborted")
                time.sleep(delay)
                delay = min(2e-3, delay * 2)
            with self._lock:
                self._pending = [w for w in self._pending if w is not work]
        try:
            work.wait()  # raises the operation's own error, if it failed
        except Exception as e:
            if self.aborted.is_set():  # the abort ended it, as an error of the backend's
                raise GroupAborted(f"group {self.name} was aborted") from e
            raise

    def _wait_all(self, works: list[Any]) -> None:
        for w in works:
            self._wait(w)

    def idle(self) -> bool:
        """No operation of this member is still running inside the backend (one started and
        not waited for, as a Split keeps several broadcasts in flight, included)."""
        with self._lock:
            return all(w.is_completed() for w in self._pending)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def size(self) -> int:
        return len(self.spec.members)

    @property
    def members(self) -> tuple[int, ...]:
        return self.spec.members

    def _live(self) -> Any:
        """The backend to start an operation on; ``GroupAborted`` once the group was aborted
        (an aborted group is parked, and freed -- its backend gone -- once idle, which it is
        before this member's first operation)."""
        backend = self.backend
        if self.aborted.is_set() or backend is None:
            raise GroupAborted(f"group {self.name} was aborted")
        return backend

    # ---- collectives (blocking; on CUDA they are enqueued on the group's stream)
    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        self._wait(self._start(lambda b: b.broadcast([tensor], opts)))

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        self._wait(self._start(lambda b: b.allgather([outputs], [tensor])))

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
                   ) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = cast(dist.ReduceOp, op)  # pybind converts; torch's stubs miss it
        self._wait(self._start(lambda b: b.allreduce([tensor], opts)))

    def start_broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any:
        """Start a broadcast; ``wait([op])`` ends it (several may be in flight)."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        return self._start(lambda b: b.broadcast([tensor], opts))

    def wait(self, works: list[Any]) -> None:
        self._wait_all(works)

    def _p2p(self, work: Any) -> Any:
        return work if self.device.type == "cuda" else _P2PWait(work)

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self._wait(self._start(lambda b: self._p2p(b.send([tensor], dst, tag))))

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> None:
        self._wait(self._start(lambda b: self._p2p(b.recv([tensor], src, tag))))

    def barrier(self) -> None:
        if self.device.type == "cuda":
            t = torch.zeros(1, device=self.device)
            self.all_reduce(t)
        else:
            self._wait(self._start(lambda b: b.barrier(dist.BarrierOptions())))
        self.synchronize()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def settle(self) -> None:
        """Wait until this member's collectives have run (on CUDA: the device's stream), then
        raise ``GroupAborted`` if the group was aborted meanwhile. On NCCL ``_wait`` only
        enqueues; an abort then ends a blocked kernel early and the stream drains as if it had
        finished, so without this check a partly received buffer would pass as complete."""
        self.synchronize()
        if self.aborted.is_set():
            raise GroupAborted(f"group {self.name} was aborted before its data settled")

    def abort(self) -> None:
        """Stop waiting (a member died); the group is unusable afterwards."""
        self.aborted.set()
        with contextlib.suppress(Exception):  # not every backend implements abort
            self.backend.abort()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # not every backend implements shutdown
            self.backend.shutdown()
        self.backend = None
        with self._lock:
            self._pending = []


def _make_backend(store: dist.Store, rank: int, size: int, device: torch.device,
                  timeout: datetime.timedelta, host: str) -> Any:
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    # torch's stubs lack ProcessGroupGloo._Options, the options that take devices
    gloo_opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    gloo_opts._timeout = timeout
    gloo_opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, size, gloo_opts)


class PendingJoin:
    """A backend being built in a helper thread, so an abort can stop the wait for it. The
    build itself cannot be interrupted: gloo's constructor ends by its timeout and is then
    freed; NCCL's communicator creation (``ncclCommInitRank``, in the first collective) may
    wait for a dead member until the process ends, parked, without holding the worker."""

    def __init__(self, spec: GroupSpec, build: Any):
        self.spec = spec
        self.aborted = threading.Event()
        self.backend: Any = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.backend = build()
            except BaseException as e:  # noqa: BLE001 - handed to the joining thread
                self.error = e

        self.thread = threading.Thread(target=run, name=f"join-{spec.name}", daemon=True)
        self.thread.start()

    def wait(self) -> Any:
        delay = 1e-4
        while self.thread.is_alive():
            if self.aborted.is_set():
                raise GroupAborted(f"group {self.spec.name} was aborted while joining")
            self.thread.join(timeout=delay)
            delay = min(5e-3, delay * 2)
        if self.error is not None:
            raise self.error
        return self.backend

    def idle(self) -> bool:
        return not self.thread.is_alive()

    def close(self) -> None:
        if self.backend is not None:
            Group(self.spec, 0, self.backend, torch.device("cpu"), 0.0).close()
            self.backend = None


def join_group(ctx: WorkerContext, spec: GroupSpec) -> Group:
    """Connect this worker to ``spec`` (blocks until every member has joined, or until the
    group is aborted); timed."""
    rank = spec.members.index(ctx.device_id)
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    t0 = time.perf_counter()

    def build() -> Any:
        client = dist.TCPStore(spec.store.host, spec.store.port, None, False, timeout)
        store = dist.PrefixStore(spec.prefix, client)
        backend = _make_backend(store, rank, len(spec.members), ctx.device, timeout,
                                ctx.node_ip)
        if ctx.device.type == "cuda":
            # NCCL makes its communicator at the first collective, which waits for every
            # member (ncclCommInitRank cannot be interrupted): here, on the helper thread, so
            # an abort ends the join's wait for a member that never comes
            backend.allreduce([torch.zeros(1, device=ctx.device)],
                              dist.AllreduceOptions()).wait()
            torch.cuda.synchronize(ctx.device)
        return backend

    pending = PendingJoin(spec, build)
    ctx.add_pending(pending)
    try:
        backend = pending.wait()
    except BaseException:
        ctx.finish_join(pending, None)
        raise
    group = Group(spec, rank, backend, ctx.device, 0.0)
    registered = ctx.finish_join(pending, group)
    if registered:
        pending.backend = None  # the group owns it now
    else:
        raise GroupAborted(f"group {spec.name} was aborted while joining")
    group.setup_s = time.perf_counter() - t0
    return group


def leave_group(ctx: WorkerContext, name: str) -> None:
    group = ctx.pop_group(name)
    if group is not None:
        group.close()


# ---- worker-side entry points (module level, so ``call`` can run them)
def _join_all(ctx: WorkerContext, specs: Sequence[GroupSpec]) -> dict[str, float]:
    """Join ``specs`` in order; where one fails, leave those joined before it (their ports
    and names free again) and raise."""
    joined: dict[str, float] = {}
    try:
        for s in specs:
            joined[s.name] = join_group(ctx, s).setup_s
    except BaseException:
        for name in joined:
            leave_group(ctx, name)
        raise
    return joined


def _leave_all(ctx: WorkerContext, names: Sequence[str]) -> None:
    for n in names:
        leave_group(ctx, n)


def _abort_all(ctx: WorkerContext, names: Sequence[str] | None,
               prefixes: Sequence[str] = ()) -> list[str]:
    """Abort the named groups; ``prefixes`` (of group instances) are refused from now on, so a
    call that had not reached its join when the abort came fails at once instead of waiting
    out its timeout for peers that were aborted."""
    ctx.refuse_groups(prefixes)
    return ctx.abort_groups(names)


# ---- driver side
def open_groups(pool: WorkerPool, groups: Mapping[str, Sequence[int]], rv: Rendezvous,
                timeout_s: float | None = None) -> dict[str, float]:
    """Create ``groups`` (name -> member device ids in rank order) on their workers; returns
    each group's measured set-up seconds (the slowest member's)."""
    specs = [GroupSpec.new(name, members, rv, timeout_s) for name, members in groups.items()]
    per_worker: dict[int, list[GroupSpec]] = {}
    for s in specs:  # every worker joins in the same (creation) order
        for d in s.members:
            per_worker.setdefault(d, []).append(s)
    from nereus.runtime.workers import WorkerCallsFailed  # it imports this module

    try:
        results = pool.run({d: (_join_all, (ss,)) for d, ss in per_worker.items()})
    except WorkerCallsFailed as e:
        # a member whose joins failed left the groups it had; those whose joins all passed
        # leave theirs, so nothing half made stays registered (a retry can use the names)
        joined = {d: [s.name for s in per_worker[d]] for d in e.results}
        with contextlib.suppress(WorkerCallsFailed):
            pool.run({d: (_leave_all, (names,)) for d, names in joined.items()})
        raise
    out: dict[str, float] = {}
    for r in results.values():
        for name, t in r.items():
            out[name] = max(out.get(name, 0.0), t)
    return out


def close_groups(pool: WorkerPool, groups: Mapping[str, Sequence[int]],
                 timeout_s: float | None = None) -> None:
    """Close ``groups`` on the given members (a worker that is not in a group skips it)."""
    per_worker: dict[int, list[str]] = {}
    for name, members in groups.items():
        for d in members:
            per_worker.setdefault(d, []).append(name)
    pool.run({d: (_leave_all, (names,)) for d, names in per_worker.items()}, timeout_s)


