"""One optimizer update of a model-stage replica: 1F1B over micro-batches, gradient sums
inside the replica (TP partial gradients, tied embedding copies), the DP all-reduce, the global
gradient-norm clip and Adam.

Loss convention: ``loss_fn(output, micro_batch)`` returns the micro-batch's share of the update's
loss, already normalised by the caller for the *global* batch (e.g. divided by the number of
response tokens in all dp x b x a sequences). Gradients of all micro-batches and replicas are
then summed, so the update is the same whatever dp, b and a are, up to reduction order.

A failed step leaves the parameters and the optimizer state as they were, on every worker:
everything that can fail (the loss, the collectives) comes before the step's last collective,
an all-reduce over every worker of the model-stage (the ``stage`` group) in which each worker
also counts itself; a worker that fails earlier leaves its groups, so that all-reduce fails on
every other worker too, and each worker reads the count on the host before it updates (on
NCCL a wait returns before the kernel ends, and an aborted all-reduce would let a queued
update run). After it only the update runs, which allocates nothing. A worker that dies inside
the update itself (its process killed) is the case left: the others' updates stand, its own is
partial.

A gradient norm that is not finite (every worker has the same one) skips the update, as verl
does: the step returns with ``skipped`` set and the state as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from nereus.engine.batch import Batch
from nereus.engine.comm import all_reduce, recv, send
from nereus.engine.model import ParallelModel
from nereus.engine.optim import AdamConfig, AdamState, adam_update, counts_once, is_qk_norm
from nereus.engine.pipeline import LossFn, train_pipeline
from nereus.errors import InputError
from nereus.spec.model import Head
from nereus.spec.sharding import EMBED, LM_HEAD, is_kv

# Gradient bytes per DP all-reduce message (DDP's default bucket is 25 MiB).
DP_BUCKET_BYTES = 32 * 1024**2


@dataclass(frozen=True)
class TrainResult:
    """``loss``: the update's loss summed over the global batch (known on the last block, None
    elsewhere); ``grad_norm``: global norm before clipping; ``clip_coef`` applied (<= 1);
    ``skipped``: the norm was not finite, so no update ran (``step`` did not move)."""

    loss: float | None
    grad_norm: float
    clip_coef: float
    micro_batches: int
    step: int
    skipped: bool = False


class TrainStep:
    """Runs updates on one worker's shards; every worker of the model-stage calls it with its
    replica's rows of the global batch (see ``nereus.engine.batch.replica_rows``)."""

    def __init__(self, model: ParallelModel, state: AdamState, config: AdamConfig,
                 micro_batch: int, recompute: bool = False) -> None:
        if model.pos.workers > 1 and model.groups.stage is None:
            raise InputError("groups.stage", "missing: a training step on more than one worker "
                             "ends on an all-reduce over all of them, its last collective "
                             "before the update")
        self.model, self.state, self.cfg, self.micro_batch = model, state, config, micro_batch
        self.recompute = recompute
        self._main_grads: dict[str, torch.Tensor] = {}
        self._flat = torch.zeros(0)

    # ---------------------------------------------------------------- public
    def __call__(self, batch: Batch, loss_fn: LossFn, temperature: float = 1.0) -> TrainResult:
        """One update; ``loss_fn`` sees log-probs at ``temperature``
        (``ParallelModel.logprobs``)."""
        m = self.model
        micros = batch.to(m.device).split(self.micro_batch)
        hooks = self._enable_grads()
        m.recompute = self.recompute
        try:
            losses = train_pipeline(m, micros, loss_fn, temperature)
            grads = self._grads()
            self._sync_tp(grads)
            self._sync_dp(grads)
            self._sync_tied(grads)
            norm = self._global_norm(grads)
            skip = not math.isfinite(norm)  # the same on every worker: all skip, or none
            coef = 1.0
            if self.cfg.max_grad_norm is not None and not skip:
                coef = min(1.0, self.cfg.max_grad_norm / (norm + 1e-6))
            loss = self._commit(losses)  # the last thing that can fail (module docstring)
            if not skip:
                adam_update(m.params, grads, self.state, self.cfg, coef, m.rec)
        finally:
            m.recompute = False
            self._disable_grads(hooks)
        return TrainResult(loss, norm, coef, len(micros), self.state.step, skip)

    # ---------------------------------------------------------------- gradients
    def _enable_grads(self) -> list[Any]:
        """Parameters require grad for the step only. Gradients accumulate in fp32 views of one
        flat buffer (Megatron's contiguous grad buffer): the DP all-reduce then runs on it in
        place, and gradients take exactly numel x 4 bytes. An fp32 parameter's ``.grad`` is its
        view (autograd adds into it in place); a bf16 one's is added by a hook and dropped."""
        hooks = []
        params = self.model.params
        total = sum(p.numel() for p in params.values())
        self._flat = torch.zeros(total, dtype=torch.float32, device=self.model.device)
        self._main_grads = {}
        off = 0
        for name, p in params.items():
            view = self._flat[off:off + p.numel()].view_as(p)
            off += p.numel()
            self._main_grads[name] = view
            p.requires_grad_(True)
            if p.dtype == torch.float32:
                p.grad = view
            else:
                p.grad = None

                def acc(t: torch.Tensor, buf: torch.Tensor = view) -> None:
                    assert t.grad is not None  # set when a post-accumulate hook runs
                    buf.add_(t.grad)
                    t.grad = None
                hooks.append(p.register_post_accumulate_grad_hook(acc))
        return hooks

    def _disable_grads(self, hooks: list[Any]) -> None:
        for h in hooks:
            h.remove()
        for p in self.model.params.values():
            p.grad = None
            p.requires_grad_(False)
        self._main_grads = {}
        self._flat = torch.zeros(0)

    def _grads(self) -> dict[str, torch.Tensor]:
        for name, p in self.model.params.items():
            if p.grad is not None and p.grad.data_ptr() != self._main_grads[name].data_ptr():
                raise RuntimeError(f"gradient of {name} left its buffer")
        return self._main_grads

    def _sync_tp(self, grads: dict[str, torch.Tensor]) -> None:
        """Sum the partial gradients that the TP ranks hold of one logical tensor."""
        m = self.model
        spec, pos, tp = m.spec, m.pos, m.tp
        if pos.tp > 1:
            # q/k norms act on each rank's heads: each rank holds a partial gradient
            norms = [n for n in grads if is_qk_norm(n)]
            if norms:
                flat = torch.cat([grads[n].reshape(-1) for n in norms])
                all_reduce(flat, tp.pg, m.rec, tp.intra)
                _unflatten(flat, [grads[n] for n in norms])
            if spec.num_kv_heads < pos.tp:
                # a replicated KV head's gradient is the sum over the ranks that share it
                kv = [n for n in grads if is_kv(n)]
                if kv:
                    group = pos.tp // spec.num_kv_heads
                    head = pos.tp_rank // group
                    size = sum(grads[n].numel() for n in kv)
                    buf = torch.zeros(spec.num_kv_heads, size, dtype=grads[kv[0]].dtype,
                                      device=m.device)
                    buf[head] = torch.cat([grads[n].reshape(-1) for n in kv])
                    all_reduce(buf, tp.pg, m.rec, tp.intra)
                    _unflatten(buf[head].clone(), [grads[n] for n in kv])

    def _sync_tied(self, grads: dict[str, torch.Tensor]) -> None:
        """The embedding (first block) and its LM-head copy (last block) add each other's
        gradient. After the DP sum, so both copies add the same two numbers (a + b == b + a
        bitwise) and stay identical, whatever order each DP group reduced in."""
        m = self.model
        spec, pos = m.spec, m.pos
        if (m.head is Head.LM and spec.tie_embeddings and pos.pp > 1
                and (pos.first or pos.last)):
            name, peer = (EMBED, pos.pp - 1) if pos.first else (LM_HEAD, 0)
            mine = grads[name]
            theirs = torch.empty_like(mine)
            pg, tag, intra = m.groups.pp, 1 << 20, m.groups.pp_intra
            # The first block sends, then receives; the last receives, then sends: NCCL runs
            # a pair's sends and receives in order, and two sends first would wait on each
            # other (gloo would not mind either order). The transfer is timed as the
            # two-member all-reduce it is, which the cost model prices
            if pos.first:
                work = send(mine, peer, pg, tag)
                recv(theirs, peer, pg, m.rec, tag, intra, kind="allreduce")
            else:
                recv(theirs, peer, pg, m.rec, tag, intra, kind="allreduce")
                work = send(mine, peer, pg, tag)
            work.wait()
            mine.add_(theirs)

    def _sync_dp(self, grads: dict[str, torch.Tensor]) -> None:
        """Sum gradients over the replicas: in place on the flat buffer, in chunks of
        ``DP_BUCKET_BYTES`` (a few large messages, no copies)."""
        m = self.model
        pg = m.groups.dp
        if pg is None or pg.size() == 1:
            return
        step = DP_BUCKET_BYTES // 4
        for i in range(0, self._flat.numel(), step):
            # the replicas end their backward at different times: the first bucket waits for
            # all of them apart from its transfer
            all_reduce(self._flat[i:i + step], pg, m.rec, m.groups.dp_intra, wait_peers=i == 0)

    def _global_norm(self, grads: dict[str, torch.Tensor]) -> float:
        """L2 norm of the logical gradient: every element once, summed over TP and PP."""
        m = self.model
        sq = torch.zeros(1, dtype=torch.float64, device=m.device)
        for name, g in grads.items():
            if counts_once(m.plan[name], m.spec, m.pos.tp, m.pos.tp_rank):
                sq += torch.linalg.vector_norm(g).double() ** 2
        all_reduce(sq, m.tp.pg, m.rec, m.tp.intra)
        # the blocks get here at different times (the first block ends 1F1B's drain last)
        all_reduce(sq, m.groups.pp, m.rec, m.groups.pp_intra, wait_peers=True)
        return float(sq.sqrt())

    def _commit(self, losses: list[torch.Tensor]) -> float | None:
        """The step's last collective, over every worker of the model-stage: the update's loss
        summed over the replicas (each last block's tp_rank 0 adds its replica's, every other
        worker zero) and the workers that got here, read on the host. Raises unless all did.
        The loss is known on the last blocks, None elsewhere."""
        m = self.model
        total = torch.zeros(2, dtype=torch.float64, device=m.device)
        total[1] = 1.0
        if m.pos.last and m.pos.tp_rank == 0:
            total[0] += torch.stack(losses).sum().double()
        # the workers get here at different times (the first blocks end 1F1B's drain last)
        all_reduce(total, m.groups.stage, m.rec, m.groups.stage_intra, wait_peers=True)
        loss, got = total.tolist()
        if got != m.pos.workers:
            raise RuntimeError(f"the step's last all-reduce counted {got:g} of "
                               f"{m.pos.workers} workers: update skipped")
        return loss if m.pos.last else None


def _unflatten(flat: torch.Tensor, outs: list[torch.Tensor]) -> None:
    i = 0
    for t in outs:
        n = t.numel()
        t.copy_(flat[i:i + n].view_as(t))
        i += n
