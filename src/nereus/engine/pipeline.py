"""Pipeline-parallel schedules over a replica's PP group: 1F1B for training, a streaming
forward for inference and generation.

Activations go to the next block and gradients to the previous one by point-to-point calls, each
direction on its own communicator of the PP group (``ParallelGroups.pp`` and ``pp_grad``: NCCL
runs a pair's calls on one communicator in order, and 1F1B's two directions cross). Receives
block, so a block computes as soon as its input arrives. Sends are asynchronous, and a sent
tensor must stay alive until its send is done; gloo says a send is done only through ``wait``,
so each schedule waits for a send (``PipeLinks.settle``) at the first point where the receiver
has provably taken it, and the wait returns at once. A block thus holds the tensors of the sends
still in flight (at most about ``pp`` of them), not every tensor it sent during the step. 1F1B
keeps at most ``pp - pp_rank`` micro-batches' activations alive on a block (against all of them
under GPipe), which is what the cost model's activation memory assumes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nereus.engine.batch import Batch
from nereus.engine.comm import recv, send
from nereus.engine.model import Inputs, KVCache, ParallelModel


@dataclass(frozen=True)
class Output:
    """What the last block produces for a micro-batch: log-probs of the next tokens [b, s-1]
    (LM head) or per-token values [b, s] (scalar head), fp32."""

    logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def scores(self, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """A reward model's score per sequence: the value at its last real token [n]."""
        if self.values is None:
            raise ValueError("scores need a scalar head's values")
        if attention_mask is None:
            return self.values[:, -1]
        s = attention_mask.shape[1]
        pos = torch.arange(s, device=attention_mask.device)
        last = torch.where(attention_mask.bool(), pos, -1).max(dim=1).values.clamp(min=0)
        return self.values.gather(1, last.to(self.values.device)[:, None]).squeeze(1)

    def cpu(self) -> Output:
        return Output(None if self.logprobs is None else self.logprobs.cpu(),
                      None if self.values is None else self.values.cpu())

    @staticmethod
    def cat(parts: list[Output]) -> Output:
        lp = [p.logprobs for p in parts if p.logprobs is not None]
        vs = [p.values for p in parts if p.values is not None]
        return Output(torch.cat(lp) if lp else None, torch.cat(vs) if vs else None)


LossFn = Callable[[Output, Batch], torch.Tensor]
_FWD, _BWD = 0, 1


def _tag(micro: int, direction: int) -> int:
    return 2 * micro + direction


class PipeLinks:
    """Send / receive with the neighbouring blocks of one PP group: activations to the next
    block over ``groups.pp``, gradients to the previous one over ``groups.pp_grad`` (see
    ``ParallelGroups``: each direction on its own communicator keeps NCCL's in-order
    point-to-point from deadlocking). Each send in flight is kept (its work and tensor) under its
    tag until ``settle`` or ``finish`` waits for it."""

    def __init__(self, model: ParallelModel) -> None:
        self.model = model
        self.rank = model.pos.pp_rank
        self.pg = model.groups.pp
        self.pg_grad = model.groups.pp_grad if model.groups.pp_grad is not None else self.pg
        self.intra = model.groups.pp_intra
        self.pending: dict[int, tuple[Any, torch.Tensor]] = {}

    def _pg(self, peer: int, outgoing: bool) -> Any:
        """The communicator of a message to (``outgoing``) or from ``peer``."""
        if abs(peer - self.rank) != 1:
            raise ValueError(f"block {self.rank} exchanges messages with its neighbours only, "
                             f"not block {peer}")
        forward = peer > self.rank if outgoing else peer < self.rank
        return self.pg if forward else self.pg_grad

    def send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        if tag in self.pending:
            raise RuntimeError(f"a send with tag {tag} is still in flight")
        t = t.detach().contiguous()
        self.pending[tag] = (send(t, dst, self._pg(dst, True), tag), t)

    def settle(self, tag: int) -> None:
        """Wait for the send of ``tag`` (if still kept) and let its tensor go. Call it once the
        receiver has taken the message, or the wait blocks until it does (on gloo a send ends
        only when its receive is posted): timed as ``WAIT``, the receiver's pace."""
        entry = self.pending.pop(tag, None)
        if entry is not None:
            with self.model.rec.waiting():
                entry[0].wait()

    def recv(self, shape: tuple[int, ...], src: int, tag: int) -> torch.Tensor:
        m = self.model
        t = torch.empty(shape, dtype=m.dtype, device=m.device)
        return recv(t, src, self._pg(src, False), m.rec, tag, self.intra)

    def finish(self) -> None:
        for tag in list(self.pending):
            self.settle(tag)


def micro_inputs(model: ParallelModel, mb: Batch) -> Inputs:
    s = mb.seq_len
    return model.inputs(mb.positions(), mb.attention_mask, s, s)


