"""Memory-lean autograd functions for the elementwise parts of a layer.

Left to autograd, RMSNorm, rotary embeddings and SwiGLU each keep several intermediate tensors
for backward. These functions keep only what the activation-memory count of
``nereus.cost.work.layer_activation_bytes`` (Korthikanti et al. 2022, adapted) assumes: the
norm's input, nothing for rotary (its tables are shared by all layers), gate and up for SwiGLU,
and the attention output once (the output projection reads it in head layout). So the memory the
engine measures is the memory the cost model predicts, up to the allocator.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nereus.cost.ops import OpClass
from nereus.engine.measure import Recorder


class _RMSNorm(torch.autograd.Function):
    """w * (x / rms(x)) with the normalisation in fp32 (as ``transformers`` computes it);
    keeps x and the per-row 1/rms."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return w * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (g * xhat.to(x.dtype)).reshape(-1, x.shape[-1]).sum(0).to(w.dtype)
        dh = (g * w).float()
        grad_x = rstd * (dh - xhat * (dh * xhat).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_w, None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return _RMSNorm.apply(x, w, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_half_t(y: torch.Tensor) -> torch.Tensor:
    """The transpose of ``_rotate_half`` (its inverse): [y1, y2] -> [y2, -y1]."""
    half = y.shape[-1] // 2
    return torch.cat((y[..., half:], -y[..., :half]), dim=-1)


class _Rotary(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin for x [b, heads, s, d] and tables [b, s, d]; keeps only
    the tables (shared by every layer of the micro-batch)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, s = cos[:, None], sin[:, None]
        ctx.save_for_backward(cos, sin)
        return x * c + _rotate_half(x) * s

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        return g * cos[:, None] + _rotate_half_t(g * sin[:, None]), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, heads, s, d] by the tables [b, s, d] (half-split convention of HF)."""
    return _Rotary.apply(x, cos, sin)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up, keeping gate and up (the down projection keeps the product)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate.float())
        gf = gate.float()
        silu = gf * sig
        grad_up = (g.float() * silu).to(up.dtype)
        grad_gate = (g.float() * up.float() * sig * (1 + gf * (1 - sig))).to(gate.dtype)
        return grad_gate, grad_up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _SwiGLU.apply(gate, up)


class _HeadsLinear(torch.autograd.Function):
    """y = flatten_heads(o) @ w.T for o [b, heads, s, d] (attention's output layout).

    Keeps ``o`` itself (attention keeps it too, so it is stored once) rather than the
    [b, s, heads * d] copy a plain matmul would keep; the copy is remade in backward.
    """

    @staticmethod
    def forward(ctx: Any, o: torch.Tensor, w: torch.Tensor, rec: Recorder) -> torch.Tensor:
        b, h, s, d = o.shape
        x = o.transpose(1, 2).reshape(b * s, h * d)
        with rec.span(OpClass.GEMM):
            y = x @ w.t()
        ctx.save_for_backward(o, w)
        ctx.rec = rec
        return y.view(b, s, w.shape[0])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        o, w = ctx.saved_tensors
        b, h, s, d = o.shape
        g2 = g.reshape(b * s, -1)
        grad_o = grad_w = None
        with ctx.rec.span(OpClass.GEMM):
            if ctx.needs_input_grad[1]:
                grad_w = g2.t() @ o.transpose(1, 2).reshape(b * s, h * d)
            if ctx.needs_input_grad[0]:
                grad_o = (g2 @ w).view(b, s, h, d).transpose(1, 2)
        return grad_o, grad_w, None


def heads_linear(o: torch.Tensor, w: torch.Tensor, rec: Recorder) -> torch.Tensor:
    return _HeadsLinear.apply(o, w, rec)
