"""Helpers for the engine tests: a seeded logical state, its shards, and their reassembly;
a replica's positions as threads over in-process gloo groups.

These stand in for the runtime's ``ShardedState`` where a test needs shards in the driver
process; they follow ``nereus.spec.sharding.shard_plan`` and nothing else.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
import torch
import torch.distributed as dist

from nereus.engine.groups import ParallelGroups, Position
from nereus.runtime.comm import Rendezvous
from nereus.runtime.workers import WorkerPool
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import Shard, logical_params, shard_plan


def logical_state(spec: ModelSpec, head: Head, seed: int, dtype: torch.dtype = torch.float32
                  ) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for p in logical_params(spec, head):
        if len(p.shape) == 1:
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        else:
            t = torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5)
        out[p.name] = t.to(dtype)
    return out


def slice_shard(full: torch.Tensor, s: Shard) -> torch.Tensor:
    if s.split_dim is None:
        return full.clone()
    n = s.valid_len
    part = full.narrow(s.split_dim, s.start, n) if n else full.narrow(s.split_dim, 0, 0)
    if n == s.stop - s.start:
        return part.clone()
    shape = list(full.shape)
    shape[s.split_dim] = s.stop - s.start
    out = torch.zeros(shape, dtype=full.dtype)
    out.narrow(s.split_dim, 0, n).copy_(part)
    return out


def shards_for(full: dict[str, torch.Tensor], spec: ModelSpec, head: Head, tp: int, pp: int,
               tp_rank: int, pp_rank: int) -> dict[str, torch.Tensor]:
    return {s.name: slice_shard(full[s.logical], s)
            for s in shard_plan(spec, head, tp, pp, tp_rank, pp_rank)}


def gather_logical(parts: dict[tuple[int, int], dict[str, torch.Tensor]], spec: ModelSpec,
                   head: Head, tp: int, pp: int) -> dict[str, torch.Tensor]:
    """Reassemble the logical tensors from every position's shards (first holder wins)."""
    out: dict[str, torch.Tensor] = {}
    for p in logical_params(spec, head):
        out[p.name] = torch.zeros(p.shape)
    for (t, r), shards in parts.items():
        for s in shard_plan(spec, head, tp, pp, t, r):
            if s.name != s.logical:      # tied copy on the last block: the embedding is logical
                continue
            src = shards[s.name].float()
            if s.split_dim is None:
                out[s.logical] = src.clone()
            elif s.valid_len:
                out[s.logical].narrow(s.split_dim, s.start, s.valid_len).copy_(
                    src.narrow(s.split_dim, 0, s.valid_len))
    return out


# ---------------------------------------------------------------- runtime helpers
def layout_emus(stage: str, tp: int, pp: int, dp: int, tag: str, trainable: bool,
                first_gpu: int = 0) -> list:
    """``dp`` EMUs of (tp, pp) on consecutive GPU ids, ids ``<stage>/<tag><d>``."""
    from nereus.cost.candidate import Layout
    from nereus.transition.emu import Emu, Holds

    holds = Holds.THETA_OMEGA if trainable else Holds.THETA
    size = tp * pp
    return [Emu(f"{stage}/{tag}{d}", stage, stage.split("_")[0], Layout(tp, pp),
                tuple(range(first_gpu + d * size, first_gpu + (d + 1) * size)), holds)
            for d in range(dp)]


def place_seeded_units(pool, emus, sspec, seed: int, warm: bool = True) -> None:
    from nereus.runtime.movement import place_seeded

    pool.run({dev: (place_seeded, (e.id, sspec, (e.layout.tp, e.layout.pp), e.position(i),
                                   seed, warm))
              for e in emus for i, dev in enumerate(e.gpus)})


def drop_units(pool, emus) -> None:
    from nereus.runtime.movement import destroy_member

    pool.run({dev: (destroy_member, (e.id,)) for e in emus for dev in e.gpus})


def gather_unit(pool, emu):
    from nereus.runtime.movement import export_unit
    from nereus.runtime.state import gather

    parts = pool.run({dev: (export_unit, (emu.id,)) for dev in emu.gpus})
    return gather(list(parts.values()))


# ---------------------------------------------------------------- in-process replicas
class Tapped:
    """A process group that calls ``tap(op)`` before each send, recv, allreduce and broadcast
    it forwards (a test's hook into the order of a worker's calls)."""

    def __init__(self, pg: Any, tap: Callable[[str], None]) -> None:
        self._pg, self._tap = pg, tap

    def send(self, *args: Any) -> Any:
        self._tap("send")
        return self._pg.send(*args)

    def recv(self, *args: Any) -> Any:
        self._tap("recv")
        return self._pg.recv(*args)

    def allreduce(self, *args: Any) -> Any:
        self._tap("allreduce")
        return self._pg.allreduce(*args)

    def broadcast(self, *args: Any) -> Any:
        self._tap("broadcast")
        return self._pg.broadcast(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pg, name)


