"""A model-stage candidate: layout (tp, pp) of one replica, DP degree, micro-batch, recompute."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property


@dataclass(frozen=True, order=True)
class Layout:
    """TP and PP degrees of one DP replica (one EMU)."""

    tp: int
    pp: int

    # cached in the instance (a plain attribute read after the first): a plan search reads
    # these of the same candidates tens of thousands of times
    @cached_property
    def size(self) -> int:
        return self.tp * self.pp

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """The hash a frozen dataclass derives from its fields (the same value, so sets and
        dicts of them behave as before), taken once per object: candidates and layouts key
        the cost model's and the planner's memos, thousands of lookups per plan search."""
        return hash((self.tp, self.pp))

    def __str__(self) -> str:
        return f"(tp={self.tp}, pp={self.pp})"


@dataclass(frozen=True)
class Candidate:
    """One way to run a model-stage: ``dp`` replicas of ``layout``.

    ``micro_batch`` (b) and ``grad_accum`` (a) are one replica's share of the stage's batch
    (the sequences of one optimizer update for training, of the whole step for inference and
    generation, where ``a`` counts micro-batches run one after another): training splits it
    exactly, ``dp * b * a`` = the batch; a stage without a gradient may split it unevenly,
    and ``b * a`` is then the largest replica's share, ceil(batch / dp).
    """

    layout: Layout
    dp: int
    micro_batch: int
    grad_accum: int
    recompute: bool = False

    @cached_property
    def tp(self) -> int:
        return self.layout.tp

    @cached_property
    def pp(self) -> int:
        return self.layout.pp

    @cached_property
    def gpus(self) -> int:
        return self.dp * self.layout.size

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """As ``Layout._hash``."""
        return hash((self.layout, self.dp, self.micro_batch, self.grad_accum, self.recompute))

    def __str__(self) -> str:
        rc = ", recompute" if self.recompute else ""
        return (f"tp={self.tp} pp={self.pp} dp={self.dp} b={self.micro_batch} "
                f"a={self.grad_accum}{rc}")


class Link(str, Enum):
    INTRA = "intra"  # inside a node: NVLink, Infinity Fabric, loopback
    INTER = "inter"  # across nodes: InfiniBand, Slingshot, Ethernet
