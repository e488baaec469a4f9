"""Checkpoints of model-stage state with torch.distributed.checkpoint (DCP), resharded on load.

Why DCP: a checkpoint saved in one layout must load into any other (the job restores into the
layout it runs *now*). Each position's shards are described as DTensors over device meshes of
its TP group (``Shard(dim)`` for split tensors, ``(Shard, Replicate)`` on a (kv, tp / kv) mesh
for replicated KV heads, ``Replicate`` for norms), with the padded vocabulary as the global
shape; DCP stores the chunks once (replicas are deduplicated) and each loading position reads
exactly the chunk it needs, whatever layout saved it. Different pipeline blocks hold different
keys; the tied LM-head copy is saved once (as the embedding) and loaded from it.

DCP runs collectives through the default process group, so a checkpoint operation creates one
for its participants (TCPStore + PrefixStore rendezvous hosted by the driver) and destroys it
when done; the transition communicators never need one.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nereus.runtime.comm import Rendezvous, StoreAddress
from nereus.runtime.movement import META_BYTES, _meta_from, _meta_tensor
from nereus.runtime.state import ShardedState, StateMeta, StateSpec
from nereus.runtime.workers import GRACE_S, WorkerContext, WorkerPool
from nereus.spec.sharding import EMBED, LM_HEAD, is_kv
from nereus.transition.emu import Emu

if TYPE_CHECKING:
    from torch.distributed.tensor import Placement

_ASIDE = re.compile(r"\.step-(?P<tag>.+)\.(?P<kind>partial|old)-(?P<stamp>\d+)")
COMPLETE = "COMPLETE"  # marker written after every model-stage of a checkpoint is saved
DCP_METADATA = ".metadata"  # what torch.distributed.checkpoint's FileSystemWriter writes last
# bytes/s: the slowest rate at which a live worker is assumed to write or read its part of a
# checkpoint (an assumption, as the executor's SLOW_BW): a call slower than a full worker's
# bytes at this rate, beyond the collectives' timeout, is taken as hung
SLOW_IO_BW = 50e6


def _init_default_group(ctx: WorkerContext, store: StoreAddress, prefix: str, rank: int,
                        world: int, timeout_s: float) -> None:
    timeout = datetime.timedelta(seconds=timeout_s)
    client = dist.TCPStore(store.host, store.port, None, False, timeout)
    backend = "cpu:gloo,cuda:nccl" if ctx.device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.PrefixStore(prefix, client), rank=rank,
                            world_size=world, timeout=timeout)


def _state_dict(st: ShardedState, base: int, for_load: bool) -> dict[str, Any]:
    """DTensor views of a position's arena keyed ``<kind>/<logical name>``, plus the scalars."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    model = st.spec.model
    tp = st.tp
    _, r = st.position
    tp_group = [base + r * tp + i for i in range(tp)]
    meshes: dict[tuple[tuple[int, ...], ...], Any] = {}

    def mesh(rows: list[list[int]]) -> Any:
        key = tuple(tuple(x) for x in rows)
        if key not in meshes:
            ranks = torch.tensor(rows if len(rows) > 1 else rows[0], dtype=torch.int)
            meshes[key] = DeviceMesh(st.device.type, ranks, _init_backend=False)
        return meshes[key]

    kv_rep = model.num_kv_heads < tp
    sd: dict[str, Any] = {}
    for e in st.layout.entries:
        sh = e.shard
        if sh.name == LM_HEAD and sh.logical == EMBED and not for_load:
            continue  # the tied copy: saved once, as the embedding
        local = st.tensor(e.kind, sh.name)
        shape = list(sh.full_shape)
        placements: list[Placement]
        if sh.split_dim is None:
            m, placements = mesh([tp_group]), [Replicate()]
        elif kv_rep and is_kv(sh.logical):
            rep = tp // model.num_kv_heads
            rows = [tp_group[h * rep:(h + 1) * rep] for h in range(model.num_kv_heads)]
            m, placements = mesh(rows), [Shard(sh.split_dim), Replicate()]
        else:
            shape[sh.split_dim] = (sh.stop - sh.start) * tp  # padded vocabulary rows
            m, placements = mesh([tp_group]), [Shard(sh.split_dim)]
        stride = torch.empty(shape, device="meta").stride()
        sd[f"{e.kind}/{sh.logical}"] = DTensor.from_local(
            local, m, placements, run_check=False, shape=torch.Size(shape), stride=stride)
    return sd


