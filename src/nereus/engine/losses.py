"""Two plain losses in the engine's convention (``nereus.engine.train``): each returns the
micro-batch's share of the update's loss, with per-token weights the caller normalised for the
global batch. The RL layer brings its own (PPO's clipped objective); these serve supervised
steps, tests and benchmarks, and are module-level so workers can unpickle them."""

from __future__ import annotations

import torch

from nereus.engine.batch import Batch
from nereus.engine.pipeline import Output


def weighted_nll(out: Output, mb: Batch) -> torch.Tensor:
    """-sum(weight * log p(next token)); ``mb.extra["weight"]`` is [b, s - 1]."""
    if out.logprobs is None:
        raise ValueError("weighted_nll needs an LM head")
    return -(out.logprobs * mb.extra["weight"]).sum()


def weighted_mse(out: Output, mb: Batch) -> torch.Tensor:
    """sum(weight * (value - target)^2); ``target`` and ``weight`` are [b, s]."""
    if out.values is None:
        raise ValueError("weighted_mse needs a scalar head")
    return ((out.values - mb.extra["target"]) ** 2 * mb.extra["weight"]).sum()
