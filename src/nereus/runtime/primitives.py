"""The four primitives of the transition layer, as the driver runs them on workers.

For a ``nereus.transition.primitives`` value (Split, Merge, Extend, Destroy) this module says
which bytes each worker allocates when it starts (the memory check) and submits one ``call`` per
worker (``nereus.runtime.movement``); each worker joins and leaves its own communicator, so a
primitive is one round trip. Communicators: Split makes one all-gather group per T_sub position
(the GPUs of one enclosing TP/PP block, ``transition.nesting.gather_groups``); Extend one
two-member group per rank pair; Merge and Destroy none. Units are keyed by ``Emu.id`` on the
workers. A staged Split or Merge (``staged=True``) goes through host memory on each worker: its
source is freed on the device before its new shard is allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

from nereus.runtime import movement as mv
from nereus.runtime.comm import GroupSpec, Rendezvous
from nereus.runtime.movement import MoveResult
from nereus.runtime.state import StateSpec, position_bytes
from nereus.runtime.workers import WorkerPool
from nereus.transition.emu import Emu
from nereus.transition.nesting import factors, gather_groups
from nereus.transition.primitives import Destroy, Extend, Merge, Primitive, Split


def _layout(e: Emu) -> tuple[int, int]:
    return e.layout.tp, e.layout.pp


def split_member_groups(p: Split) -> list[tuple[tuple[int, int], tuple[int, ...],
                                                tuple[tuple[int, int], ...]]]:
    """(T_sub position, member devices in group-rank order, their T positions) per group."""
    out = []
    sub = p.sub
    for n, idx in enumerate(gather_groups(p.emu.layout, sub)):
        sub_pos = (n % sub.tp, n // sub.tp)
        out.append((sub_pos, tuple(p.emu.gpus[i] for i in idx),
                    tuple(p.emu.position(i) for i in idx)))
    return out


def need_bytes(p: Primitive, spec: StateSpec, bucket_bytes: int = mv.BUCKET_BYTES,
               offloaded: AbstractSet[str] = frozenset()) -> dict[int, int]:
    """Bytes each worker must have free when ``p`` starts: what it allocates then (its inputs
    stay until it ends); for a Split, its new shard plus the all-gather buffers of chunks of
    ``bucket_bytes`` (``nereus.transition.workspace``: at ``MIN_BUCKET_BYTES`` exactly what
    the transition planner's ``MemStep`` charges). A staged Split or Merge frees its source
    position on the device before it allocates (``nereus.runtime.movement``), so it needs only
    what the new shard (and a Split's buffers) take beyond the source:
    max(0, new + buffers - source).

    ``offloaded``: ids of units held offloaded now (``nereus.runtime.residency``). A Split,
    Merge or Extend loads those it reads first (``loads``), so their bytes are needed too;
    a staged one reads its source from host memory as it is, so on a worker whose source is
    offloaded it needs what the unstaged one allocates (there is nothing to free first)."""
    if offloaded and not isinstance(p, Destroy):
        host = {g for e in p.inputs if e.id in offloaded for g in e.gpus}
        if isinstance(p, (Split, Merge)) and p.staged:
            if not host:
                return need_bytes(p, spec, bucket_bytes)
            plain = need_bytes(replace(p, staged=False), spec, bucket_bytes)
            return {g: plain[g] if g in host else n
                    for g, n in need_bytes(p, spec, bucket_bytes).items()}
        out = need_bytes(p, spec, bucket_bytes)
        for g, ids in loads(p, offloaded).items():
            for e in p.inputs:
                if e.id in ids:
                    out[g] = out.get(g, 0) + position_bytes(
                        spec, *_layout(e), *e.position(e.gpus.index(g)))
        return out
    if isinstance(p, Split):
        m_tp, m_pp = factors(p.emu.layout, p.sub)
        out = {}
        for _, members, positions in split_member_groups(p):
            work = mv.split_workspace_bytes(spec, *_layout(p.emu), positions,
                                            (p.sub.tp, p.sub.pp), bucket_bytes)
            for g, (t, r) in zip(members, positions):
                n = work + position_bytes(spec, p.sub.tp, p.sub.pp, t // m_tp, r // m_pp)
                if p.staged:
                    n = max(0, n - position_bytes(spec, *_layout(p.emu), t, r))
                out[g] = n
        return out
    if isinstance(p, Merge):
        o = p.output
        out = {g: position_bytes(spec, *_layout(o), *o.position(i))
               for i, g in enumerate(o.gpus)}
        if p.staged:
            for e in p.emus:
                for i, g in enumerate(e.gpus):
                    out[g] = max(0, out[g] - position_bytes(spec, *_layout(e), *e.position(i)))
        return out
    if isinstance(p, Extend):
        o = p.output
        return {g: position_bytes(spec, *_layout(o), *o.position(i))
                for i, g in enumerate(o.gpus)}
    return {}


def held_change(p: Primitive, spec: StateSpec, offloaded: AbstractSet[str] = frozenset()
                ) -> dict[int, int]:
    """Counted bytes each worker holds once ``p`` has ended (and settled) minus before it
    started: its new units' positions, less the resident ones it consumes; an Extend's
    ``offloaded`` source is loaded and stays. A consumed unit held offloaded changes nothing:
    a Split or Merge loads it and drops it, or (staged) takes it from host memory; a Destroy
    frees its host memory only. The executor's preflight replays a schedule with it."""
    out: dict[int, int] = {}

    def add(e: Emu, sign: int) -> None:
        for i, g in enumerate(e.gpus):
            out[g] = out.get(g, 0) + sign * position_bytes(spec, *_layout(e), *e.position(i))

    consumed = {e.id for e in p.consumed}
    for e in p.inputs:
        if e.id in consumed and e.id not in offloaded:
            add(e, -1)
        elif e.id not in consumed and e.id in offloaded:
            add(e, 1)
    for e in p.outputs:
        add(e, 1)
    return out


def loads(p: Primitive, offloaded: AbstractSet[str]) -> dict[int, tuple[str, ...]]:
    """The offloaded units ``p`` loads before it runs, by worker: those it reads, unless it
    is a Destroy (which frees an offloaded unit's host memory) or a staged Split or Merge
    (which reads its source from host memory as it is)."""
    if isinstance(p, Destroy) or (isinstance(p, (Split, Merge)) and p.staged):
        return {}
    out: dict[int, list[str]] = {}
    for e in p.inputs:
        if e.id in offloaded:
            for g in e.gpus:
                out.setdefault(g, []).append(e.id)
    return {g: tuple(us) for g, us in out.items()}


def fit_bucket(p: Primitive, spec: StateSpec, free: Mapping[int, int],
               offloaded: AbstractSet[str] = frozenset()) -> int | None:
    """The largest all-gather chunk (<= ``BUCKET_BYTES``) for which every worker of ``p`` has
    the bytes it needs free (``need_bytes``, with the ``offloaded`` units it loads); None when
    even the smallest chunk does not fit. Only a Split's
    need depends on it; the transition planner charges the smallest chunk's buffers, so a
    schedule it certified always finds one."""
    bucket = mv.BUCKET_BYTES
    while bucket >= mv.MIN_BUCKET_BYTES:
        need = need_bytes(p, spec, bucket, offloaded)
        if all(n <= free.get(g, 0) for g, n in need.items()):
            return bucket
        if not isinstance(p, Split):
            return None
        bucket //= 2
    return None


def workers_of(p: Primitive) -> tuple[int, ...]:
    ids = {g for e in p.inputs + p.outputs for g in e.gpus}
    return tuple(sorted(ids))


def launch(p: Primitive, pool: WorkerPool, rv: Rendezvous, spec: StateSpec, tag: str,
           timeout_s: float, bucket_bytes: int = mv.BUCKET_BYTES,
           offloaded: AbstractSet[str] = frozenset()
           ) -> tuple[dict[int, Any], dict[str, GroupSpec]]:
    """Submit the workers' calls of ``p``; returns refs by device and its groups by name.
    A worker holding offloaded units that ``p`` reads (``loads``) loads them first, in the
    same call (``movement.loading``)."""
    refs: dict[int, Any] = {}
    groups: dict[str, GroupSpec] = {}
    first = loads(p, offloaded)

    def submit(g: int, fn: Callable[..., Any], *args: Any) -> Any:
        if g in first:
            return pool.submit(g, mv.loading, first[g], fn, *args)
        return pool.submit(g, fn, *args)

    if isinstance(p, Split):
        for sub_pos, members, positions in split_member_groups(p):
            name = f"{tag}.split.{sub_pos[0]}.{sub_pos[1]}"
            gs = GroupSpec.new(name, members, rv, timeout_s)
            groups[name] = gs
            for j, g in enumerate(members):
                refs[g] = submit(g, mv.split_member, gs, p.emu.id, p.outputs[j].id,
                                      (p.sub.tp, p.sub.pp), positions, bucket_bytes,
                                      p.staged)
    elif isinstance(p, Merge):
        o = p.output
        src_of = {g: e.id for e in p.emus for g in e.gpus}
        for i, g in enumerate(o.gpus):
            refs[g] = submit(g, mv.merge_member, src_of[g], o.id, _layout(o),
                                  o.position(i), p.staged)
    elif isinstance(p, Extend):
        o = p.output
        for i, (a, b) in enumerate(p.pairs()):
            name = f"{tag}.extend.{i}"
            gs = GroupSpec.new(name, (a, b), rv, timeout_s)  # one communicator per rank pair
            groups[name] = gs
            pos = o.position(i)
            refs[a] = submit(a, mv.extend_member, gs, p.emu.id, o.id, spec, _layout(o),
                                  pos)
            refs[b] = submit(b, mv.extend_member, gs, None, o.id, spec, _layout(o), pos)
    elif isinstance(p, Destroy):
        for g in p.emu.gpus:
            refs[g] = submit(g, mv.destroy_member, p.emu.id)
    else:
        raise TypeError(f"not a primitive: {p!r}")
    return refs, groups


def settle_calls(p: Primitive, members: Iterable[int], keep: bool
                 ) -> dict[int, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """The calls (``WorkerPool.run``'s) that settle a Split or Merge on ``members``, the
    workers that made their part of it (``movement.settle_member``): ``keep`` the new units,
    every member having made its part, or the sources. None for an Extend or a Destroy."""
    if not isinstance(p, (Split, Merge)):
        return {}
    out = {g: e.id for e in p.outputs for g in e.gpus}
    return {g: (mv.settle_member, (out[g], keep)) for g in members}


@dataclass(frozen=True)
class PrimitiveTiming:
    """What one primitive measured, in the schedule's shape (``index`` = its position in the
    schedule). Times in seconds from the start of the transition on the driver's clock;
    ``setup_s`` / ``move_s`` are the slowest worker's; ``bytes`` is what workers received."""

    index: int
    op: str
    stage: str
    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    setup_s: float
    move_s: float
    bytes: int
    communicators: int
    source: str = "measured"

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @classmethod
    def of(cls, index: int, p: Primitive, start: float, end: float,
           results: Mapping[int, MoveResult], communicators: int) -> PrimitiveTiming:
        rs = list(results.values())
        return cls(index, p.op, p.stage, workers_of(p), start, end,
                   max((r.setup_s for r in rs), default=0.0),
                   max((r.move_s for r in rs), default=0.0),
                   sum(r.bytes_received for r in rs), communicators)

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "op": self.op, "stage": self.stage,
                "gpus": list(self.gpus), "start_s": self.start_s, "end_s": self.end_s,
                "duration_s": self.duration_s, "setup_s": self.setup_s, "move_s": self.move_s,
                "bytes": self.bytes, "communicators": self.communicators,
                "source": self.source}