def dcp_save(ctx: WorkerContext, unit_id: str, path: str, store: StoreAddress, prefix: str,
             rank: int, world: int, timeout_s: float = 120.0, sync_files: bool = True) -> float:
    """This worker's part of saving one unit (DCP); returns its seconds."""
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    st = ctx.units[unit_id]
    _init_default_group(ctx, store, prefix, rank, world, timeout_s)
    try:
        sd = _state_dict(st, 0, for_load=False)
        sd["meta"] = _meta_tensor(st.meta, ctx.device)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(path, sync_files=sync_files))
    finally:
        dist.destroy_process_group()
    return time.perf_counter() - t0


def dcp_load(ctx: WorkerContext, unit_id: str, spec: StateSpec, layout: tuple[int, int],
             position: tuple[int, int], base: int, path: str, store: StoreAddress, prefix: str,
             rank: int, world: int, timeout_s: float = 120.0) -> float:
    """This worker's part of loading one position of a unit in any layout (DCP reshards).
    A worker that already holds ``unit_id`` refuses before it allocates or loads anything."""
    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    if unit_id in ctx.units:
        raise KeyError(f"worker {ctx.device_id} already holds unit {unit_id}")
    target = ctx.allocate(spec, *layout, *position, StateMeta(), f"restore {unit_id}")
    try:
        _init_default_group(ctx, store, prefix, rank, world, timeout_s)
        try:
            sd = _state_dict(target, base, for_load=True)
            meta = torch.zeros(META_BYTES, dtype=torch.uint8, device=ctx.device)
            sd["meta"] = meta
            dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
        finally:
            dist.destroy_process_group()
        target.meta = _meta_from(meta)
        target.zero_padding()
        ctx.hold(unit_id, target)
    except BaseException:
        ctx.free(target)
        raise
    return time.perf_counter() - t0


