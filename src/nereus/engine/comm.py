"""Collectives called on the runtime's group objects, timed by op class, and the autograd
functions that put them at the edges of tensor-parallel regions (Megatron's f and g).

Calls go to the ``ProcessGroup`` object itself (``pg.allreduce([t])``), not through the
``torch.distributed`` default world, so any subset of workers can compute together without a
global ``init_process_group``. A group of ``None`` means that dimension has size 1.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nereus.cost.ops import comm_class
from nereus.engine.measure import Recorder


def all_reduce(t: torch.Tensor, pg: Any, rec: Recorder, intra: bool = True,
               op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce of a contiguous tensor."""
    if pg is None or pg.size() == 1:
        return t
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
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


def broadcast(t: torch.Tensor, root: int, pg: Any, rec: Recorder, intra: bool = True
              ) -> torch.Tensor:
    """In-place broadcast from group rank ``root``."""
    if pg is None or pg.size() == 1:
        return t
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    opts.rootTensor = 0
    with rec.span(comm_class("broadcast", intra)):
        pg.broadcast([t], opts).wait()
    return t


def send(t: torch.Tensor, dst: int, pg: Any, tag: int) -> Any:
    """Start sending ``t`` to group rank ``dst``; returns the work to wait on before reuse.
    Not timed: sends are asynchronous; the receiver's wait carries the transfer time."""
    return pg.send([t.contiguous()], dst, tag)


def recv(t: torch.Tensor, src: int, pg: Any, rec: Recorder, tag: int, intra: bool = True
         ) -> torch.Tensor:
    """Receive into ``t`` from group rank ``src`` (blocking; the wait is timed as p2p)."""
    with rec.span(comm_class("p2p", intra)):
        pg.recv([t], src, tag).wait()
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