class FirstCalls:
    """A tap that records the first call of each kind: ``event(key)`` is set once a call of
    ``key`` was made (before it is forwarded); as ``on_replica``'s tap the key is (group,
    pp_rank, op), as ``Tapped``'s the op. "collective" stands for allreduce or broadcast."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._events: dict[Any, Any] = {}

    def event(self, *key: Any) -> Any:
        import threading

        with self._lock:
            return self._events.setdefault(key, threading.Event())

    def __call__(self, *key: Any) -> None:
        *where, op = key
        if where and isinstance(where[-1], Position):   # on_replica's (group, pos, op)
            where[-1] = where[-1].pp_rank
        self.event(*where, op).set()
        if op in ("allreduce", "broadcast"):
            self.event(*where, "collective").set()


def gloo_group(store: Any, prefix: str, rank: int, size: int, timeout_s: float = 30.0) -> Any:
    """One member of an in-process gloo group (a HashStore rendezvous), None for size 1."""
    import datetime

    if size == 1:
        return None
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, opts)


def in_threads(n: int, fn: Callable[[int], Any], timeout_s: float = 30.0) -> dict[int, Any]:
    """``fn(i)`` for i < n, one daemon thread each; results by i. The lowest i's error is
    raised; a thread still blocked after 3 x ``timeout_s`` (a gloo timeout) fails the test."""
    import threading

    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3 * timeout_s)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[min(errors)]
    return results


def on_replica(spec: ModelSpec, head: Head, tp: int, pp: int,
               fn: Callable[[Position, dict[str, torch.Tensor], ParallelGroups], Any],
               seed: int = 1, tap: Callable[[str, Position, str], None] | None = None
               ) -> dict[tuple[int, int], Any]:
    """``fn(pos, shards, groups)`` on every position of one (tp, pp) replica of a seeded
    ``spec``, one thread each over in-process gloo groups (the real collectives and
    point-to-point calls, no worker processes); results by (pp_rank, tp_rank).
    ``tap(group, pos, op)``: called before each call a position makes on its tp or pp group."""
    store = dist.HashStore()
    full = logical_state(spec, head, seed=seed)

    def one(i: int) -> Any:
        r, t = divmod(i, tp)
        pos = Position(tp, pp, 1, t, r, 0)

        def group(kind: str, prefix: str, rank: int, size: int) -> Any:
            pg = gloo_group(store, prefix, rank, size)
            if pg is None or tap is None:
                return pg
            return Tapped(pg, lambda op: tap(kind, pos, op))

        groups = ParallelGroups(tp=group("tp", f"tp/{r}/", t, tp),
                                pp=group("pp", f"pp/{t}/", r, pp),
                                pp_grad=group("pp_grad", f"ppg/{t}/", r, pp),
                                stage=group("stage", "stage/", i, tp * pp))
        return fn(pos, shards_for(full, spec, head, tp, pp, t, r), groups)

    out = in_threads(tp * pp, one)
    return {divmod(i, tp): v for i, v in out.items()}


@contextmanager
def worker_session(workers: int, rv_timeout_s: float | None = None
                   ) -> Iterator[tuple[WorkerPool, Rendezvous]]:
    """A Ray session with ``workers`` CPU workers and a rendezvous (``rv_timeout_s``: its
    communicators' timeout; the default where None), for one test module. Afterwards, also
    when a test failed: the workers stopped (those still blocked too), Ray shut down, the
    rendezvous port free again and every worker process gone."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             resources={"nereus_slot": workers})
    pool = rv = None
    pids: list[int] = []
    try:
        pool = WorkerPool.start(workers, kind="cpu")
        pids = [i.pid for i in pool.infos().values()]
        rv = (Rendezvous("127.0.0.1") if rv_timeout_s is None
              else Rendezvous("127.0.0.1", timeout_s=rv_timeout_s))
        yield pool, rv
    finally:
        port = rv.port if rv is not None else None
        if rv is not None:
            rv.close()
        if pool is not None:
            pool.shutdown()
        ray.shutdown()
        if port is not None:   # the rendezvous port is free again
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
        assert _all_gone(pids), "worker processes outlived the Ray session"


def _all_gone(pids: list[int], timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False
