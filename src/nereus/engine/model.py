"""The Llama-style decoder computed on one worker's shards (one TP/PP position of a replica).

The model owns no weights: it computes on the shard tensors of the state it is handed (the
runtime's ``ShardedState``), keyed and shaped as ``nereus.spec.sharding.shard_plan`` says, so a
training step updates the very tensors a transition later moves. Layers come from
``layer_range``; the embedding lives on the first block, the final norm and head on the last.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.layers import (
    TP,
    apply_rotary,
    attention,
    column_linear,
    gather_vocab,
    heads_row_linear,
    inverse_frequencies,
    mask_padding,
    matmul,
    rms_norm,
    rotary_tables,
    row_linear,
    swiglu,
    vocab_embedding,
    vocab_logprob,
)
from nereus.engine.measure import Recorder
from nereus.errors import InputError
from nereus.spec.model import COMPUTED, Head, ModelSpec
from nereus.spec.sharding import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    SCORE,
    SCORE_BIAS,
    Shard,
    layer_range,
    shard_plan,
)


@dataclass
class KVCache:
    """Keys and values of this worker's layers for its local KV heads (sharded by heads):
    [b, local_kv_heads, capacity, head_dim] per layer; ``length`` positions are filled."""

    k: dict[int, torch.Tensor]
    v: dict[int, torch.Tensor]
    length: int = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k.values(), *self.v.values()))


@dataclass(frozen=True)
class Inputs:
    """What every stage of a replica needs about one micro-batch besides its hidden states."""

    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None     # boolean [b, 1, sq, sk], True = may attend; None = causal only


def attention_mask(am: torch.Tensor | None, sq: int, sk: int) -> torch.Tensor | None:
    """Causal mask over ``sk`` keys for the last ``sq`` queries, with padded keys masked out.

    A padded query may always see itself, so no softmax row is empty (its output is unused).
    """
    if am is None:
        return None
    b = am.shape[0]
    dev = am.device
    qpos = torch.arange(sk - sq, sk, device=dev)
    kpos = torch.arange(sk, device=dev)
    causal = kpos[None, :] <= qpos[:, None]
    mask = causal[None, None] & am[:, None, None, :sk].bool()
    mask = mask | (kpos[None, :] == qpos[:, None])[None, None]
    return mask.expand(b, 1, sq, sk)


def check_temperature(temperature: float) -> None:
    """The temperature of log-probs: finite and > 0 (0, greedy sampling, has no log-probs)."""
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature <= 0):
        raise InputError("temperature", f"log-probs need a finite temperature > 0, got "
                         f"{temperature!r}")


class ParallelModel:
    """One position's part of the decoder: ``stage_forward`` maps the stage's input (token ids on
    the first block, hidden states elsewhere) to its output (hidden states; after the final norm
    on the last block), and the head functions turn final hidden states into log-probs, values
    or full-vocabulary logits."""

    def __init__(self, spec: ModelSpec, head: Head, pos: Position,
                 shards: Mapping[str, torch.Tensor], groups: ParallelGroups | None = None,
                 recorder: Recorder | None = None) -> None:
        if spec.model_type not in COMPUTED:
            raise InputError("model.model_type", f"{spec.model_type!r} is planned, but the "
                             "engine computes Llama's layer only", sorted(COMPUTED))
        if spec.sliding_window is not None:
            raise InputError("model.sliding_window", f"{spec.sliding_window}: the engine "
                             "computes attention over the whole sequence only")
        self.spec, self.head, self.pos = spec, head, pos
        self.groups = groups or ParallelGroups()
        self.groups.check(pos)
        self.plan: dict[str, Shard] = {
            s.name: s for s in shard_plan(spec, head, pos.tp, pos.pp, pos.tp_rank, pos.pp_rank)}
        missing = sorted(set(self.plan) - set(shards))
        if missing:
            raise InputError("shards", f"position {pos} lacks {missing[:3]}"
                             f"{' ...' if len(missing) > 3 else ''}")
        for name, s in self.plan.items():
            if tuple(shards[name].shape) != s.local_shape:
                raise InputError(f"shards.{name}", f"shape {tuple(shards[name].shape)}, the "
                                 f"sharding format says {s.local_shape}")
        self.params: dict[str, torch.Tensor] = {n: shards[n] for n in self.plan}
        any_param = next(iter(self.params.values()))
        self.dtype, self.device = any_param.dtype, any_param.device
        self.rec = recorder or Recorder(self.device, enabled=False)
        self.tp = TP(self.groups.tp, self.rec, self.groups.tp_intra)
        self.layers = layer_range(spec, pos.pp, pos.pp_rank)
        self.local_heads = spec.num_heads // pos.tp
        self.local_kv = max(1, spec.num_kv_heads // pos.tp)
        self.recompute = False  # keep only layer inputs; rerun each layer in backward
        # refuses a RoPE variant it does not compute
        self.inv_freq = inverse_frequencies(spec.head_dim, spec.rope_theta, spec.rope_scaling,
                                            self.device)

    # ------------------------------------------------------------------ inputs
    def inputs(self, positions: torch.Tensor, am: torch.Tensor | None, sq: int, sk: int) -> Inputs:
        """Rotary tables for the ``sq`` query positions and the attention mask over ``sk`` keys.

        ``positions`` [b, sq] are the queries' position ids; ``am`` [b, sk] marks real keys.
        """
        cos, sin = rotary_tables(positions, self.inv_freq, self.dtype)
        if am is not None and bool(am[:, :sk].all()):
            am = None
        mask = attention_mask(am, sq, sk)
        if mask is None and sq != sk:   # decode without padding: every cached key is visible
            mask = torch.ones(positions.shape[0], 1, sq, sk, dtype=torch.bool,
                              device=positions.device)
        return Inputs(cos, sin, mask)

    # ------------------------------------------------------------------ blocks
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        s = self.plan[EMBED]
        return vocab_embedding(ids, self.params[EMBED], s.start, self.tp)

    def layer(self, i: int, h: torch.Tensor, inp: Inputs, cache: KVCache | None = None
              ) -> torch.Tensor:
        spec, p, w = self.spec, f"model.layers.{i}.", self.params
        b, s, _ = h.shape
        hd = spec.head_dim
        x = rms_norm(h, w[p + "input_layernorm.weight"], spec.rms_norm_eps)
        q, k, v = column_linear(x, [w[p + "self_attn.q_proj.weight"],
                                    w[p + "self_attn.k_proj.weight"],
                                    w[p + "self_attn.v_proj.weight"]], self.tp)
        if spec.qkv_bias:  # each rank's bias rows are its heads'
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        q = q.view(b, s, self.local_heads, hd)
        k = k.view(b, s, self.local_kv, hd)
        v = v.view(b, s, self.local_kv, hd)
        if spec.qk_norm:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], spec.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], spec.rms_norm_eps)
        q = apply_rotary(q.transpose(1, 2), inp.cos, inp.sin)
        k = apply_rotary(k.transpose(1, 2), inp.cos, inp.sin)
        v = v.transpose(1, 2)
        if cache is not None:
            start = cache.length
            cache.k[i][:, :, start:start + s] = k
            cache.v[i][:, :, start:start + s] = v
            k = cache.k[i][:, :, :start + s]
            v = cache.v[i][:, :, :start + s]
        o = attention(q, k, v, inp.mask, self.rec, causal=True)
        h = h + heads_row_linear(o, w[p + "self_attn.o_proj.weight"], self.tp)
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], spec.rms_norm_eps)
        g, u = column_linear(x, [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                             self.tp)
        return h + row_linear(swiglu(g, u), w[p + "mlp.down_proj.weight"], self.tp)

    def stage_forward(self, x: torch.Tensor, inp: Inputs, cache: KVCache | None = None
                      ) -> torch.Tensor:
        """Token ids [b, s] (first block) or hidden states [b, s, h] -> this block's output."""
        h = self.embed(x) if self.pos.first else x
        checkpoint = self.recompute and cache is None and torch.is_grad_enabled()
        for i in self.layers:
            if checkpoint:
                # the rerun happens inside the backward span of the layer's first backward
                # node: the recorder takes it out of that span and counts it as a forward
                h = torch.utils.checkpoint.checkpoint(self.layer, i, h, inp, use_reentrant=False,
                                                      context_fn=self._recompute_contexts)
            else:
                h = self.layer(i, h, inp, cache)
        if cache is not None:
            cache.length += x.shape[1]
        if self.pos.last:
            h = rms_norm(h, self.params[FINAL_NORM], self.spec.rms_norm_eps)
        return h

    def _recompute_contexts(self) -> tuple[AbstractContextManager[None],
                                           AbstractContextManager[None]]:
        """Contexts of a checkpointed layer's forward and of its rerun in backward."""
        return nullcontext(), self.rec.recomputing()

    # ------------------------------------------------------------------ heads (last block)
    def _head_weight(self) -> tuple[torch.Tensor, Shard]:
        name = LM_HEAD if LM_HEAD in self.plan else EMBED  # tied, pp = 1: the embedding itself
        return self.params[name], self.plan[name]

    def local_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of this rank's vocabulary rows, padding at -inf: [..., V_padded / tp]."""
        w, s = self._head_weight()
        return mask_padding(column_linear(h, [w], self.tp)[0], s.valid_len)

    def logprobs(self, h: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
                 ) -> torch.Tensor:
        """log p(ids[:, t+1] | ids[:, :t+1]) for t < s - 1: [b, s - 1], fp32, vocab-parallel,
        under the distribution sampled at ``temperature``: softmax(logits / temperature), as
        RL frameworks score a rollout drawn at that temperature (verl divides the logits by it
        in its actor and reference log-probs)."""
        check_temperature(temperature)
        b, s, _ = h.shape
        logits = self.local_logits(h[:, :-1])
        _, shard = self._head_weight()
        lp = vocab_logprob(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           shard.start, self.tp, temperature)
        return lp.view(b, s - 1)

    def values(self, h: torch.Tensor) -> torch.Tensor:
        """Scalar head (critic values, reward scores) per token: [b, s], fp32."""
        return (matmul(h, self.params[SCORE], self.rec).squeeze(-1)
                + self.params[SCORE_BIAS]).float()

    def full_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits [..., vocab] (sampling and checks; training never needs them)."""
        return gather_vocab(self.local_logits(h).float().contiguous(), self.spec.vocab_size,
                            self.tp)

    # ------------------------------------------------------------------ state
    def new_cache(self, batch: int, capacity: int) -> KVCache:
        shape = (batch, self.local_kv, capacity, self.spec.head_dim)
        return KVCache({i: torch.zeros(shape, dtype=self.dtype, device=self.device)
                        for i in self.layers},
                       {i: torch.zeros(shape, dtype=self.dtype, device=self.device)
                        for i in self.layers})

    def hidden_shape(self, b: int, s: int) -> tuple[int, int, int]:
        return (b, s, self.spec.hidden_size)
