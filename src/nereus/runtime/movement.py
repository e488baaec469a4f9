"""What each primitive does inside one worker (run through ``call``): the real data movement.

- Split: the members of one enclosing TP/PP block all-gather their whole arenas, bucket by
  bucket (contiguous byte ranges of the arena: nothing is packed on the sending side), and each
  cuts its T_sub shard out of what arrived. The source arena stays until the last all-gather.
- Merge: local slicing of the new, smaller shard out of the replica the worker holds; no
  collective.
- Extend: the source position broadcasts its arena as one contiguous buffer to the
  rank-aligned device of the new unit, over a two-member communicator; the receiver's tensors
  are views of the buffer it received.
- Destroy: drop the arena and release its bytes.
Every function reserves bytes before it allocates (``CapacityError`` past capacity), joins and
leaves its communicator itself, and reports what it measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nereus.runtime.comm import Group, GroupSpec, join_group, leave_group
from nereus.runtime.state import (
    ArenaEntry,
    ArenaLayout,
    Coverage,
    ShardedState,
    StateMeta,
    StateSpec,
    arena_layout,
    copy_block,
)
from nereus.spec.sharding import Shard
from nereus.runtime.workers import WorkerContext

META_BYTES = 16 * 1024  # fixed size of the scalars' message (JSON; the RNG state is ~7 KB)
BUCKET_BYTES = 64 * 1024**2  # all-gather chunk of Split
MIN_BUCKET_BYTES = 64 * 1024  # smallest chunk the executor shrinks to under memory pressure


@dataclass(frozen=True)
class MoveResult:
    """What one worker measured for its part of a primitive (seconds, bytes)."""

    device_id: int
    setup_s: float         # communicator set-up (0 without one)
    move_s: float          # collectives and local copies
    total_s: float         # the whole call inside the worker
    bytes_sent: int
    bytes_received: int
    held_after: int        # bytes the worker holds when done
    peak: int              # the worker's peak held bytes so far
    meta_digest: str = ""
    detail: tuple[tuple[str, float], ...] = ()  # seconds by part (e.g. collective, copy)


def _sync(ctx: WorkerContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _result(ctx: WorkerContext, t0: float, setup: float, move: float, sent: int, recv: int,
            digest: str = "", detail: dict[str, float] | None = None) -> MoveResult:
    _sync(ctx)
    st = ctx.memory.stats()
    return MoveResult(ctx.device_id, setup, move, time.perf_counter() - t0, sent, recv,
                      st.held, st.peak, digest, tuple(sorted((detail or {}).items())))


# ---------------------------------------------------------------- Split
def _row_bytes(e: ArenaEntry) -> int:
    rows = e.shard.local_shape[0] if e.shard.local_shape else 1
    return e.nbytes // max(rows, 1)


def bucket_ranges(layout: ArenaLayout, bucket_bytes: int) -> list[tuple[int, int]]:
    """The arena cut into contiguous byte ranges of at most ``bucket_bytes`` (or one row, when
    a row is larger), cut only at row boundaries of its tensors, so a receiver can place every
    piece it gets without waiting for the rest of a tensor."""
    out: list[tuple[int, int]] = []
    lo: int | None = None
    end = 0
    for e in layout.entries:
        if e.nbytes == 0:
            continue
        rb = _row_bytes(e)
        rows = e.nbytes // rb
        r = 0
        while r < rows:
            pos = e.offset + r * rb
            if lo is None:
                lo = pos
            take = min(rows - r, (lo + bucket_bytes - pos) // rb)
            if take <= 0:
                if pos > lo:
                    out.append((lo, pos))
                    lo = pos
                    continue
                take = 1  # one row larger than a bucket
            r += take
            end = e.offset + r * rb
            if end - lo >= bucket_bytes:
                out.append((lo, end))
                lo = None
    if lo is not None and end > lo:
        out.append((lo, end))
    return out


def _chunk_sizes(spec: StateSpec, tp: int, pp: int, member_positions: Sequence[tuple[int, int]],
                 bucket_bytes: int) -> tuple[list[list[tuple[int, int]]], list[int]]:
    plans = [bucket_ranges(arena_layout(spec, tp, pp, t, r), bucket_bytes)
             for t, r in member_positions]
    n = max(len(p) for p in plans)
    return plans, [max((p[b][1] - p[b][0]) if b < len(p) else 0 for p in plans)
                   for b in range(n)]


def split_workspace_bytes(spec: StateSpec, tp: int, pp: int,
                          member_positions: Sequence[tuple[int, int]],
                          bucket_bytes: int = BUCKET_BYTES) -> int:
    """Buffers of one member's all-gathers: two rounds in flight of one chunk per member."""
    _, sizes = _chunk_sizes(spec, tp, pp, member_positions, bucket_bytes)
    return 2 * len(member_positions) * max(sizes, default=0)


