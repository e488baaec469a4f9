"""Tensor-parallel building blocks as plain functions over shard tensors.

Column-parallel linears (q/k/v, gate, up, LM head) hold rows of the logical weight and need the
full input; row-parallel ones (o, down) hold columns and produce partial sums that one
all-reduce completes. The vocabulary-parallel embedding and log-softmax work on row ranges of
the padded vocabulary and never assemble full logits. Every function takes its group and the
recorder explicitly, so the same code runs at tp = 1 (group None) and under any layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nereus.cost.ops import OpClass
from nereus.engine.comm import all_reduce, copy_to_tp, reduce_from_tp
from nereus.engine.fused import apply_rotary, heads_linear, rms_norm, swiglu
from nereus.engine.measure import Recorder
from nereus.errors import InputError
from nereus.spec.model import COMPUTED_ROPE, RopeScaling

__all__ = ["TP", "apply_rotary", "attention", "column_linear", "gather_vocab",
           "heads_row_linear", "inverse_frequencies", "mask_padding", "matmul", "rms_norm",
           "rotary_tables",
           "row_linear", "swiglu", "vocab_embedding", "vocab_logprob"]


@dataclass(frozen=True)
class TP:
    """A TP group with its recorder and link, passed to every parallel layer."""

    pg: Any
    rec: Recorder
    intra: bool = True

    @property
    def size(self) -> int:
        return 1 if self.pg is None else self.pg.size()


def matmul(x: torch.Tensor, w: torch.Tensor, rec: Recorder) -> torch.Tensor:
    """``x @ w.T`` over the last dim, timed as GEMM forward and backward."""
    lead = x.shape[:-1]
    with rec.span(OpClass.GEMM):
        y = x.reshape(-1, x.shape[-1]) @ w.t()
    rec.time_backward(y, OpClass.GEMM)
    return y.view(*lead, w.shape[0])


def column_linear(x: torch.Tensor, ws: list[torch.Tensor], tp: TP) -> list[torch.Tensor]:
    """Column-parallel linears that share their full input (q/k/v; gate/up; the LM head): each
    gives this rank's output columns (the rows of its ``w``). The input enters the TP region
    once, so backward all-reduces one summed input gradient, not one per weight."""
    x = copy_to_tp(x, tp.pg, tp.rec, tp.intra)
    return [matmul(x, w, tp.rec) for w in ws]


def row_linear(x: torch.Tensor, w: torch.Tensor, tp: TP) -> torch.Tensor:
    """Local input columns, full output after one all-reduce of the partial sums."""
    return reduce_from_tp(matmul(x, w, tp.rec), tp.pg, tp.rec, tp.intra)


def heads_row_linear(o: torch.Tensor, w: torch.Tensor, tp: TP) -> torch.Tensor:
    """The attention output projection: local heads o [b, heads, s, d] in, full output out."""
    return reduce_from_tp(heads_linear(o, w, tp.rec), tp.pg, tp.rec, tp.intra)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None,
                        device: torch.device | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies [head_dim / 2], fp32, as ``transformers`` computes them for
    plain RoPE and its ``linear`` and ``llama3`` scalings (``COMPUTED_ROPE``)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                        device=device).float() / head_dim))
    if scaling is None or scaling.kind == "default":
        return inv
    if scaling.kind == "linear":
        assert scaling.factor is not None  # RopeScaling.__post_init__ requires it for linear
        return inv / scaling.factor
    if scaling.kind != "llama3":
        raise InputError("model.rope_scaling", f"rope_type {scaling.kind!r} is planned, but "
                         "the engine computes these RoPE variants only", sorted(COMPUTED_ROPE))
    # llama3: short wavelengths kept, long ones divided by the factor, a linear blend in the
    # band between (in 1 / wavelength) -- Meta's Llama 3.1 reference code
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_position_embeddings
    # RopeScaling.__post_init__ requires all four for llama3
    assert factor is not None and low is not None and high is not None and original is not None
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    middle = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(middle, blended, scaled)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [b, s, head_dim] for integer ``positions`` [b, s]."""
    ang = positions[..., None].float() * inv_freq
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              rec: Recorder, causal: bool) -> torch.Tensor:
    """softmax(QK^T / sqrt(d)) V with grouped KV heads, timed as attention.

    ``mask`` is a boolean [b, 1, sq, sk] (True = may attend) or None with ``causal``.
    """
    gqa = q.shape[1] != k.shape[1]
    with rec.span(OpClass.ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             is_causal=causal and mask is None, enable_gqa=gqa)
    rec.time_backward(out, OpClass.ATTENTION)
    return out


