"""Token batches as the engine receives them, and their split into micro-batches."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from nereus.errors import InputError


@dataclass(frozen=True)
class Batch:
    """``n`` sequences of length ``s``, left- or right-padded.

    ``attention_mask`` [n, s] is 1 on real tokens (None: all real); the id at a padded position
    may be anything, a pad id of -1 included: the model never reads it (``tokens``). ``extra``
    holds per-sequence tensors [n, ...] the caller's loss needs (advantages, old log-probs,
    response masks); they are split with the rows. ``index`` [n] numbers the sequences in the
    global batch, so that what is drawn per sequence (sampling noise) does not depend on which
    replica holds it.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)
    index: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise InputError("batch.input_ids",
                             f"must be [n, s], got {tuple(self.input_ids.shape)}")
        n = self.input_ids.shape[0]
        if self.attention_mask is not None and self.attention_mask.shape != self.input_ids.shape:
            raise InputError("batch.attention_mask",
                             f"shape {tuple(self.attention_mask.shape)} differs from input_ids "
                             f"{tuple(self.input_ids.shape)}")
        for k, v in self.extra.items():
            if v.shape[0] != n:
                raise InputError(f"batch.extra.{k}", f"has {v.shape[0]} rows for {n} sequences")
        if self.index is not None and self.index.shape != (n,):
            raise InputError("batch.index", f"must be [{n}], got {tuple(self.index.shape)}")

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def rows(self, start: int, stop: int) -> Batch:
        return Batch(self.input_ids[start:stop],
                     None if self.attention_mask is None else self.attention_mask[start:stop],
                     {k: v[start:stop] for k, v in self.extra.items()},
                     None if self.index is None else self.index[start:stop])

    def tokens(self) -> torch.Tensor:
        """The ids the model reads [n, s]: ``input_ids`` with padded positions set to 0, so a pad
        id is never read as a token (embedded, or picked as a target) and every layout computes
        the same thing whatever it is. No real position attends to a padded key, so what a
        padded position holds changes nothing a real one computes."""
        if self.attention_mask is None:
            return self.input_ids
        return self.input_ids.masked_fill(~self.attention_mask.bool(), 0)

    def check_tokens(self, vocab_size: int, field: str = "batch") -> None:
        """Every real position's id in [0, ``vocab_size``), so every target too (a target is
        the next position's id); InputError naming ``<field>.input_ids`` otherwise. At tp = 1
        an id out of range fails inside the embedding, at tp > 1 no rank owns it and it
        would embed as zeros: checked here so that every layout refuses it alike."""
        ids = self.input_ids
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InputError(f"{field}.input_ids", f"must be integer token ids, got {ids.dtype}")
        bad = (ids < 0) | (ids >= vocab_size)
        if self.attention_mask is not None:
            bad &= self.attention_mask.bool()
        if bool(bad.any()):
            r, c = (int(x) for x in bad.nonzero()[0])
            raise InputError(f"{field}.input_ids",
                             f"token id {int(ids[r, c])} (sequence {r}, position {c}) is outside "
                             f"the vocabulary of {vocab_size}",
                             f"0..{vocab_size - 1} at real positions (attention_mask 1)")

    def split(self, micro_batch: int, short_last: bool = False) -> list[Batch]:
        """Consecutive micro-batches of ``micro_batch`` sequences. The last one must be full
        unless ``short_last``: a stage without a gradient on an uneven DP split, whose smaller
        replicas run one sequence fewer than the micro-batches the largest share is cut into
        (``replica_rows``); training's accumulation must see equal micro-batches."""
        if self.size == 0:
            raise InputError("batch", "has no sequences", "at least one sequence")
        if micro_batch < 1 or (self.size % micro_batch and not short_last):
            raise InputError("micro_batch", f"{micro_batch} does not divide the {self.size} "
                             "sequences of this replica's batch")
        return [self.rows(i, i + micro_batch) for i in range(0, self.size, micro_batch)]

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.input_ids.to(device),
                     None if self.attention_mask is None else self.attention_mask.to(device),
                     {k: v.to(device) for k, v in self.extra.items()},
                     None if self.index is None else self.index.to(device))

    def positions(self) -> torch.Tensor:
        """Position ids: 0 at each sequence's first real token (left padding shifts them)."""
        if self.attention_mask is None:
            s = self.seq_len
            return torch.arange(s, device=self.input_ids.device).expand(self.size, s)
        return (self.attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def num_tokens(self) -> int:
        if self.attention_mask is None:
            return self.input_ids.numel()
        return int(self.attention_mask.sum())


def replica_rows(n: int, dp: int, dp_rank: int, uneven: bool = False) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a global batch of ``n`` sequences that replica ``dp_rank`` takes:
    contiguous blocks in rank order.

    Training (``uneven`` False) needs equal blocks: its gradient accumulation must cover the
    batch exactly, dp x b x a = n, whatever dp is. A stage that takes no gradient (generation,
    forward passes; ``uneven``) may split ``n`` over any dp up to ``n``: the first ``n % dp``
    replicas take one row more, so the largest share is ceil(n / dp), the share the planner
    prices such a stage by."""
    if dp < 1 or not 0 <= dp_rank < dp:
        raise InputError("dp_rank", f"{dp_rank} is not a replica of dp={dp}",
                         f"0 to {dp - 1}" if dp >= 1 else "dp >= 1")
    if not uneven:
        if n % dp:
            raise InputError("batch", f"{n} sequences do not split over dp={dp} replicas "
                             "in equal shares, as training needs", f"a multiple of {dp}")
        per = n // dp
        return dp_rank * per, (dp_rank + 1) * per
    if dp > n:
        raise InputError("batch", f"{n} sequences leave some of dp={dp} replicas without one",
                         f"at least {dp} sequences")
    per, extra = divmod(n, dp)
    start = dp_rank * per + min(dp_rank, extra)
    return start, start + per + (dp_rank < extra)