def split_member(ctx: WorkerContext, group: GroupSpec, src_id: str, out_id: str,
                 sub_layout: tuple[int, int], member_positions: tuple[tuple[int, int], ...],
                 bucket_bytes: int = BUCKET_BYTES) -> MoveResult:
    """This worker's part of Split: all-gather inside ``group``, keep the T_sub shard."""
    t0 = time.perf_counter()
    src = ctx.units[src_id]
    spec, tp, pp = src.spec, src.tp, src.pp
    tp_sub, pp_sub = sub_layout
    m_tp, m_pp = tp // tp_sub, pp // pp_sub
    t, r = src.position
    ta = time.perf_counter()
    target = ctx.allocate(spec, tp_sub, pp_sub, t // m_tp, r // m_pp, src.meta,
                          f"split {src_id} -> {out_id}")
    t_alloc = time.perf_counter() - ta
    plans, sizes = _chunk_sizes(spec, tp, pp, member_positions, bucket_bytes)
    size = len(member_positions)
    work_bytes = 2 * size * max(sizes, default=0)  # per member and round in flight
    held_work = False
    g: Group | None = None
    try:
        ctx.memory.reserve(work_bytes, f"split {src_id} all-gather buffers")
        held_work = True
        work = torch.empty(work_bytes, dtype=torch.uint8, device=ctx.device)
        g = join_group(ctx, group)
        setup = g.setup_s
        tm = time.perf_counter()
        me = g.rank
        cov = Coverage()
        targets: dict[tuple[str, str], list[tuple[torch.Tensor, Shard, tuple[str, str]]]] = {}
        for e in target.layout.entries:
            targets.setdefault((e.kind, e.shard.logical), []).append(
                (target.tensor(e.kind, e.shard.name), e.shard, e.key))
        layouts = [arena_layout(spec, tp, pp, pt, pr) for pt, pr in member_positions]
        sent = received = 0
        send: torch.Tensor | None = None
        outs: list[torch.Tensor] = []
        pending: Any = None
        t_coll = t_copy = 0.0
        step = size * max(sizes, default=0)  # two sets of chunk slots: receive one, place one

        def start(b: int) -> tuple[list[torch.Tensor], list[Any], torch.Tensor | None]:
            bsize = sizes[b]
            base = (b % 2) * step
            outs = [work[base + m * bsize:base + (m + 1) * bsize] for m in range(size)]
            lo, hi = plans[me][b] if b < len(plans[me]) else (0, 0)
            if ctx.device.type == "cuda":  # NCCL: an in-place all-gather into one buffer
                outs[me][:hi - lo].copy_(src.buffer[lo:hi])
                g.all_gather_into(work[base:base + size * bsize], outs[me])
                return outs, [], None
            if lo + bsize <= src.nbytes:
                own = src.buffer[lo:lo + bsize]  # a run of the arena itself, no packing
            else:  # the last chunk of a smaller arena: padded in this member's own slot
                own = outs[me]
                own[:hi - lo].copy_(src.buffer[lo:hi])
            outs[me] = own
            # gloo: every member broadcasts its chunk while receiving the others' (its
            # allgather would copy through temporary buffers)
            return outs, g.start_all_gather_by_broadcast(outs), own

        pending = start(0) if sizes else None
        for b in range(len(sizes)):
            tc = time.perf_counter()
            outs, works, send = pending  # type: ignore[misc]
            g.wait(works)
            pending = start(b + 1) if b + 1 < len(sizes) else None  # overlaps the copies
            tp_ = time.perf_counter()
            t_coll += tp_ - tc
            sent += sizes[b]
            received += sizes[b] * (size - 1)
            for m in range(size):
                if b < len(plans[m]):
                    _place_chunk(outs[m], plans[m][b], layouts[m], targets, cov)
            t_copy += time.perf_counter() - tp_
        missing = cov.missing(target.layout)
        if missing:
            raise RuntimeError(f"split {src_id}: position not covered: {missing[:4]}")
        target.zero_padding()
        _sync(ctx)
        move = time.perf_counter() - tm
    except BaseException:
        ctx.free(target)
        raise
    finally:
        if g is not None:
            leave_group(ctx, group.name)
        if held_work:
            del work
            ctx.memory.release(work_bytes)
    del src, send, outs, pending  # nothing may view the source when dropped (memory reuse)
    ctx.drop(src_id)  # the source lives until its all-gathers ended
    ctx.hold(out_id, target)
    return _result(ctx, t0, setup, move, sent, received, target.meta.digest(),
                   {"allgather_s": t_coll, "copy_s": t_copy, "alloc_s": t_alloc})


