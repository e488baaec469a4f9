"""What each primitive does inside one worker (run through ``call``): the real data movement.

- Split: the members of one enclosing TP/PP block all-gather their whole arenas, bucket by
  bucket (contiguous byte ranges of the arena: nothing is packed on the sending side), and each
  cuts its T_sub shard out of what arrived. The source arena stays until the last all-gather.
- Merge: local slicing of the new, smaller shard out of the replica the worker holds; no
  collective.
- Staged (``staged=True``, a Split or Merge too big for the device by itself): the worker first
  copies its source position to host memory (pinned on CUDA; not counted on the device) and
  drops it on the device, then allocates the new shard and fills it from the host copy. A
  staged Split sends from device memory (NCCL needs it): from the pieces of its own already
  placed in the new arena, or through the staging window for strided ones. If the primitive
  fails after the drop, the source goes back onto the device from the host copy (the partial
  new shard freed first) before the error is raised, so a failure loses nothing that was held.
- Extend: the source position broadcasts its arena as one contiguous buffer to the
  rank-aligned device of the new unit, over a two-member communicator; the receiver's tensors
  are views of the buffer it received.
- Destroy: drop the arena and release its bytes (an offloaded unit's: its host memory only).
- Offloaded units (the transition planner's idle state, ``nereus.runtime.residency``) live in
  host memory, uncounted; a primitive that reads one loads it first (``loading``), except a
  staged Split or Merge, which takes it from host memory as its host copy (put back
  offloaded if the primitive fails).
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
from nereus.runtime.memory import MemoryStats
from nereus.runtime.splitting import split_segments, staging_bytes
from nereus.runtime.state import (
    Coverage,
    ShardedState,
    StateMeta,
    StateSpec,
    arena_layout,
    copy_block,
)
from nereus.runtime.workers import WorkerContext
from nereus.transition import workspace
from nereus.transition.workspace import WINDOW

META_BYTES = 16 * 1024  # fixed size of the scalars' message (JSON; the RNG state is ~7 KB)
# the all-gather chunk of Split and the smallest the executor shrinks it to under memory
# pressure: the staging formula the transition planner charges (at the smallest) owns them
BUCKET_BYTES = workspace.BUCKET_BYTES
MIN_BUCKET_BYTES = workspace.MIN_BUCKET_BYTES


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
def split_workspace_bytes(spec: StateSpec, tp: int, pp: int,
                          member_positions: Sequence[tuple[int, int]], sub: tuple[int, int],
                          bucket_bytes: int = BUCKET_BYTES) -> int:
    """Staging buffers of one member (``nereus.runtime.splitting``)."""
    return staging_bytes(spec, tp, pp, member_positions, sub, bucket_bytes)


def split_member(ctx: WorkerContext, group: GroupSpec, src_id: str, out_id: str,
                 sub_layout: tuple[int, int], member_positions: tuple[tuple[int, int], ...],
                 bucket_bytes: int = BUCKET_BYTES, staged: bool = False) -> MoveResult:
    """This worker's part of Split: the position-wise all-gather inside ``group`` as a
    sequence of broadcasts straight into the new arena (``nereus.runtime.splitting``).
    ``staged``: the source goes to host memory and is freed on the device first (see the
    module docstring); it comes back from there if the Split fails."""
    t0 = time.perf_counter()
    was_host = src_id in ctx.offloaded
    host = stage_out(ctx, src_id) if staged else None
    try:
        target, setup, move, sent, received, detail = _split_into(
            ctx, group, src_id, host, out_id, sub_layout, member_positions, bucket_bytes)
    except BaseException:
        if host is not None:
            restore(ctx, src_id, host, was_host)
        raise
    # The source stays until the Split settles (``settle_member``). When it goes, nothing may
    # view it (its memory is reused): the group's last operations held its tensors until the
    # backend was destroyed, which ``_split_into`` did before returning.
    ctx.hold(out_id, target)
    ctx.pending[out_id] = (src_id, host, was_host)
    return _result(ctx, t0, setup, move, sent, received, target.meta.digest(), detail)


def _split_into(ctx: WorkerContext, group: GroupSpec, src_id: str, host: ShardedState | None,
                out_id: str, sub_layout: tuple[int, int],
                member_positions: tuple[tuple[int, int], ...], bucket_bytes: int
                ) -> tuple[ShardedState, float, float, int, int, dict[str, float]]:
    """Allocate and fill this member's new arena; the source is ``host`` when staged (the
    device copy is gone), else the held unit. Frees what it allocated when it fails."""
    src = host if host is not None else ctx.units[src_id]
    spec, tp, pp = src.spec, src.tp, src.pp
    tp_sub, pp_sub = sub_layout
    m_tp, m_pp = tp // tp_sub, pp // pp_sub
    t, r = src.position
    # the segments first: layouts that do not nest raise here, before anything is allocated
    segs, local = split_segments(spec, tp, pp, tuple(member_positions), tuple(sub_layout),
                                 bucket_bytes)
    # the staging buffers the planner charged (one formula, ``transition.workspace``): a
    # segment they cannot hold is a bug, raised before anything is allocated
    stage_bytes = staging_bytes(spec, tp, pp, member_positions, sub_layout, bucket_bytes)
    slot = stage_bytes // WINDOW
    staged = [sg.nbytes for sg in segs if sg.dst is None]
    if max(staged, default=0) > slot:
        raise AssertionError(f"split {src_id}: a strided segment of {max(staged)} bytes "
                             f"outgrows the {slot}-byte staging slot the transition layer's "
                             "formula gives; the two no longer agree")
    target = ctx.allocate(spec, tp_sub, pp_sub, t // m_tp, r // m_pp, src.meta,
                          f"split {src_id} -> {out_id}")
    held_stage = False
    stage: torch.Tensor | None = None
    g: Group | None = None
    inflight: list[tuple[int, Any, torch.Tensor | None]] = []
    data: torch.Tensor | None = None
    try:
        ctx.memory.reserve(stage_bytes, f"split {src_id} staging buffers")
        held_stage = True
        stage = torch.empty(stage_bytes, dtype=torch.uint8, device=ctx.device)
        g = join_group(ctx, group)
        setup = g.setup_s
        tm = time.perf_counter()
        me = g.rank
        cov = Coverage()
        entries = target.layout.entries
        own = {(e.kind, e.shard.logical): e for e in src.layout.entries}
        mine = {p.entry for run in segs if run.root == me for p in run.parts}
        # what this member holds itself: copied, not received (from the host copy if staged)
        for i, et in enumerate(entries):
            em = own.get((et.kind, et.shard.logical))
            if em is not None and (i in local or i in mine):
                cov.add(et.key, copy_block(target.tensor(et.kind, et.shard.name), et.shard,
                                           src.tensor(em.kind, em.shard.name), em.shard))
        t_local = time.perf_counter() - tm
        sent = received = 0

        def block(sg: Any) -> tuple[torch.Tensor, tuple[int, ...], torch.dtype]:
            """The column block of the new arena that a strided segment fills, its shape and
            dtype."""
            et = entries[sg.entry]
            view = target.tensor(et.kind, et.shard.name)
            idx = tuple(slice(a - (et.shard.start if d == et.shard.split_dim else 0),
                              b - (et.shard.start if d == et.shard.split_dim else 0))
                        for d, (a, b) in enumerate(sg.box))
            return view[idx], tuple(b - a for a, b in sg.box), et.dtype

        def finish(k: int, work: Any, buf: torch.Tensor | None) -> None:
            g.wait([work])
            run = segs[k]
            if run.root == me:
                return
            for sg in run.parts:
                if buf is not None:  # strided: place the staged rows into the column block
                    dst, shape, dtype = block(sg)
                    dst.copy_(buf.view(dtype).view(shape))
                cov.add(entries[sg.entry].key, sg.box)

        for k, sg in enumerate(segs):
            if len(inflight) >= WINDOW:
                finish(*inflight.pop(0))
            buf: torch.Tensor | None = None
            if sg.root == me:
                if host is None:
                    data = src.buffer[sg.src[0]:sg.src[1]]
                elif sg.dst is not None:  # the same bytes, already placed in the new arena
                    data = target.buffer[sg.dst[0]:sg.dst[1]]
                else:  # strided in the new arena: gathered from its column block there
                    at = (k % WINDOW) * slot  # into a staging slot on the device, so the
                    data = stage[at:at + sg.nbytes]  # host copy is read once, as priced
                    (part,) = sg.parts
                    blk, shape, dtype = block(part)
                    data.view(dtype).view(shape).copy_(blk)
                sent += sg.nbytes
            elif sg.dst is not None:
                data = target.buffer[sg.dst[0]:sg.dst[1]]  # straight into the new arena
                received += sg.nbytes
            else:
                at = (k % WINDOW) * slot
                data = buf = stage[at:at + sg.nbytes]
                received += sg.nbytes
            work = g.start_broadcast(data, sg.root)  # holds ``data`` until destroyed
            inflight.append((k, work, buf))
        while inflight:
            finish(*inflight.pop(0))
        missing = cov.missing(target.layout)
        if missing:
            raise RuntimeError(f"split {src_id}: position not covered: {missing[:4]}")
        target.zero_padding()
        g.settle()  # an abort that ended a broadcast early leaves the arena partial
        move = time.perf_counter() - tm
    except BaseException as e:
        ctx.free(target)
        # Let go of the partial arena before a staged caller puts its source back: the
        # traceback keeps the frames (and their views of it) alive.
        _let_go(e)
        del target, data
        inflight.clear()
        raise
    finally:
        if g is not None:
            leave_group(ctx, group.name)
        if held_stage:
            stage = None
            ctx.memory.release(stage_bytes)
    return target, setup, move, sent, received, {"local_copy_s": t_local,
                                                 "segments": float(len(segs))}


# ---------------------------------------------------------------- Merge
def merge_member(ctx: WorkerContext, src_id: str, out_id: str, layout: tuple[int, int],
                 position: tuple[int, int], staged: bool = False) -> MoveResult:
    """This worker's part of Merge: cut the new shard out of the replica it holds.
    ``staged``: out of a host copy of the replica, which is freed on the device first (see the
    module docstring); it comes back from there if the Merge fails."""
    t0 = time.perf_counter()
    was_host = src_id in ctx.offloaded
    host = stage_out(ctx, src_id) if staged else None
    try:
        target = _merge_into(ctx, host if host is not None else ctx.units[src_id], out_id,
                             layout, position)
    except BaseException:
        if host is not None:
            restore(ctx, src_id, host, was_host)
        raise
    move = time.perf_counter() - t0
    ctx.hold(out_id, target)
    ctx.pending[out_id] = (src_id, host, was_host)  # the source stays until it settles
    return _result(ctx, t0, 0.0, move, 0, 0, target.meta.digest())


# ---------------------------------------------------------------- settling Split and Merge
def settle_member(ctx: WorkerContext, out_id: str, keep: bool) -> int:
    """The second phase of this worker's part of a Split or Merge, sent once every member has
    answered. A member that finished its part drops nothing yet: a Split's groups, and a
    Merge's members, end on their own, and a source dropped where one member finished would be
    lost with the new unit where another failed. ``keep``: every member made its part, so the
    source goes (its device arena, or the host copy of a staged one); else the new arena goes
    and the source stays (put back on the device from the host copy where it was staged).
    A new unit settled before is left as it is. Returns the bytes held after."""
    entry = ctx.pending.pop(out_id, None)
    if entry is not None:
        src_id, host, was_host = entry
        if keep:
            if host is None:
                ctx.drop(src_id)
        else:
            ctx.drop(out_id)
            if host is not None:
                restore(ctx, src_id, host, was_host)
    return ctx.memory.stats().held


def _merge_into(ctx: WorkerContext, src: ShardedState, out_id: str, layout: tuple[int, int],
                position: tuple[int, int]) -> ShardedState:
    """A new arena for ``position`` of ``layout``, cut out of ``src`` tensor by tensor; freed
    when the cut fails."""
    target = ctx.allocate(src.spec, layout[0], layout[1], position[0], position[1], src.meta,
                          f"merge -> {out_id}")
    try:
        cut(target, src)
        _sync(ctx)
    except BaseException as e:
        ctx.free(target)
        _let_go(e)  # as in ``_split_into``
        del target
        raise
    return target


def cut(target: ShardedState, src: ShardedState) -> None:
    """Fill ``target`` from the shard ``src`` (on the device or a host copy) holds of it."""
    from nereus.runtime.state import assemble

    assemble(target, [src])


# ---------------------------------------------------------------- staging through host memory
def _let_go(e: BaseException) -> None:
    """Clear the locals of the frames ``e`` passed through below the one handling it, so
    buffers they viewed are freed now, not when the traceback goes."""
    import traceback

    traceback.clear_frames(e.__traceback__.tb_next if e.__traceback__ else None)


def host_copy(ctx: WorkerContext, st: ShardedState) -> ShardedState:
    """A copy of ``st`` in host memory: pinned when the device is CUDA (copied synchronously),
    a plain CPU tensor on a CPU worker. Not counted in ``ctx.memory`` (device bytes only)."""
    if st.device.type == "cuda":
        buf = torch.empty(st.nbytes, dtype=torch.uint8, pin_memory=True)
        buf.copy_(st.buffer)
    else:
        buf = st.buffer.detach().clone()
    return ShardedState(st.spec, st.tp, st.pp, *st.position, buf, st.meta)


def stage_out(ctx: WorkerContext, unit_id: str) -> ShardedState:
    """Copy a held unit's position to host memory and drop it on the device (its bytes
    released); returns the host copy. An offloaded unit is in host memory already: it is
    taken as it is (nothing copied, no device bytes released)."""
    if unit_id not in ctx.units:
        raise KeyError(f"worker {ctx.device_id} holds no unit {unit_id}")
    host = ctx.take_offloaded(unit_id)
    if host is not None:
        return host
    host = host_copy(ctx, ctx.units[unit_id])
    ctx.drop(unit_id)  # no reference of ours to the device arena is left
    return host


def restore(ctx: WorkerContext, unit_id: str, host: ShardedState,
            offloaded: bool = False) -> None:
    """Put a unit that ``stage_out`` took back under its id (a staged primitive failed: what
    was held before stays held, as it was): on the device from its host copy, or, when it
    was held ``offloaded``, as the host arena it is."""
    if offloaded:
        ctx.hold(unit_id, host, offloaded=True)
        return
    st = ctx.allocate(host.spec, host.tp, host.pp, *host.position, host.meta,
                      f"restore {unit_id} from host memory")
    try:
        st.buffer.copy_(host.buffer)
        _sync(ctx)
        ctx.hold(unit_id, st)
    except BaseException:
        ctx.free(st)
        raise


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
    target: ShardedState | None = None
    if src_id is not None:  # sending
        state = ctx.units[src_id]
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
        g.settle()  # an abort that ended the broadcast early leaves a partial buffer
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
    """Every unit held here (offloaded ones included) and its arena's bytes."""
    return {k: v.nbytes for k, v in ctx.units.items()}