class Checkpointer:
    """Saves model-stage state under ``root/step-<tag>/<stage>`` and restores it resharded.
    ``sync_files``: fsync every file written (off only where durability does not matter)."""

    def __init__(self, root: str | Path, timeout_s: float = 120.0, sync_files: bool = True):
        self.root = Path(root)
        self.timeout_s = timeout_s
        self.sync_files = sync_files

    def save(self, pool: WorkerPool, units: Mapping[str, Sequence[Emu]], tag: int | str
             ) -> Path:
        """Save one unit of each model-stage (all its positions take part); returns the
        checkpoint folder, marked complete once every stage is written.

        It is written beside the checkpoint it replaces and swapped in only when complete, so
        a save that fails halfway leaves the previous checkpoint of that tag as it was."""
        self._finish_swaps()
        where = self.root / f"step-{tag}"
        stamp = time.time_ns()
        partial = self.root / f".step-{tag}.partial-{stamp}"
        partial.mkdir(parents=True)
        try:
            with Rendezvous(timeout_s=self.timeout_s) as rv:
                for stage, es in units.items():
                    if es:
                        self._save_unit(pool, es[0], partial / stage, rv)
            (partial / COMPLETE).write_text(str(tag))
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        old = self.root / f".step-{tag}.old-{stamp}"
        if where.exists():
            os.replace(where, old)
        os.replace(partial, where)
        shutil.rmtree(old, ignore_errors=True)
        return where

    def _finish_swaps(self) -> None:
        """Complete the swaps a crash interrupted. ``save`` moves the old ``step-<tag>`` aside
        to ``.step-<tag>.old-*``, renames the complete ``.step-<tag>.partial-*`` into its place
        and removes the old one: a crash between the renames leaves no ``step-<tag>``, and the
        newest complete partial (else the newest complete old copy) goes back in. Complete
        copies left beside a ``step-<tag>`` (a crash before the removal, or before the swap of
        a save that never returned) go. An incomplete partial may be a save still writing and
        is left alone."""
        if not self.root.is_dir():
            return
        aside: dict[str, list[tuple[bool, int, Path]]] = {}  # tag -> (partial?, stamp, path)
        for p in self.root.glob(".step-*"):
            m = _ASIDE.fullmatch(p.name)
            if m and (p / COMPLETE).is_file():
                aside.setdefault(m["tag"], []).append((m["kind"] == "partial", int(m["stamp"]),
                                                       p))
        for tag, copies in aside.items():
            where = self.root / f"step-{tag}"
            if not where.exists():
                _, _, best = max(copies)
                os.replace(best, where)
                copies = [c for c in copies if c[2] != best]
            for _, _, p in copies:
                shutil.rmtree(p, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None (a swap a crash interrupted is finished
        first). Tagged by step, the newest is the highest step: a file's time can tie (a
        file system with coarse timestamps, two saves in one tick) or lie (a copied
        directory). Other tags go by the time their checkpoint completed."""
        self._finish_swaps()
        done = [p for p in self.root.glob("step-*") if (p / COMPLETE).is_file()]
        if not done:
            return None
        tags = [p.name[len("step-"):] for p in done]
        if all(t.isascii() and t.isdigit() for t in tags):
            return max(zip(tags, done), key=lambda tp: int(tp[0]))[1]
        return max(done, key=lambda p: (p / COMPLETE).stat().st_mtime_ns)

    def holds(self, where: Path, stage: str) -> bool:
        """Whether the checkpoint ``where`` has ``stage``'s state: its folder with the
        metadata DCP writes last (and reads first), so a folder whose save never finished,
        or whose metadata is gone, is refused before a restore depends on it."""
        return (where / stage / DCP_METADATA).is_file()

    def restore(self, pool: WorkerPool, stage: str, units: Sequence[Emu], spec: StateSpec,
                where: Path | None = None) -> float:
        """Load ``stage`` into ``units`` (any layout, any number of replicas); seconds taken."""
        where = where or self.latest()
        if where is None or not self.holds(where, stage):
            raise FileNotFoundError(f"no checkpoint of {stage} under {self.root}")
        t0 = time.perf_counter()
        self._load(pool, units, spec, where / stage)
        return time.perf_counter() - t0

    def rebuild(self, pool: WorkerPool, source: Emu, units: Sequence[Emu], spec: StateSpec
                ) -> float:
        """Make ``units`` (a model-stage that holds a copy of a model's θ, such as generation)
        from ``source``, an intact unit of the stage that trains that model, in any layout:
        the source is written to a scratch folder under ``root`` and read back resharded into
        ``units``, which take its θ and leave its optimizer state (DCP reads the keys asked
        for). The folder is removed after, also on failure. Seconds taken."""
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        folder = self.root / f".rebuild-{source.stage}-{time.time_ns()}"
        try:
            with Rendezvous(timeout_s=self.timeout_s) as rv:
                self._save_unit(pool, source, folder, rv)
            self._load(pool, units, spec, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return time.perf_counter() - t0

    def _save_unit(self, pool: WorkerPool, unit: Emu, folder: Path, rv: Rendezvous) -> None:
        """Every position of ``unit`` writes its part of one DCP checkpoint into ``folder``."""
        prefix = f"ckpt-save/{unit.stage}/{time.time_ns()}/"
        pool.run({g: (dcp_save, (unit.id, str(folder), rv.address, prefix, i, len(unit.gpus),
                                 self.timeout_s, self.sync_files))
                  for i, g in enumerate(unit.gpus)}, self.due_s(pool))

    def _load(self, pool: WorkerPool, units: Sequence[Emu], spec: StateSpec, folder: Path
              ) -> None:
        """Every position of ``units`` reads its part from the DCP checkpoint in ``folder``."""
        world = sum(len(e.gpus) for e in units)
        calls = {}
        base = 0
        with Rendezvous(timeout_s=self.timeout_s) as rv:
            prefix = f"ckpt-load/{units[0].stage if units else ''}/{time.time_ns()}/"
            for e in units:
                lay = (e.layout.tp, e.layout.pp)
                for i, g in enumerate(e.gpus):
                    calls[g] = (dcp_load, (e.id, spec, lay, e.position(i), base, str(folder),
                                           rv.address, prefix, base + i, world,
                                           self.timeout_s))
                base += len(e.gpus)
            pool.run(calls, self.due_s(pool))

    def due_s(self, pool: WorkerPool) -> float:
        """How long a worker's save or load call may take before it counts as hung
        (``WorkerCallsFailed`` naming it): the collectives' timeout, a full worker's bytes
        (its capacity) at ``SLOW_IO_BW``, and ``GRACE_S``."""
        return self.timeout_s + pool.capacity_bytes / SLOW_IO_BW + GRACE_S