def vocab_embedding(ids: torch.Tensor, w: torch.Tensor, start: int, tp: TP) -> torch.Tensor:
    """Rows ``start:start+len(w)`` of the padded vocabulary live here; other ids give zeros,
    and the all-reduce over TP fills every position with its one owner's row."""
    if tp.size == 1:
        return F.embedding(ids, w)
    local = ids - start
    outside = (local < 0) | (local >= w.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), w)
    out = out.masked_fill(outside[..., None], 0.0)
    return reduce_from_tp(out, tp.pg, tp.rec, tp.intra)


def mask_padding(logits: torch.Tensor, valid: int) -> torch.Tensor:
    """Columns at and past ``valid`` are vocabulary padding: -inf, so they carry no mass."""
    if valid >= logits.shape[-1]:
        return logits
    pad = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    pad[valid:] = True
    return logits.masked_fill(pad, float("-inf"))


class _VocabParallelLogProb(torch.autograd.Function):
    """log softmax(logits / T)[target] with logits split by vocabulary over TP ranks.

    Three reductions over TP replace gathering the logits: the max, the sum of exponentials and
    the target's logit (the last two in one all-reduce). The temperature enters as a factor
    ``inv_t`` = 1 / T of the shifted logits (a positive factor keeps the max where it is), so
    no scaled copy of the logits is made. Backward is local:
    d logp / d logits = (onehot(target) - softmax(logits / T)) / T.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, start: int, tp: TP,
                inv_t: float) -> torch.Tensor:
        vl = logits.shape[1]
        m = logits.max(dim=-1).values
        all_reduce(m, tp.pg, tp.rec, tp.intra, dist.ReduceOp.MAX)
        local = target - start
        inside = (local >= 0) & (local < vl)
        idx = local.clamp(0, vl - 1)
        picked = torch.where(inside, logits.gather(1, idx[:, None]).squeeze(1) - m, 0.0)
        exp = logits - m[:, None]   # one [n, V/tp] buffer beside the logits
        if inv_t != 1.0:
            exp.mul_(inv_t)
            picked = picked * inv_t
        exp.exp_()
        sums = torch.stack((exp.sum(dim=-1), picked), dim=1)
        all_reduce(sums, tp.pg, tp.rec, tp.intra)
        ctx.save_for_backward(exp.div_(sums[:, :1]), idx, inside)
        ctx.inv_t = inv_t
        return sums[:, 1] - sums[:, 0].log()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        prob, idx, inside = ctx.saved_tensors
        g = g * ctx.inv_t if ctx.inv_t != 1.0 else g
        grad = prob * (-g[:, None])
        grad.scatter_add_(1, idx[:, None], (g * inside)[:, None])
        return grad, None, None, None, None


def vocab_logprob(logits: torch.Tensor, target: torch.Tensor, start: int, tp: TP,
                  temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of ``target`` [n] under local logits [n, V/tp] (padding masked) divided
    by ``temperature``, fp32."""
    return _VocabParallelLogProb.apply(logits.float(), target, start, tp, 1.0 / temperature)


def gather_vocab(logits: torch.Tensor, vocab: int, tp: TP) -> torch.Tensor:
    """Full-vocabulary logits [..., vocab] from the local columns (sampling and tests only)."""
    from nereus.engine.comm import all_gather

    if tp.size == 1:
        return logits[..., :vocab]
    parts = all_gather(logits.contiguous(), tp.pg, tp.rec, tp.intra)
    return torch.cat(parts, dim=-1)[..., :vocab]
