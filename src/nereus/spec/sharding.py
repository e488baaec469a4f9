"""How a Llama-style decoder's state is sharded over a (tp, pp) layout.

This is the one sharding format of the project: the runtime stores state in it, the
engine computes on it, and the transition planner counts the bytes each shard moves with it.
Pure Python, so the planning layers can use it.

- Layers are split into ``pp`` contiguous equal blocks; the embedding sits on the first block,
  the final norm and the output head on the last.
- q/k/v, gate and up projections are split on dim 0 (attention by heads), o and down on dim 1;
  q/k/v biases (Qwen2) follow their projection's rows;
  embedding and LM head by vocabulary rows (the vocabulary padded, see ``padded_vocab``); norms and
  the scalar head are replicated.
- With fewer KV heads than tp, each KV head is replicated on ``tp // num_kv_heads`` ranks.
- With tied embeddings and pp > 1, the last block holds ``lm_head.weight`` as a copy of the
  embedding; the logical state holds the embedding once.
Optimizer tensors follow their parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from nereus.errors import InputError
from nereus.spec.model import Head, ModelSpec

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
SCORE = "score.weight"
SCORE_BIAS = "score.bias"  # the critic's (transformers' ...ForTokenClassification has one)


# the tensors of K and V heads: replicated on tp // num_kv_heads ranks when tp > num_kv_heads
KV_TENSORS = ("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_proj.bias",
              "self_attn.v_proj.bias")


def is_kv(name: str) -> bool:
    """Whether ``name`` holds K or V heads (a projection or its bias)."""
    return name.endswith(KV_TENSORS)


@dataclass(frozen=True)
class LogicalParam:
    """One tensor of the model's logical (unsharded) state."""

    name: str
    shape: tuple[int, ...]
    split_dim: int | None        # dim split over TP ranks, None when replicated
    layer: int | None            # decoder layer index, None for embedding / norm / head
    unit: int = 1                # split granularity on split_dim (head_dim for attention)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Shard:
    """The slice of ``logical`` one (tp_rank, pp_rank) holds, stored under ``name``.

    ``start:stop`` index ``split_dim`` in padded coordinates; rows at and past ``valid_stop`` are
    padding (zeros) that the logical tensor does not have.
    """

    name: str
    logical: str
    full_shape: tuple[int, ...]
    split_dim: int | None
    start: int
    stop: int
    valid_stop: int

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self.split_dim is None:
            return self.full_shape
        s = list(self.full_shape)
        s[self.split_dim] = self.stop - self.start
        return tuple(s)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.local_shape:
            n *= d
        return n

    @property
    def valid_len(self) -> int:
        """Rows of the logical tensor this shard holds (excludes padding)."""
        return max(0, min(self.stop, self.valid_stop) - self.start)


VOCAB_PAD = 64  # vocabulary rows are padded to a multiple of lcm(64, tp)


