"""Where a model-stage's state comes from: a seeded init or a Hugging Face safetensors checkpoint.

The seeded init makes each logical tensor from a seed derived from the base seed and the tensor's
name, then slices it. So the state does not depend on the layout it is built in: a (tp=4, pp=2)
unit and a (tp=1, pp=1) unit built with one seed hold the same logical state, which is what lets
tests and benchmarks check a transition bitwise without gathering through one process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from nereus.errors import InputError
from nereus.runtime.state import (
    EXP_AVG,
    EXP_AVG_SQ,
    MASTER,
    PARAM,
    LogicalState,
    ShardedState,
    StateMeta,
    StateSpec,
    derive_seed,
)
from nereus.spec.sharding import (
    EMBED,
    LM_HEAD,
    SCORE_BIAS,
    LogicalParam,
    Shard,
    logical_params,
)

WARM_STEPS = 7  # the seeded "warm" state looks like a run after this many optimizer updates


def seeded_meta(seed: int, warm: bool = True) -> StateMeta:
    """Scalars of a seeded state; ``warm`` makes them non-trivial so a check can fail."""
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, "rng"))
    if warm:
        torch.rand(WARM_STEPS, generator=g)
    rng = bytes(g.get_state().tolist())
    n = WARM_STEPS if warm else 0
    return StateMeta(adam_step=n, update_count=n, versions=(("model", n), ("policy", n)),
                     minibatch_pos=4 * n, seed=seed, rng_state=rng)


def _gen(seed: int, name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(derive_seed(seed, name))
    return g


def seeded_value(spec: StateSpec, p: LogicalParam, kind: str, seed: int,
                 warm: bool = True) -> torch.Tensor:
    """The full logical tensor ``kind`` of ``p`` (on CPU, in the kind's dtype)."""
    if kind in (PARAM, MASTER):
        g = _gen(seed, f"{p.name}/param")
        base = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if p.name.endswith("bias"):  # near 0 (a norm's weight is near 1)
            base = base.mul_(0.1)
        else:
            base = base.mul_(0.1).add_(1.0) if len(p.shape) == 1 else base.mul_(0.02)
        return base.to(spec.dtype(kind))
    if not warm:
        return torch.zeros(p.shape, dtype=torch.float32)
    g = _gen(seed, f"{p.name}/{kind}")
    v = torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(1e-3)
    return v.square_() if kind == EXP_AVG_SQ else v


def _slice(full: torch.Tensor, shard: Shard) -> torch.Tensor:
    if shard.split_dim is None:
        return full
    return full.narrow(shard.split_dim, shard.start, shard.valid_len)


def _valid_shape(shard: Shard) -> tuple[int, ...]:
    shape = list(shard.local_shape)
    if shard.split_dim is not None:
        shape[shard.split_dim] = shard.valid_len
    return tuple(shape)


def _fill(state: ShardedState, source: Iterator[tuple[str, Shard, torch.Tensor]]) -> ShardedState:
    for kind, shard, part in source:
        view = state.tensor(kind, shard.name)
        if shard.split_dim is None:
            view.copy_(part)
        else:
            view.narrow(shard.split_dim, 0, shard.valid_len).copy_(part)
    state.zero_padding()
    return state


def fill_seeded(state: ShardedState, seed: int, warm: bool = True) -> ShardedState:
    """Fill an allocated position with the seeded state (logical tensors made, then sliced)."""
    spec = state.spec
    params = {p.name: p for p in logical_params(spec.model, spec.head)}

    def parts() -> Iterator[tuple[str, Shard, torch.Tensor]]:
        for e in state.layout.entries:
            full = seeded_value(spec, params[e.shard.logical], e.kind, seed, warm)
            yield e.kind, e.shard, _slice(full, e.shard)

    state.meta = seeded_meta(seed, warm)
    return _fill(state, parts())


def seeded_shard(spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int, seed: int,
                 warm: bool = True, device: torch.device | str = "cpu") -> ShardedState:
    """Position (tp_rank, pp_rank) of a seeded unit: logical tensors made, then sliced."""
    state = ShardedState.empty(spec, tp, pp, tp_rank, pp_rank, seeded_meta(seed, warm), device)
    return fill_seeded(state, seed, warm)


def seeded_difference(state: ShardedState, seed: int, warm: bool = True) -> str | None:
    """Where ``state`` differs from the seeded state of its position (bitwise), or None.
    Compares one tensor at a time, so it needs no second arena. The position is the one the
    arena claims: whether it is the one its GPU should hold is ``verify_seeded``'s check."""
    spec = state.spec
    if state.meta != seeded_meta(seed, warm):
        return "scalars differ"
    params = {p.name: p for p in logical_params(spec.model, spec.head)}
    for e in state.layout.entries:
        sh = e.shard
        full = seeded_value(spec, params[sh.logical], e.kind, seed, warm)
        got = state.tensor(e.kind, sh.name).cpu()
        if sh.split_dim is None:
            same = torch.equal(got, full)
        else:
            n = sh.valid_len
            same = torch.equal(got.narrow(sh.split_dim, 0, n), _slice(full, sh)) and not bool(
                got.narrow(sh.split_dim, n, got.shape[sh.split_dim] - n).any())
        if not same:
            return f"{e.kind}:{sh.name} differs"
    return None


def seeded_logical(spec: StateSpec, seed: int, warm: bool = True) -> LogicalState:
    """The logical state every seeded unit of ``spec`` holds, whatever its layout."""
    tensors = {(k, p.name): seeded_value(spec, p, k, seed, warm)
               for k in spec.kinds for p in logical_params(spec.model, spec.head)}
    return LogicalState(spec, tensors, seeded_meta(seed, warm))


# ---------------------------------------------------------------- safetensors
def _checkpoint_files(path: Path) -> dict[str, Path]:
    """Map each tensor name to the safetensors file that holds it."""
    from safetensors import safe_open

    if path.is_file():
        files = [path]
    elif (path / "model.safetensors.index.json").is_file():
        idx = json.loads((path / "model.safetensors.index.json").read_text())
        return {k: path / v for k, v in idx["weight_map"].items()}
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputError("checkpoint", f"no safetensors file at {path}",
                         "a .safetensors file or a Hugging Face model folder")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                out[k] = f
    return out


def _check_nothing_dropped(path: str | Path, where: dict[str, Path], spec: StateSpec) -> None:
    """Refuse a checkpoint with parameters the sharding format has no place for (Phi-3's
    fused qkv_proj, an o_proj bias): read past, they would be missing from the state the
    runtime moves, and the model after a move would not be the model before. Rotary
    ``inv_freq`` buffers (older checkpoints) and a tied head's copy of the embedding are no
    parameters of their own."""
    known = {p.name for p in logical_params(spec.model, spec.head)}
    if spec.model.tie_embeddings:
        known.add(LM_HEAD)
    extra = sorted(n for n in where if n not in known and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise InputError("checkpoint", f"{path} holds {len(extra)} tensor(s) that "
                         f"{spec.model.name} has no place for, such as {extra[0]!r}: moved "
                         f"without them, the model would change",
                         "a Llama-style checkpoint without fused projections or biases "
                         "besides Qwen2's q/k/v ones (the tensors of nereus.spec.sharding)")


def load_safetensors(path: str | Path, spec: StateSpec, tp: int, pp: int, tp_rank: int,
                     pp_rank: int, seed: int = 0,
                     device: torch.device | str = "cpu") -> ShardedState:
    """Position (tp_rank, pp_rank) read from a Hugging Face checkpoint, slice by slice.

    Only the rows this position holds are read. A fresh checkpoint has no optimizer state:
    moments start at zero and the step at 0; master copies are the fp32 of the weights.
    """
    from safetensors import safe_open

    where = _checkpoint_files(Path(path))
    _check_nothing_dropped(path, where, spec)
    meta = seeded_meta(seed, warm=False)
    state = ShardedState.empty(spec, tp, pp, tp_rank, pp_rank, meta, device)
    with ExitStack() as stack:
        handles: dict[Path, Any] = {}  # safetensors' safe_open handles (untyped)

        def read(shard: Shard) -> torch.Tensor:
            name = shard.logical
            if name == LM_HEAD and name not in where and spec.model.tie_embeddings:
                name = EMBED
            if shard.name == LM_HEAD and shard.logical == EMBED:
                name = EMBED  # the tied copy on the last pipeline block
            if name == SCORE_BIAS and name not in where:
                # ...ForSequenceClassification (a reward model) has no bias: the same function
                return torch.zeros(shard.full_shape)
            if name not in where:
                raise InputError("checkpoint", f"{path} lacks tensor {name!r}",
                                 f"the parameter names of transformers' "
                                 f"{spec.model.hf_class}")
            f = where[name]
            if f not in handles:
                handles[f] = stack.enter_context(safe_open(str(f), framework="pt"))
            sl = handles[f].get_slice(name)
            shape = tuple(sl.get_shape())
            if shape != shard.full_shape:
                raise InputError("checkpoint", f"{name} has shape {shape}, the model "
                                 f"{spec.model.name} needs {shard.full_shape}")
            if shard.split_dim is None:
                return sl[:]
            idx = [slice(None)] * len(shape)
            idx[shard.split_dim] = slice(shard.start, shard.start + shard.valid_len)
            return sl[tuple(idx)]

        def parts() -> Iterator[tuple[str, Shard, torch.Tensor]]:
            cache: dict[str, torch.Tensor] = {}
            for e in state.layout.entries:
                if e.kind in (EXP_AVG, EXP_AVG_SQ):
                    yield e.kind, e.shard, torch.zeros(_valid_shape(e.shard))
                    continue
                if e.shard.name not in cache:
                    cache[e.shard.name] = read(e.shard).to(torch.float32)
                yield e.kind, e.shard, cache[e.shard.name].to(spec.dtype(e.kind))

        return _fill(state, parts())


def save_safetensors(state: LogicalState, path: str | Path) -> Path:
    """Write the parameters of a logical state as a Hugging Face checkpoint (names of
    ``transformers``' Llama / Qwen3) with its ``config.json``, for tests and examples."""
    from safetensors.torch import save_file

    config = state.spec.model.to_hf_dict()  # refuses a family it cannot describe, first
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.contiguous() for (kind, name), t in state.tensors.items() if kind == PARAM}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