def _place_chunk(chunk: torch.Tensor, span: tuple[int, int], layout: ArenaLayout,
                 targets: dict[tuple[str, str], list[tuple[torch.Tensor, Shard, tuple[str, str]]]],
                 cov: Coverage) -> None:
    """Copy every row a member sent in ``chunk`` (its arena bytes ``span``) that the target
    position holds."""
    lo, hi = span
    for e in layout.entries:
        a, b = max(lo, e.offset), min(hi, e.offset + e.nbytes)
        if a >= b:
            continue
        rb = _row_bytes(e)
        ra, rz = (a - e.offset) // rb, (b - e.offset) // rb
        shape = (rz - ra, *e.shard.local_shape[1:])
        rows = chunk[a - lo:b - lo].view(e.dtype).view(shape)
        for dst_view, dst_shard, key in targets.get((e.kind, e.shard.logical), []):
            cov.add(key, copy_block(dst_view, dst_shard, rows, e.shard, ra))


# ---------------------------------------------------------------- Merge
def merge_member(ctx: WorkerContext, src_id: str, out_id: str, layout: tuple[int, int],
                 position: tuple[int, int]) -> MoveResult:
    """This worker's part of Merge: cut the new shard out of the replica it holds."""
    from nereus.runtime.state import assemble

    t0 = time.perf_counter()
    src = ctx.units[src_id]
    target = ctx.allocate(src.spec, layout[0], layout[1], position[0], position[1], src.meta,
                          f"merge {src_id} -> {out_id}")
    try:
        assemble(target, [src])
        _sync(ctx)
    except BaseException:
        ctx.free(target)
        raise
    move = time.perf_counter() - t0
    del src
    ctx.drop(src_id)
    ctx.hold(out_id, target)
    return _result(ctx, t0, 0.0, move, 0, 0, target.meta.digest())