def padded_vocab(model: ModelSpec, tp: int) -> int:
    """Padded vocabulary size. A multiple of 64 for every tp dividing 64, so the row ranges of
    tp and of any tp' that divides it nest, and Split / Merge of the embedding stay local."""
    multiple = math.lcm(VOCAB_PAD, tp)
    return -(-model.vocab_size // multiple) * multiple


def layout_problem(model: ModelSpec, tp: int, pp: int) -> str | None:
    """Why (tp, pp) cannot shard ``model``, or None when it can."""
    if tp < 1 or pp < 1:
        return f"tp={tp} and pp={pp} must be >= 1"
    if model.num_layers % pp:
        return f"pp={pp} does not divide the {model.num_layers} layers"
    if model.num_heads % tp:
        return f"tp={tp} does not divide the {model.num_heads} attention heads"
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        return f"tp={tp} and the {model.num_kv_heads} KV heads do not divide one another"
    if model.intermediate_size % tp:
        return f"tp={tp} does not divide intermediate_size={model.intermediate_size}"
    return None


def layout_sizes(model: ModelSpec) -> str:
    """The tp and pp sizes that shard ``model``, for an error's allowed part: every tp that
    meets ``layout_problem``'s rules (at pp = 1; they do not depend on pp) and every divisor
    of the layer count."""
    tps = [t for t in range(1, model.num_heads + 1) if layout_problem(model, t, 1) is None]
    pps = [p for p in range(1, model.num_layers + 1) if model.num_layers % p == 0]
    return f"tp in {', '.join(map(str, tps))}; pp in {', '.join(map(str, pps))}"


def check_layout(model: ModelSpec, tp: int, pp: int) -> None:
    problem = layout_problem(model, tp, pp)
    if problem:
        raise InputError("layout", f"{model.name}: {problem}", layout_sizes(model))


def layer_range(model: ModelSpec, pp: int, pp_rank: int) -> range:
    per = model.num_layers // pp
    return range(pp_rank * per, (pp_rank + 1) * per)


@lru_cache(maxsize=64)
def logical_params(model: ModelSpec, head: Head = Head.LM) -> tuple[LogicalParam, ...]:
    """The model's logical tensors in a fixed order (embedding, layers, norm, head)."""
    h, hd = model.hidden_size, model.head_dim
    out = [LogicalParam(EMBED, (model.vocab_size, h), 0, None)]
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        out += [
            LogicalParam(p + "input_layernorm.weight", (h,), None, i),
            LogicalParam(p + "self_attn.q_proj.weight", (model.q_dim, h), 0, i, hd),
            LogicalParam(p + "self_attn.k_proj.weight", (model.kv_dim, h), 0, i, hd),
            LogicalParam(p + "self_attn.v_proj.weight", (model.kv_dim, h), 0, i, hd),
            LogicalParam(p + "self_attn.o_proj.weight", (h, model.q_dim), 1, i, hd),
        ]
        if model.qkv_bias:
            out += [LogicalParam(p + "self_attn.q_proj.bias", (model.q_dim,), 0, i, hd),
                    LogicalParam(p + "self_attn.k_proj.bias", (model.kv_dim,), 0, i, hd),
                    LogicalParam(p + "self_attn.v_proj.bias", (model.kv_dim,), 0, i, hd)]
        if model.qk_norm:
            out += [LogicalParam(p + "self_attn.q_norm.weight", (hd,), None, i),
                    LogicalParam(p + "self_attn.k_norm.weight", (hd,), None, i)]
        out += [
            LogicalParam(p + "post_attention_layernorm.weight", (h,), None, i),
            LogicalParam(p + "mlp.gate_proj.weight", (model.intermediate_size, h), 0, i),
            LogicalParam(p + "mlp.up_proj.weight", (model.intermediate_size, h), 0, i),
            LogicalParam(p + "mlp.down_proj.weight", (h, model.intermediate_size), 1, i),
        ]
    out.append(LogicalParam(FINAL_NORM, (h,), None, None))
    if head is Head.SCALAR:
        out += [LogicalParam(SCORE, (1, h), None, None),
                LogicalParam(SCORE_BIAS, (1,), None, None)]
    elif not model.tie_embeddings:
        out.append(LogicalParam(LM_HEAD, (model.vocab_size, h), 0, None))
    return tuple(out)


def _split(p: LogicalParam, model: ModelSpec, tp: int, tp_rank: int, name: str) -> Shard:
    if p.split_dim is None:
        return Shard(name, p.name, p.shape, None, 0, 0, 0)
    full = p.shape[p.split_dim]
    if p.name in (EMBED, LM_HEAD):
        padded = padded_vocab(model, tp)
        per = padded // tp
        start = tp_rank * per
        return Shard(name, p.name, p.shape, 0, start, start + per, full)
    if is_kv(p.name) and model.num_kv_heads < tp:
        kv_head = tp_rank // (tp // model.num_kv_heads)
        start = kv_head * model.head_dim
        return Shard(name, p.name, p.shape, p.split_dim, start, start + model.head_dim, full)
    per = full // tp
    return Shard(name, p.name, p.shape, p.split_dim, tp_rank * per, (tp_rank + 1) * per, full)


@lru_cache(maxsize=4096)
def shard_plan(model: ModelSpec, head: Head, tp: int, pp: int, tp_rank: int,
               pp_rank: int) -> tuple[Shard, ...]:
    """The shards held by position (tp_rank, pp_rank) of a (tp, pp) unit, in logical order."""
    check_layout(model, tp, pp)
    if not (0 <= tp_rank < tp and 0 <= pp_rank < pp):
        raise InputError("rank", f"({tp_rank}, {pp_rank}) outside tp={tp}, pp={pp}")
    layers = layer_range(model, pp, pp_rank)
    first, last = pp_rank == 0, pp_rank == pp - 1
    out: list[Shard] = []
    tied_copy: list[Shard] = []
    for p in logical_params(model, head):
        if p.layer is not None:
            if p.layer in layers:
                out.append(_split(p, model, tp, tp_rank, p.name))
        elif p.name == EMBED:
            if first:
                out.append(_split(p, model, tp, tp_rank, p.name))
            if last and not first and head is Head.LM and model.tie_embeddings:
                tied_copy.append(_split(p, model, tp, tp_rank, LM_HEAD))  # tied copy, last block
        elif last:
            out.append(_split(p, model, tp, tp_rank, p.name))
    return tuple(out + tied_copy)


@lru_cache(maxsize=8192)
def shard_numel(model: ModelSpec, head: Head, tp: int, pp: int, tp_rank: int, pp_rank: int) -> int:
    """Elements one position holds (padding and tied copies included)."""
    return sum(s.numel for s in shard_plan(model, head, tp, pp, tp_rank, pp_rank))


@lru_cache(maxsize=1024)
def max_shard_numel(model: ModelSpec, head: Head, tp: int, pp: int) -> int:
    """Elements held by the fullest position of a (tp, pp) unit.

    Every TP rank holds the same number of elements (equal splits, padded vocabulary,
    replicated KV heads), and all middle pipeline blocks are alike, so the first, one middle and
    the last block of TP rank 0 decide it.
    """
    blocks = {0, min(1, pp - 1), pp - 1}
    return max(shard_numel(model, head, tp, pp, 0, p) for p in blocks)
