"""Collectives called on the runtime's group objects, timed by op class, and the autograd
functions that put them at the edges of tensor-parallel regions (Megatron's f and g).

Calls go to the ``ProcessGroup`` object itself (``pg.allreduce([t])``), not through the
``torch.distributed`` default world, so any subset of workers can compute together without a
global ``init_process_group``. A group of ``None`` means that dimension has size 1.

What is timed as a collective's op class is its transfer, not the wait for a peer to get there:
a blocking receive posted before the sender has computed its message, or a collective that one
member reaches late, would otherwise put the neighbour's compute (the pipeline bubble) under
p2p or allreduce, and the calibrator would fit it as a slow link. Neither gloo nor NCCL says
when the peer posted its side, so the waiting part is made visible by a one-element message
first: a send is preceded by a "ready" message the receiver waits for (timed as ``WAIT``)
before it waits for the data (timed as p2p); the sender posts both at once, so once the ready
message is in, only the data's transfer is left. Where a collective's members arrive at
different times (``wait_peers``), a one-element all-reduce first waits for all of them (timed
as ``WAIT``). Every member makes these extra calls in the same order, as NCCL's in-order
matching needs; each costs one message latency, small beside the waiting it keeps out of the
link's efficiency. On gloo the receiving thread may wake after the data is in, so p2p can read
somewhat low there; on NCCL both ends are timed on the stream.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist

from nereus.cost.ops import comm_class
from nereus.engine.measure import Recorder

# Tag bit of a p2p message's "ready" message (gloo matches by tag; NCCL by order). Data tags
# stay below it.
READY_TAG = 1 << 30


def _await_peers(pg: Any, rec: Recorder, like: torch.Tensor) -> None:
    """Return once every member of ``pg`` got here, the wait timed as ``WAIT``."""
    flag = torch.zeros(1, dtype=torch.float32, device=like.device)
    with rec.waiting():
        pg.allreduce([flag]).wait()


def all_reduce(t: torch.Tensor, pg: Any, rec: Recorder, intra: bool = True,
               op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, wait_peers: bool = False
               ) -> torch.Tensor:
    """In-place all-reduce of a contiguous tensor. ``wait_peers``: the members arrive at
    different times (pipeline blocks at the end of a step); the wait is timed apart."""
    if pg is None or pg.size() == 1:
        return t
    if wait_peers:
        _await_peers(pg, rec, t)
    opts = dist.AllreduceOptions()
    opts.reduceOp = cast(dist.ReduceOp, op)  # pybind converts RedOpType; torch's stubs miss it
    with rec.span(comm_class("allreduce", intra)):
        pg.allreduce([t], opts).wait()
    return t


def all_gather(t: torch.Tensor, pg: Any, rec: Recorder, intra: bool = True) -> list[torch.Tensor]:
    """The tensors of every rank of ``pg``, in group-rank order."""
    if pg is None or pg.size() == 1:
        return [t]
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(pg.size())]
    with rec.span(comm_class("allgather", intra)):
        pg.allgather([out], [t]).wait()
    return out


def broadcast(t: torch.Tensor, root: int, pg: Any, rec: Recorder, intra: bool = True,
              wait_peers: bool = False) -> torch.Tensor:
    """In-place broadcast from group rank ``root``. ``wait_peers``: the members arrive at
    different times (the root samples while the others wait); the wait is timed apart."""
    if pg is None or pg.size() == 1:
        return t
    if wait_peers:
        _await_peers(pg, rec, t)
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    opts.rootTensor = 0
    with rec.span(comm_class("broadcast", intra)):
        pg.broadcast([t], opts).wait()
    return t


def _ready_tag(tag: int) -> int:
    if not 0 <= tag < READY_TAG:
        raise ValueError(f"point-to-point tag {tag} outside [0, {READY_TAG})")
    return tag | READY_TAG


class Sent:
    """The works of one message's two sends (ready, data) and the tensors they read."""

    def __init__(self, works: tuple[Any, ...], tensors: tuple[torch.Tensor, ...]) -> None:
        self.works, self.tensors = works, tensors

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def send(t: torch.Tensor, dst: int, pg: Any, tag: int) -> Sent:
    """Start sending ``t`` to group rank ``dst``, its ready message first; returns the work to
    wait on before the tensors go. Not timed: sends are asynchronous; the receiver times the
    transfer."""
    ready = torch.zeros(1, dtype=t.dtype, device=t.device)
    data = t.contiguous()
    return Sent((pg.send([ready], dst, _ready_tag(tag)), pg.send([data], dst, tag)),
                (ready, data))


def recv(t: torch.Tensor, src: int, pg: Any, rec: Recorder, tag: int, intra: bool = True,
         kind: str = "p2p") -> torch.Tensor:
    """Receive into ``t`` from group rank ``src`` (blocking): the wait for the sender's ready
    message is timed as ``WAIT``, the data's transfer after it as ``kind`` (p2p, or the
    collective a pair of messages implements). Both receives are posted first, so the data
    can flow right behind the ready message."""
    ready = torch.empty(1, dtype=t.dtype, device=t.device)
    with rec.waiting():
        first = pg.recv([ready], src, _ready_tag(tag))
        data = pg.recv([t], src, tag)
        first.wait()
    with rec.span(comm_class(kind, intra)):
        data.wait()
    return t


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the input gradient backward (enters a TP region)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pg: Any, rec: Recorder, intra: bool) -> torch.Tensor:
        ctx.pg, ctx.rec, ctx.intra = pg, rec, intra
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return all_reduce(g.contiguous().clone(), ctx.pg, ctx.rec, ctx.intra), None, None, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (partial sums of a row-parallel output); identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pg: Any, rec: Recorder, intra: bool) -> torch.Tensor:
        out = x.contiguous().clone()
        return all_reduce(out, pg, rec, intra)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return g, None, None, None


def copy_to_tp(x: torch.Tensor, pg: Any, rec: Recorder, intra: bool = True) -> torch.Tensor:
    if pg is None or pg.size() == 1 or not torch.is_grad_enabled() or not x.requires_grad:
        return x
    return _CopyToTP.apply(x, pg, rec, intra)


def reduce_from_tp(x: torch.Tensor, pg: Any, rec: Recorder, intra: bool = True) -> torch.Tensor:
    if pg is None or pg.size() == 1:
        return x
    if not torch.is_grad_enabled() or not x.requires_grad:
        return all_reduce(x.contiguous(), pg, rec, intra)
    return _ReduceFromTP.apply(x, pg, rec, intra)
