"""FLOPs and activation bytes of a Llama-style decoder, per token and per layer.

Counting follows Narayanan et al. 2021 (Megatron-LM, "Efficient Large-Scale Language Model
Training on GPU Clusters", 2 FLOPs per multiply-add, backward = 2x forward) and Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models") for stored activations,
adapted to SwiGLU, grouped-query attention, no dropout, and a flash-style attention kernel that
stores Q, K, V, the output and the log-sum-exp instead of the s x s score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from nereus.spec.model import Head, ModelSpec

Arr = TypeVar("Arr", float, np.ndarray)  # a scalar, or one value per candidate


def layer_matmul_params(m: ModelSpec) -> int:
    """Weights of one layer's GEMMs (norms excluded)."""
    return m.hidden_size * (2 * m.q_dim + 2 * m.kv_dim) + 3 * m.hidden_size * m.intermediate_size


def kv_share(kv_heads: int, tp: Arr) -> Arr:
    """The share of the K and V projections (and their activations) one TP rank holds: 1/tp,
    or one whole KV head where tp exceeds the KV heads (each rank keeps its group's head)."""
    return np.maximum(1.0 / tp, 1.0 / kv_heads)


def gemm_flops_per_token_per_rank(m: ModelSpec, tp: Arr) -> Arr:
    """Forward GEMM FLOPs of one token through one layer on one of ``tp`` TP ranks: q, o and
    the MLP split by tp, k and v by ``kv_share``."""
    h = m.hidden_size
    split = h * (2 * m.q_dim + 3 * m.intermediate_size)
    return 2.0 * (split / tp + h * 2 * m.kv_dim * kv_share(m.num_kv_heads, tp))


def attention_flops(m: ModelSpec, q_tokens: float, kv_tokens: float, causal: bool,
                    window: float | None = None) -> float:
    """Forward FLOPs of QK^T and AV for ``q_tokens`` queries over ``kv_tokens`` keys, one layer.

    Causal self-attention over a sequence of s tokens does half the s x s work. ``window``: a
    sliding layer's, each query sees at most that many keys (causal: w^2/2 + (s - w) w pairs
    past the window; otherwise min(keys, w) per query).
    """
    if window is not None and window < kv_tokens:
        if causal:
            return 4.0 * (window * window / 2 + (kv_tokens - window) * window) * m.q_dim \
                * (q_tokens / kv_tokens)
        return 4.0 * q_tokens * window * m.q_dim
    full = 4.0 * q_tokens * kv_tokens * m.q_dim
    return full / 2 if causal else full


def head_flops_per_token(m: ModelSpec, head: Head) -> float:
    return 2.0 * m.hidden_size * (m.vocab_size if head is Head.LM else 1)


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes stored per token for one layer's backward, split by how TP divides them."""

    replicated: float  # held whole by every TP rank (norm inputs, GEMM inputs of plain TP)
    split: float       # divided among TP ranks (per-head and per-column tensors)
    kv: float = 0.0    # K and V: divided among TP ranks down to one KV head per rank
    kv_heads: int = 1

    def per_rank(self, tp: Arr) -> Arr:
        return self.replicated + self.split / tp + self.kv * kv_share(self.kv_heads, tp)


def layer_activation_bytes(m: ModelSpec, dtype_bytes: int) -> ActivationBytes:
    """Activations one layer stores per token for its backward pass (no recomputation).

    Replicated: input of input_layernorm, its output (q/k/v GEMM input), input of
    post_attention_layernorm, its output (gate/up GEMM input): 4 x h.
    Split by heads or columns: Q, K, V after RoPE; attention output (o_proj input); gate, up and
    their SwiGLU product (down_proj input); the log-sum-exp (fp32, one per head).
    """
    d = dtype_bytes
    h, q, kv, inter = m.hidden_size, m.q_dim, m.kv_dim, m.intermediate_size
    replicated = 4 * h * d
    split = q * d + q * d + 3 * inter * d + 4 * m.num_heads
    return ActivationBytes(replicated, split, 2 * kv * d, m.num_kv_heads)


def layer_forward_workspace_bytes(m: ModelSpec, dtype_bytes: int) -> ActivationBytes:
    """Live tensors per token while one layer runs forward with nothing kept for backward."""
    d = dtype_bytes
    h, q, kv, inter = m.hidden_size, m.q_dim, m.kv_dim, m.intermediate_size
    return ActivationBytes(2 * h * d, q * d + q * d + 2 * inter * d, 2 * kv * d,
                           m.num_kv_heads)