# ---------------------------------------------------------------- Extend
def _meta_tensor(meta: StateMeta | None, device: torch.device) -> torch.Tensor:
    buf = torch.zeros(META_BYTES, dtype=torch.uint8)
    if meta is not None:
        raw = meta.to_bytes()
        if len(raw) + 8 > META_BYTES:
            raise ValueError(f"state scalars take {len(raw)} bytes, more than {META_BYTES - 8}")
        buf[:8] = torch.tensor(list(len(raw).to_bytes(8, "little")), dtype=torch.uint8)
        buf[8:8 + len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return buf.to(device)


def _meta_from(buf: torch.Tensor) -> StateMeta:
    raw = bytes(buf.cpu().tolist())
    n = int.from_bytes(raw[:8], "little")
    return StateMeta.from_bytes(raw[8:8 + n])


def extend_member(ctx: WorkerContext, group: GroupSpec, src_id: str | None, out_id: str,
                  spec: StateSpec, layout: tuple[int, int],
                  position: tuple[int, int]) -> MoveResult:
    """This worker's part of Extend: rank 0 (``src_id`` given) broadcasts its arena to rank 1,
    which keeps it as unit ``out_id``."""
    t0 = time.perf_counter()
    sending = src_id is not None
    target: ShardedState | None = None
    if sending:
        state = ctx.units[src_id]  # type: ignore[index]
        buf = state.buffer
        meta_t = _meta_tensor(state.meta, ctx.device)
    else:
        target = ctx.allocate(spec, layout[0], layout[1], position[0], position[1], StateMeta(),
                              f"extend -> {out_id}")
        buf = target.buffer
        meta_t = _meta_tensor(None, ctx.device)
    g: Group | None = None
    try:
        g = join_group(ctx, group)
        setup = g.setup_s
        tm = time.perf_counter()
        g.broadcast(meta_t, src=0)
        g.broadcast(buf, src=0)  # the whole position, one contiguous buffer
        _sync(ctx)
        move = time.perf_counter() - tm
        if target is not None:
            target.meta = _meta_from(meta_t)
    except BaseException:
        if target is not None:
            ctx.free(target)
        raise
    finally:
        if g is not None:
            leave_group(ctx, group.name)
    n = buf.numel()
    if target is not None:
        ctx.hold(out_id, target)
        return _result(ctx, t0, setup, move, 0, n, target.meta.digest())
    return _result(ctx, t0, setup, move, n, 0)


# ---------------------------------------------------------------- Destroy and inspection
def destroy_member(ctx: WorkerContext, unit_id: str) -> MoveResult:
    t0 = time.perf_counter()
    if unit_id not in ctx.units:
        raise KeyError(f"worker {ctx.device_id} holds no unit {unit_id}")
    ctx.drop(unit_id)
    return _result(ctx, t0, 0.0, time.perf_counter() - t0, 0, 0)


def export_unit(ctx: WorkerContext, unit_id: str) -> ShardedState:
    """A CPU copy of this worker's shard of a unit (for gather and checks)."""
    return ctx.units[unit_id].cpu_copy()


def held_units(ctx: WorkerContext) -> dict[str, int]:
    return {k: v.nbytes for k, v in ctx.units.items()}


def place_seeded(ctx: WorkerContext, unit_id: str, spec: StateSpec, layout: tuple[int, int],
                 position: tuple[int, int], seed: int, warm: bool = True) -> int:
    """Build this worker's position of a seeded unit in place (bytes counted)."""
    from nereus.runtime.loading import fill_seeded

    st = ctx.allocate(spec, *layout, *position, StateMeta(), f"seeded {unit_id}")
    try:
        fill_seeded(st, seed, warm)
        ctx.hold(unit_id, st)
    except BaseException:
        ctx.free(st)
        raise
    return st.nbytes


def place_safetensors(ctx: WorkerContext, unit_id: str, path: str, spec: StateSpec,
                      layout: tuple[int, int], position: tuple[int, int], seed: int = 0) -> int:
    """Build this worker's position of a unit from a Hugging Face checkpoint (bytes counted)."""
    from nereus.runtime.loading import load_safetensors

    n = arena_layout(spec, *layout, *position).nbytes
    ctx.memory.reserve(n, f"checkpoint {unit_id}")
    try:
        st = load_safetensors(path, spec, layout[0], layout[1], position[0], position[1], seed,
                              ctx.device)
        ctx.hold(unit_id, st)
    except BaseException:
        ctx.memory.release(n)
        raise
    return n


def verify_seeded(ctx: WorkerContext, unit_id: str, seed: int, warm: bool = True) -> str | None:
    """Compare this worker's shard bitwise with the seeded state it should hold; None if equal.
    Lets a benchmark check a large state without gathering it in one process."""
    from nereus.runtime.loading import seeded_difference

    st = ctx.units[unit_id]
    diff = seeded_difference(st, seed, warm)
    return None if diff is None else f"{unit_id} at {st.position} on {ctx.device_id}: {diff}"
