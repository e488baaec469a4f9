"""Seeded sampling that does not depend on the layout.

The noise of a draw is a pure function of (seed, global sequence index, decode step), hashed to
one uniform number, and the token is read off the full-vocabulary distribution by inverse CDF.
Whatever TP, PP or DP layout computed the logits, and whichever replica holds the sequence, the
same seed gives the same tokens (up to logits that differ in their last bits landing exactly on
a CDF boundary).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

from nereus.errors import InputError, is_finite_real, is_integer


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; ``top_p`` keeps the smallest set of most likely tokens whose
    mass reaches p; generation of a sequence ends after a stop token (kept) or
    ``max_new_tokens``; finished rows are filled with ``pad_token``."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    seed: int = 0
    pad_token: int = 0

    def __post_init__(self) -> None:
        if not is_integer(self.max_new_tokens) or self.max_new_tokens < 1:
            raise InputError("sampling.max_new_tokens",
                             f"must be an integer >= 1, got {self.max_new_tokens!r}")
        if not is_finite_real(self.temperature) or self.temperature < 0:
            raise InputError("sampling.temperature", f"must be finite and >= 0 (0: greedy), got "
                             f"{self.temperature!r}")
        if not is_finite_real(self.top_p) or not 0 < self.top_p <= 1:
            raise InputError("sampling.top_p", f"must be in (0, 1], got {self.top_p!r}")
        # the noise hashes the seed as a signed 64-bit integer (``uniform``)
        if not is_integer(self.seed) or not -2**63 <= self.seed < 2**63:
            raise InputError("sampling.seed", f"must be an integer that fits in 64 bits, got "
                             f"{self.seed!r}", f"{-2**63}..{2**63 - 1}")
        if not is_integer(self.pad_token):   # it fills a tensor of token ids
            raise InputError("sampling.pad_token", f"must be an integer, got {self.pad_token!r}")
        if not all(is_integer(t) and t >= 0 for t in self.stop_tokens):
            raise InputError("sampling.stop_tokens", f"must be token ids (integers >= 0), got "
                             f"{self.stop_tokens!r}")


def uniform(seed: int, index: int, step: int) -> float:
    """A uniform number in [0, 1) determined by (seed, index, step) alone."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, index, step), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0 ** -53


def sample(logits: torch.Tensor, index: torch.Tensor, step: int, sp: SamplingParams
           ) -> torch.Tensor:
    """Next tokens [n] from full-vocabulary logits [n, V] of the sequences ``index`` [n]."""
    if sp.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.double() / sp.temperature, dim=-1)
    if sp.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < sp.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
    cdf = probs.cumsum(-1)
    u = torch.tensor([uniform(sp.seed, int(i), step) for i in index.tolist()],
                     dtype=torch.float64, device=logits.device)
    target = (u * cdf[:, -1])[:, None]
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tok.clamp(max=logits.shape[-1] - 1)