def unit_residency(ctx: WorkerContext
                   ) -> tuple[MemoryStats, dict[str, tuple[int, bool]], frozenset[str]]:
    """(this worker's byte counter, each held unit's (arena bytes, offloaded), the units an
    engine computes on)."""
    units = {k: (v.nbytes, k in ctx.offloaded) for k, v in list(ctx.units.items())}
    return ctx.memory.stats(), units, frozenset(ctx.in_use.values())


def set_residency(ctx: WorkerContext, offload: Sequence[str], load: Sequence[str]) -> int:
    """Offload the units ``offload`` (first: their bytes make room), then load ``load``;
    units not held are skipped. Returns the bytes counted after."""
    for u in offload:
        if u in ctx.units:
            ctx.offload(u)
    for u in load:
        if u in ctx.units:
            ctx.load(u)
    return ctx.memory.stats().held


def loading(ctx: WorkerContext, load: Sequence[str], fn: Any, *args: Any) -> Any:
    """Load the offloaded units ``load`` onto the device (counted; ``CapacityError`` when they
    do not fit), then run ``fn(ctx, *args)``: a primitive that first reads offloaded units."""
    for u in load:
        ctx.load(u)
    return fn(ctx, *args)


def place_seeded(ctx: WorkerContext, unit_id: str, spec: StateSpec, layout: tuple[int, int],
                 position: tuple[int, int], seed: int, warm: bool = True,
                 offloaded: bool = False) -> int:
    """Build this worker's position of a seeded unit in place (bytes counted), or in host
    memory, uncounted, when ``offloaded``."""
    from nereus.runtime.loading import fill_seeded

    if offloaded:
        n = arena_layout(spec, *layout, *position).nbytes
        st = ShardedState(spec, *layout, *position, ctx.host_arena(n), StateMeta())
        fill_seeded(st, seed, warm)
        ctx.hold(unit_id, st, offloaded=True)
        return st.nbytes
    st = ctx.allocate(spec, *layout, *position, StateMeta(), f"seeded {unit_id}")
    try:
        fill_seeded(st, seed, warm)
        ctx.hold(unit_id, st)
    except BaseException:
        ctx.free(st)
        raise
    return st.nbytes


