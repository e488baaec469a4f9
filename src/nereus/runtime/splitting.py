"""The transfers of one Split group: which member sends which bytes, and where they land.

All members of a group (the GPUs of one enclosing TP/PP block) build the same T_sub position,
so each needs every other member's shards of it. For every target tensor and every member
holding part of it, the overlap is a region that is contiguous in the member's arena (the
member's shard is a sub-block of the target's). It is a *segment*: broadcast by its lowest-rank
holder straight into the same bytes of every receiver's new arena when the region is contiguous
there too (row splits, whole tensors of other pipeline blocks), or into a staging buffer and
copied when it is not (a column block of an o / down projection). Regions every member already
holds (replicated norms, replicated KV heads) are copied locally and not sent. Every member
computes the same list in the same order, which is what a sequence of collectives needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from nereus.runtime.state import ArenaEntry, Box, StateSpec, arena_layout, valid_box
from nereus.transition.workspace import split_staging_bytes


@dataclass(frozen=True)
class Segment:
    """``src`` bytes of member ``root``'s arena carry logical ``box`` of target entry
    ``entry``; ``dst`` is their byte range in the target arena when contiguous there (else
    they are staged)."""

    root: int
    src: tuple[int, int]
    dst: tuple[int, int] | None
    entry: int
    box: Box

    @property
    def nbytes(self) -> int:
        return self.src[1] - self.src[0]


def _intersect(a: Box, b: Box) -> Box | None:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def _span(e: ArenaEntry, box: Box) -> tuple[int, int] | None:
    """Byte range of ``box`` inside entry ``e`` when it is contiguous there, else None."""
    sh = e.shard
    shape = sh.local_shape
    base = [sh.start if d == sh.split_dim else 0 for d in range(len(shape))]
    esize = e.nbytes // max(1, sh.numel)
    inner = 1
    for n in shape[1:]:
        inner *= n
    lo = [a - b for (a, _), b in zip(box, base)]
    hi = [z - b for (_, z), b in zip(box, base)]
    if len(shape) > 1 and not (lo[1] == 0 and hi[1] == shape[1]):
        return None  # a column block of a wider row: strided
    start = e.offset + lo[0] * inner * esize
    return start, start + (hi[0] - lo[0]) * inner * esize


@lru_cache(maxsize=256)
def split_segments(spec: StateSpec, tp: int, pp: int,
                   member_positions: tuple[tuple[int, int], ...], sub: tuple[int, int],
                   bucket_bytes: int) -> tuple[tuple[Run, ...], tuple[int, ...]]:
    """(broadcasts in order, indices of target entries every member holds whole).

    Segments are cut into pieces of at most ``bucket_bytes`` (whole rows), then adjacent ones
    of one root joined into runs of at most ``bucket_bytes``."""
    tp_s, pp_s = sub
    m_tp, m_pp = tp // tp_s, pp // pp_s
    t0, r0 = member_positions[0]
    target = arena_layout(spec, tp_s, pp_s, t0 // m_tp, r0 // m_pp)
    members = [arena_layout(spec, tp, pp, t, r) for t, r in member_positions]
    by_key = [{(e.kind, e.shard.logical): e for e in lay.entries} for lay in members]
    segs: list[Segment] = []
    local: list[int] = []
    for i, et in enumerate(target.entries):
        want = valid_box(et.shard)
        holders: dict[Box, list[tuple[int, ArenaEntry]]] = {}
        for m, index in enumerate(by_key):
            em = index.get((et.kind, et.shard.logical))
            if em is None:
                continue
            box = _intersect(want, valid_box(em.shard))
            if box is not None:
                holders.setdefault(box, []).append((m, em))
        if len(holders) == 1 and len(next(iter(holders.values()))) == len(members) \
                and next(iter(holders)) == want:
            local.append(i)  # every member holds the whole tensor (replicated): copy it
            continue
        for box, hs in sorted(holders.items()):
            root, em = hs[0]
            src = _span(em, box)
            if src is None:
                raise AssertionError(f"split: {em.shard.name} region {box} is not contiguous "
                                     "in its source; layouts do not nest")
            dst = _span(et, box)
            segs += _pieces(Segment(root, src, dst, i, box), et, bucket_bytes)
    return tuple(_runs(segs, bucket_bytes)), tuple(local)


@dataclass(frozen=True)
class Run:
    """Consecutive segments of one root whose bytes follow each other in the root's arena
    and in the target's: sent as one broadcast (whole tensors of a pipeline block)."""

    root: int
    src: tuple[int, int]
    dst: tuple[int, int] | None
    parts: tuple[Segment, ...]

    @property
    def nbytes(self) -> int:
        return self.src[1] - self.src[0]


def _runs(segs: list[Segment], bucket_bytes: int) -> list[Run]:
    out: list[Run] = []
    for sg in segs:
        last = out[-1] if out else None
        if (last is not None and sg.dst is not None and last.dst is not None
                and sg.root == last.root and sg.src[0] == last.src[1]
                and sg.dst[0] == last.dst[1] and last.nbytes + sg.nbytes <= bucket_bytes):
            out[-1] = Run(last.root, (last.src[0], sg.src[1]), (last.dst[0], sg.dst[1]),
                          last.parts + (sg,))
        else:
            out.append(Run(sg.root, sg.src, sg.dst, (sg,)))
    return out


def _pieces(seg: Segment, et: ArenaEntry, bucket_bytes: int) -> list[Segment]:
    """``seg`` cut into whole-row pieces of at most ``bucket_bytes`` (one row at least)."""
    (a0, b0) = seg.box[0]
    rows = b0 - a0
    row = seg.nbytes // rows
    per = max(1, bucket_bytes // row)
    if per >= rows:
        return [seg]
    out = []
    for r in range(0, rows, per):
        n = min(per, rows - r)
        src = (seg.src[0] + r * row, seg.src[0] + (r + n) * row)
        dst = None if seg.dst is None else (seg.dst[0] + r * row, seg.dst[0] + (r + n) * row)
        out.append(Segment(seg.root, src, dst, seg.entry, ((a0 + r, a0 + r + n), *seg.box[1:])))
    return out


def element_bytes(spec: StateSpec) -> tuple[int, ...]:
    """Element sizes of the tensor kinds a position of ``spec`` holds."""
    return tuple(spec.dtype(k).itemsize for k in spec.kinds)


def staging_bytes(spec: StateSpec, tp: int, pp: int,
                  member_positions: Sequence[tuple[int, int]], sub: tuple[int, int],
                  bucket_bytes: int) -> int:
    """Buffers one member needs for the segments that land strided (zero for a pipeline-only
    split): ``WINDOW`` times the largest such piece. The transition layer's formula
    (``nereus.transition.workspace``), which its planner charges a Split at the smallest
    chunk: one formula, so the two cannot drift apart. It is the same for every member of
    every group; ``member_positions`` (the group, as ``split_segments`` takes it) only names
    whose buffers these are, and ``split_member`` checks its segments fit them."""
    del member_positions  # the same for every group (see the docstring)
    return split_staging_bytes(spec.model, spec.head, (tp, pp), sub, element_bytes(spec),
                               bucket_bytes)