def head_output(model: ParallelModel, h: torch.Tensor, mb: Batch, temperature: float = 1.0
                ) -> Output:
    """Log-probs at ``temperature`` (LM head) or values (scalar head) of a micro-batch."""
    from nereus.spec.model import Head

    if model.head is Head.SCALAR:
        return Output(values=model.values(h))
    return Output(logprobs=model.logprobs(h, mb.tokens(), temperature))


def forward_step(model: ParallelModel, links: PipeLinks, x: torch.Tensor | None, inp: Inputs,
                 shape: tuple[int, int, int], tag: int, cache: KVCache | None = None
                 ) -> torch.Tensor | None:
    """One micro-batch through this block without autograd: receive, compute, send on.
    ``x`` is the token ids on the first block. Returns the final hidden states on the last
    block, None elsewhere."""
    pos = model.pos
    if not pos.first:
        x = links.recv(shape, pos.pp_rank - 1, tag)
    assert x is not None
    h = model.stage_forward(x, inp, cache)
    if pos.last:
        return h
    links.send(h, pos.pp_rank + 1, tag)
    return None


def forward_pipeline(model: ParallelModel, micros: list[Batch], temperature: float = 1.0
                     ) -> list[Output] | None:
    """Inference over micro-batches (GPipe forward, streaming): outputs on the last block,
    log-probs at ``temperature`` (``ParallelModel.logprobs``).

    A block waits for its send of micro-batch i - 1 after sending micro-batch i: the next block
    takes i - 1 without waiting on this one (the last block waits on no send), so at most two
    sends are in flight."""
    links = PipeLinks(model)
    outs: list[Output] = []
    with torch.no_grad():
        for i, mb in enumerate(micros):
            shape = model.hidden_shape(mb.size, mb.seq_len)
            h = forward_step(model, links, mb.tokens(), micro_inputs(model, mb), shape,
                             _tag(i, _FWD))
            links.settle(_tag(i - 1, _FWD))
            if h is not None:
                outs.append(head_output(model, h, mb, temperature))
    links.finish()
    return outs if model.pos.last else None


def train_pipeline(model: ParallelModel, micros: list[Batch], loss_fn: LossFn,
                   temperature: float = 1.0) -> list[torch.Tensor]:
    """Forward and backward of every micro-batch under 1F1B; gradients accumulate in the
    parameters' ``.grad`` (or their hooks). Returns the detached losses on the last block.
    ``loss_fn`` sees log-probs at ``temperature``.

    Sends are settled as soon as the receiver has provably taken them: the activation of
    micro-batch i once its gradient came back (the next block received the activation before
    it computed that gradient), the gradient of micro-batch j once the previous block's
    activation of j + w + 1 arrived, w = ``pp - pp_rank`` being that block's warm-up: it runs
    B(j) between F(j + w) and F(j + w + 1) (``one_f_one_b``)."""
    pos = model.pos
    links = PipeLinks(model)
    prev_warmup = pos.pp - pos.pp_rank   # warm-up forwards of block pp_rank - 1
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    losses: list[torch.Tensor] = []

    def fwd(i: int) -> None:
        mb = micros[i]
        shape = model.hidden_shape(mb.size, mb.seq_len)
        if pos.first:
            x, inp_t = mb.tokens(), None
        else:
            inp_t = links.recv(shape, pos.pp_rank - 1, _tag(i, _FWD)).requires_grad_()
            x = inp_t
            links.settle(_tag(i - prev_warmup - 1, _BWD))
        h = model.stage_forward(x, micro_inputs(model, mb))
        if pos.last:
            loss = loss_fn(head_output(model, h, mb, temperature), mb)
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
            losses.append(loss.detach())
            saved[i] = (inp_t, loss)
        else:
            links.send(h, pos.pp_rank + 1, _tag(i, _FWD))
            saved[i] = (inp_t, h)

    def bwd(i: int) -> None:
        inp_t, out = saved.pop(i)
        if pos.last:
            out.backward()
        else:
            g = links.recv(tuple(out.shape), pos.pp_rank + 1, _tag(i, _BWD))
            links.settle(_tag(i, _FWD))
            torch.autograd.backward(out, g)
        if inp_t is not None:
            assert inp_t.grad is not None  # the backward above reached the received input
            links.send(inp_t.grad, pos.pp_rank - 1, _tag(i, _BWD))

    for op, i in one_f_one_b(len(micros), pos.pp, pos.pp_rank):
        (fwd if op == "F" else bwd)(i)
    links.finish()
    return losses


def one_f_one_b(n: int, pp: int, pp_rank: int) -> list[tuple[str, int]]:
    """The order of forwards ("F", i) and backwards ("B", i) of ``n`` micro-batches on block
    ``pp_rank``: ``pp - pp_rank - 1`` warm-up forwards, then one forward and one backward in
    turn, then the remaining backwards."""
    warmup = min(pp - pp_rank - 1, n)
    order = [("F", i) for i in range(warmup)]
    for i in range(warmup, n):
        order += [("F", i), ("B", i - warmup)]
    order += [("B", i) for i in range(n - warmup, n)]
    return order