def place_safetensors(ctx: WorkerContext, unit_id: str, path: str, spec: StateSpec,
                      layout: tuple[int, int], position: tuple[int, int], seed: int = 0,
                      offloaded: bool = False) -> int:
    """Build this worker's position of a unit from a Hugging Face checkpoint (bytes counted),
    or in host memory, uncounted, when ``offloaded``."""
    from nereus.runtime.loading import load_safetensors

    n = arena_layout(spec, *layout, *position).nbytes
    if offloaded:
        st = load_safetensors(path, spec, layout[0], layout[1], position[0], position[1], seed,
                              torch.device("cpu"))
        ctx.hold(unit_id, st, offloaded=True)
        return n
    ctx.memory.reserve(n, f"checkpoint {unit_id}")
    try:
        st = load_safetensors(path, spec, layout[0], layout[1], position[0], position[1], seed,
                              ctx.device)
        ctx.hold(unit_id, st)
    except BaseException:
        ctx.memory.release(n)
        raise
    return n


def position_difference(unit_id: str, device_id: int, layout: tuple[int, int],
                        position: tuple[int, int], found_layout: tuple[int, int],
                        found_position: tuple[int, int]) -> str | None:
    """Why a worker's arena is not the position its unit gives that GPU, or None. A seeded
    check against the arena's own claim passes a shard on the wrong GPU (a Merge that swapped
    positions), so the claim is compared with the unit's first."""
    if (tuple(found_layout), tuple(found_position)) == (tuple(layout), tuple(position)):
        return None
    return (f"{unit_id} on GPU {device_id}: expected position {tuple(position)} of "
            f"tp={layout[0]},pp={layout[1]}, found position {tuple(found_position)} of "
            f"tp={found_layout[0]},pp={found_layout[1]}")


def verify_seeded(ctx: WorkerContext, unit_id: str, seed: int, warm: bool = True,
                  layout: tuple[int, int] | None = None,
                  position: tuple[int, int] | None = None) -> str | None:
    """Compare this worker's shard bitwise with the seeded state it should hold; None if equal.
    Lets a benchmark check a large state without gathering it in one process. With ``layout``
    and ``position`` (what the unit gives this GPU), the shard must be held and be that
    position first."""
    from nereus.runtime.loading import seeded_difference

    st = ctx.units.get(unit_id)
    if st is None:
        if layout is None or position is None:
            raise KeyError(f"worker {ctx.device_id} holds no unit {unit_id}")
        return (f"{unit_id} on GPU {ctx.device_id}: expected position {tuple(position)} of "
                f"tp={layout[0]},pp={layout[1]}, found no such unit")
    if layout is not None and position is not None:
        wrong = position_difference(unit_id, ctx.device_id, layout, position,
                                    (st.tp, st.pp), st.position)
        if wrong is not None:
            return wrong
    diff = seeded_difference(st, seed, warm)
    return None if diff is None else f"{unit_id} at {st.position} on {ctx.device_id}: {diff}"
