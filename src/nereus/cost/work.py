"""FLOPs and activation bytes of a Llama-style decoder, per token and per layer.

Counting follows Narayanan et al. 2021 (Megatron-LM, "Efficient Large-Scale Language Model
Training on GPU Clusters", 2 FLOPs per multiply-add, backward = 2x forward) and Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models") for stored activations,
adapted to SwiGLU, grouped-query attention, no dropout, and a flash-style attention kernel that
stores Q, K, V, the output and the log-sum-exp instead of the s x s score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereus.spec.model import Head, ModelSpec


def layer_matmul_params(m: ModelSpec) -> int:
    """Weights of one layer's GEMMs (norms excluded)."""
    return m.hidden_size * (2 * m.q_dim + 2 * m.kv_dim) + 3 * m.hidden_size * m.intermediate_size


def gemm_flops_per_token(m: ModelSpec) -> float:
    """Forward GEMM FLOPs of one token through one layer."""
    return 2.0 * layer_matmul_params(m)


def attention_flops(m: ModelSpec, q_tokens: float, kv_tokens: float, causal: bool) -> float:
    """Forward FLOPs of QK^T and AV for ``q_tokens`` queries over ``kv_tokens`` keys, one layer.

    Causal self-attention over a sequence of s tokens does half the s x s work.
    """
    full = 4.0 * q_tokens * kv_tokens * m.q_dim
    return full / 2 if causal else full


def head_flops_per_token(m: ModelSpec, head: Head) -> float:
    return 2.0 * m.hidden_size * (m.vocab_size if head is Head.LM else 1)


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes stored per token for one layer's backward, split by how TP divides them."""

    replicated: float  # held whole by every TP rank (norm inputs, GEMM inputs of plain TP)
    split: float       # divided among TP ranks (per-head and per-column tensors)

    def per_rank(self, tp: int) -> float:
        return self.replicated + self.split / tp


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
    split = (q + 2 * kv) * d + q * d + 3 * inter * d + 4 * m.num_heads
    return ActivationBytes(replicated, split)


def layer_forward_workspace_bytes(m: ModelSpec, dtype_bytes: int) -> ActivationBytes:
    """Live tensors per token while one layer runs forward with nothing kept for backward."""
    d = dtype_bytes
    h, q, kv, inter = m.hidden_size, m.q_dim, m.kv_dim, m.intermediate_size
    return ActivationBytes(2 * h * d, (q + 2 * kv) * d + q * d + 2 * inter * d)
