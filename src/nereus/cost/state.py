"""Bytes of the persistent state one EMU position holds (what a transition moves).

At a safe boundary gradient buffers, activations and KV caches hold no state, so an EMU's state is
its parameters θ and, for a trainable model, its optimizer tensors ω (fp32 master copy and Adam
moments). Counters, versions and RNG state are a few bytes and are not counted.
"""

from __future__ import annotations

from nereus.cost.candidate import Layout
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import max_shard_numel, shard_numel
from nereus.spec.workload import Workload


def state_bytes_per_param(workload: Workload, trainable: bool) -> int:
    return workload.param_bytes + (workload.optimizer_state_bytes_per_param() if trainable else 0)


def emu_state_bytes(model: ModelSpec, head: Head, layout: Layout, trainable: bool,
                    workload: Workload, tp_rank: int, pp_rank: int) -> int:
    """State bytes held by position (tp_rank, pp_rank) of one EMU."""
    n = shard_numel(model, head, layout.tp, layout.pp, tp_rank, pp_rank)
    return n * state_bytes_per_param(workload, trainable)


def emu_state_bytes_max(model: ModelSpec, head: Head, layout: Layout, trainable: bool,
                        workload: Workload) -> int:
    """State bytes of the fullest position of one EMU (first or last pipeline block)."""
    return max_shard_numel(model, head, layout.tp, layout.pp) * state_bytes_per_param(
        workload, trainable)
