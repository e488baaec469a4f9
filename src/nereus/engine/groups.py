"""Where one worker sits in a model-stage and the process groups it computes with.

The runtime makes the groups (one per TP unit, per PP unit, per DP set) and replaces them as
layouts change; the engine only calls collectives on the group objects it is handed. Group-local
ranks: a TP group is ordered by tp_rank, a PP group by pp_rank, a DP group by replica index, so
the engine's rank in each group is its coordinate in that dimension.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nereus.errors import InputError


@dataclass(frozen=True)
class Position:
    """(tp_rank, pp_rank) inside a replica of layout (tp, pp), and the replica's DP index."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    tp_rank: int = 0
    pp_rank: int = 0
    dp_rank: int = 0

    def __post_init__(self) -> None:
        for size, rank, name in ((self.tp, self.tp_rank, "tp"), (self.pp, self.pp_rank, "pp"),
                                 (self.dp, self.dp_rank, "dp")):
            if size < 1 or not 0 <= rank < size:
                raise InputError(f"position.{name}_rank", f"{rank} outside {name}={size}",
                                 f"0..{size - 1}")

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def index_in_replica(self) -> int:
        """The GPU index inside the replica (``pp_rank * tp + tp_rank``, TP innermost)."""
        return self.pp_rank * self.tp + self.tp_rank


@dataclass(frozen=True)
class ParallelGroups:
    """Process groups of one worker (``torch.distributed.ProcessGroup`` objects, or None when
    that dimension has size 1), and whether each group's members share a node (its link)."""

    tp: Any = None
    pp: Any = None
    dp: Any = None
    tp_intra: bool = True
    pp_intra: bool = True
    dp_intra: bool = True

    def check(self, pos: Position) -> None:
        """The group sizes and local ranks agree with ``pos``."""
        for name, size, rank in (("tp", pos.tp, pos.tp_rank), ("pp", pos.pp, pos.pp_rank),
                                 ("dp", pos.dp, pos.dp_rank)):
            pg = getattr(self, name)
            if size == 1:
                continue
            if pg is None:
                raise InputError(f"groups.{name}", f"missing for {name}={size}")
            if pg.size() != size or pg.rank() != rank:
                raise InputError(f"groups.{name}",
                                 f"group has rank {pg.rank()} of {pg.size()}, position says "
                                 f"{rank} of {size}")
