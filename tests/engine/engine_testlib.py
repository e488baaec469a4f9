"""Helpers for the engine tests: a seeded logical state, its shards, and their reassembly.

These stand in for the runtime's ``ShardedState`` where a test needs shards in the driver
process; they follow ``nereus.spec.sharding.shard_plan`` and nothing else.
"""

from __future__ import annotations

import torch

from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import Shard, logical_params, shard_plan


def logical_state(spec: ModelSpec, head: Head, seed: int, dtype: torch.dtype = torch.float32
                  ) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for p in logical_params(spec, head):
        if len(p.shape) == 1:
            t = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        else:
            t = torch.randn(p.shape, generator=g) * (0.5 / p.shape[-1] ** 0.5)
        out[p.name] = t.to(dtype)
    return out


def slice_shard(full: torch.Tensor, s: Shard) -> torch.Tensor:
    if s.split_dim is None:
        return full.clone()
    n = s.valid_len
    part = full.narrow(s.split_dim, s.start, n) if n else full.narrow(s.split_dim, 0, 0)
    if n == s.stop - s.start:
        return part.clone()
    shape = list(full.shape)
    shape[s.split_dim] = s.stop - s.start
    out = torch.zeros(shape, dtype=full.dtype)
    out.narrow(s.split_dim, 0, n).copy_(part)
    return out


def shards_for(full: dict[str, torch.Tensor], spec: ModelSpec, head: Head, tp: int, pp: int,
               tp_rank: int, pp_rank: int) -> dict[str, torch.Tensor]:
    return {s.name: slice_shard(full[s.logical], s)
            for s in shard_plan(spec, head, tp, pp, tp_rank, pp_rank)}


def gather_logical(parts: dict[tuple[int, int], dict[str, torch.Tensor]], spec: ModelSpec,
                   head: Head, tp: int, pp: int) -> dict[str, torch.Tensor]:
    """Reassemble the logical tensors from every position's shards (first holder wins)."""
    out: dict[str, torch.Tensor] = {}
    for p in logical_params(spec, head):
        out[p.name] = torch.zeros(p.shape)
    for (t, r), shards in parts.items():
        for s in shard_plan(spec, head, tp, pp, t, r):
            if s.name != s.logical:      # tied copy on the last block: the embedding is logical
                continue
            src = shards[s.name].float()
            if s.split_dim is None:
                out[s.logical] = src.clone()
            elif s.valid_len:
                out[s.logical].narrow(s.split_dim, s.start, s.valid_len).copy_(
                    src.narrow(s.split_dim, 0, s.valid_len))
    return out


# ---------------------------------------------------------------- runtime helpers
def layout_emus(stage: str, tp: int, pp: int, dp: int, tag: str, trainable: bool,
                first_gpu: int = 0) -> list:
    """``dp`` EMUs of (tp, pp) on consecutive GPU ids, ids ``<stage>/<tag><d>``."""
    from nereus.cost.candidate import Layout
    from nereus.transition.emu import Emu, Holds

    holds = Holds.THETA_OMEGA if trainable else Holds.THETA
    size = tp * pp
    return [Emu(f"{stage}/{tag}{d}", stage, stage.split("_")[0], Layout(tp, pp),
                tuple(range(first_gpu + d * size, first_gpu + (d + 1) * size)), holds)
            for d in range(dp)]


def place_seeded_units(pool, emus, sspec, seed: int, warm: bool = True) -> None:
    from nereus.runtime.movement import place_seeded

    pool.run({dev: (place_seeded, (e.id, sspec, (e.layout.tp, e.layout.pp), e.position(i),
                                   seed, warm))
              for e in emus for i, dev in enumerate(e.gpus)})


def drop_units(pool, emus) -> None:
    from nereus.runtime.movement import destroy_member

    pool.run({dev: (destroy_member, (e.id,)) for e in emus for dev in e.gpus})


def gather_unit(pool, emu):
    from nereus.runtime.movement import export_unit
    from nereus.runtime.state import gather

    parts = pool.run({dev: (export_unit, (emu.id,)) for dev in emu.gpus})
    return gather(list(parts.values()))
