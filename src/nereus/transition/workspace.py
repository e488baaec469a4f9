"""The staging buffers a Split needs besides its new shard: one formula for planner and runtime.

A Split's all-gather lands most received bytes straight in the new arena, but a region that is
a column block there (the o and down projections, split on dim 1, when TP shrinks) arrives in a
staging slot and is copied into place. Each member keeps ``WINDOW`` broadcasts in flight, so it
holds ``WINDOW`` slots of the largest such piece; pieces are whole rows of at most the
all-gather chunk (``bucket_bytes``), one row at least. The runtime shrinks the chunk down to
``MIN_BUCKET_BYTES`` when memory is tight, so the transition planner charges a Split the buffers
at that chunk: the least it can run with. Both sides call :func:`split_staging_bytes`, the
runtime to reserve the buffers (``nereus.runtime.splitting``), the planner in ``Split.memory``,
so what the planner certifies is what the runtime's memory check admits.

Pure Python (the sharding format and element sizes only): the planning layers use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import shard_plan
from nereus.spec.workload import Optimizer, Workload

WINDOW = 4  # broadcasts in flight per Split member: staging slots for strided regions
BUCKET_BYTES = 64 * 1024**2  # the runtime's all-gather chunk of a Split
MIN_BUCKET_BYTES = 64 * 1024  # the smallest chunk the runtime shrinks to under memory pressure
FP32_BYTES = 4  # master copy and Adam moments


def state_element_bytes(workload: Workload, trainable: bool) -> tuple[int, ...]:
    """Element sizes (bytes) of the tensor kinds one position holds, as ``nereus.cost.state``
    counts them: the parameter in the workload's dtype and, when trainable, an fp32 master copy
    (a narrower parameter with master weights) and the fp32 Adam moments."""
    out = {workload.param_bytes}
    if trainable:
        if workload.master_weights and workload.param_bytes < FP32_BYTES:
            out.add(FP32_BYTES)
        if workload.optimizer is Optimizer.ADAM:
            out.add(FP32_BYTES)
    return tuple(sorted(out))


def _piece_bytes(rows: int, row_bytes: int, bucket_bytes: int) -> int:
    """The largest piece of a ``rows`` x ``row_bytes`` region cut into whole rows of at most
    ``bucket_bytes`` (one row at least)."""
    per = max(1, bucket_bytes // row_bytes)
    return min(per, rows) * row_bytes


@lru_cache(maxsize=4096)
def _staging(model: ModelSpec, head: Head, tp: int, pp: int, sub_tp: int, sub_pp: int,
             element_bytes: tuple[int, ...], bucket_bytes: int) -> int:
    if tp % sub_tp or pp % sub_pp:
        raise ValueError(f"split of tp={tp}, pp={pp} into tp={sub_tp}, pp={sub_pp}: the "
                         "sub-layout must divide the layout")
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be >= 1")
    if sub_tp == tp:
        return 0  # every member holds whole target columns: nothing lands strided
    largest = 0
    # every member's shard of a dim-1 tensor is a column block of the new shard's (TP
    # shrinks); all TP ranks hold equal blocks, so TP rank 0 of each pipeline block says it
    for r in range(pp):
        for s in shard_plan(model, head, tp, pp, 0, r):
            if s.split_dim is None or s.split_dim == 0:
                continue  # replicated, or whole rows: contiguous in the new arena
            if len(s.full_shape) != 2 or s.split_dim != 1:
                raise ValueError(f"{s.name}: split on dim {s.split_dim} of a "
                                 f"{len(s.full_shape)}-d tensor; only 2-d tensors split on "
                                 "dim 1 land strided")
            rows, cols = s.full_shape[0], s.valid_len
            if rows and cols:
                largest = max(largest, max(_piece_bytes(rows, cols * e, bucket_bytes)
                                           for e in element_bytes))
    return WINDOW * largest


def split_staging_bytes(model: ModelSpec, head: Head, layout: tuple[int, int],
                        sub: tuple[int, int], element_bytes: Iterable[int],
                        bucket_bytes: int = MIN_BUCKET_BYTES) -> int:
    """Bytes of staging buffers each GPU of a Split of a (tp, pp) = ``layout`` unit into
    ``sub`` holds while it runs, with all-gather chunks of ``bucket_bytes``: ``WINDOW`` times
    the largest strided piece. ``element_bytes``: the element sizes of the tensor kinds the
    state holds (:func:`state_element_bytes`). Zero for a Split that keeps TP (pipeline only).
    The same on every GPU of the Split: every pipeline block holds the same layer tensors."""
    sizes = tuple(sorted(set(element_bytes)))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"element_bytes={sizes}: needs at least one size >= 1")
    return _staging(model, head, layout[0], layout[1], sub[0], sub[1], sizes, bucket_bytes)
