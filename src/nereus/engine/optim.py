"""Adam on shard tensors, with the gradient bookkeeping that makes a sharded step equal the
unsharded one: which gradients TP ranks must sum, which elements count once in the global norm.

State is fp32: on CPU the parameters themselves are fp32 and are updated in place; with bf16
parameters (GPU) an fp32 master copy is updated and cast back. Moments follow their parameter's
shard, as the sharding format says, so a transition moves them with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from nereus.cost.ops import OpClass
from nereus.engine.measure import Recorder
from nereus.errors import InputError, is_finite_real
from nereus.spec.model import ModelSpec
from nereus.spec.sharding import Shard, is_kv


@dataclass(frozen=True)
class AdamConfig:
    """torch.optim.AdamW's update rule (weight decay decoupled; 0 gives Adam) and the global
    gradient-norm clip (None: no clipping)."""

    lr: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        # what torch.optim.AdamW accepts, and finite (an infinite lr or eps, which torch lets
        # through for lr, turns every parameter into inf or nan on the first step)
        for name in ("lr", "eps", "weight_decay"):
            v = getattr(self, name)
            if not is_finite_real(v) or v < 0:
                raise InputError(f"adam.{name}", f"must be finite and >= 0, got {v!r}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if not is_finite_real(v) or not 0 <= v < 1:
                raise InputError(f"adam.{name}", f"must be in [0, 1), got {v!r}")
        v = self.max_grad_norm
        if v is not None and not (is_finite_real(v) and v > 0):
            raise InputError("adam.max_grad_norm", f"must be finite and > 0, or None (no "
                             f"clipping), got {v!r}")


@dataclass
class AdamState:
    """Per shard name: first and second moments, and the fp32 master copy where the parameter
    is not fp32. ``step`` counts updates (Adam's bias correction)."""

    exp_avg: dict[str, torch.Tensor]
    exp_avg_sq: dict[str, torch.Tensor]
    master: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0

    @classmethod
    def zeros(cls, params: Mapping[str, torch.Tensor]) -> AdamState:
        return cls({n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()},
                   {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()},
                   {n: p.detach().float().clone() for n, p in params.items()
                    if p.dtype != torch.float32})

    def tensors(self) -> list[torch.Tensor]:
        return [*self.exp_avg.values(), *self.exp_avg_sq.values(), *self.master.values()]


def counts_once(shard: Shard, spec: ModelSpec, tp: int, tp_rank: int) -> bool:
    """Whether this rank's copy of ``shard`` counts in the replica's gradient norm: replicated
    tensors count on tp_rank 0, replicated KV heads on the first rank of their group, the
    tied LM-head copy never (the embedding counts it)."""
    if shard.name != shard.logical:
        return False
    if shard.split_dim is None:
        return tp_rank == 0
    if is_kv(shard.name) and spec.num_kv_heads < tp:
        return tp_rank % (tp // spec.num_kv_heads) == 0
    return True


def is_qk_norm(name: str) -> bool:
    return name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight"))


@torch.no_grad()
def adam_update(params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                state: AdamState, cfg: AdamConfig, scale: float, rec: Recorder) -> None:
    """One AdamW update of every parameter with gradient ``grads[name] * scale`` (fp32
    gradients, scaled in place; each one's buffer then holds its denominator). Allocates
    nothing, so it cannot run out of memory halfway; the step counter moves last."""
    with rec.span(OpClass.OPTIMIZER):
        t = state.step + 1
        bias1 = 1.0 - cfg.beta1 ** t
        bias2_sqrt = math.sqrt(1.0 - cfg.beta2 ** t)
        for name, p in params.items():
            g = grads[name]   # fp32; the step's own buffer, so it may be scaled in place
            if scale != 1.0:
                g.mul_(scale)
            m, v = state.exp_avg[name], state.exp_avg_sq[name]
            w = state.master.get(name, p)
            if cfg.weight_decay:
                w.mul_(1.0 - cfg.lr * cfg.weight_decay)
            m.lerp_(g, 1.0 - cfg.beta1)
            v.mul_(cfg.beta2).addcmul_(g, g, value=1.0 - cfg.beta2)
            denom = torch.sqrt(v, out=g).div_(bias2_sqrt).add_(cfg.eps)  # g is spent
            w.addcdiv_(m, denom, value=-cfg.lr / bias1)
            if w is not p:
                p.copy_(w)
        state.step = t
