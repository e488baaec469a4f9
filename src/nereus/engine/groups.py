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

    @property
    def workers(self) -> int:
        """Workers of the model-stage: tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def stage_rank(self) -> int:
        """The rank in the model-stage's ``stage`` group: replica by replica, each in
        ``index_in_replica`` order (the runner's order of placements)."""
        return self.dp_rank * self.tp * self.pp + self.index_in_replica


@dataclass(frozen=True)
class ParallelGroups:
    """Process groups of one worker (``torch.distributed.ProcessGroup`` objects, or None when
    that dimension has size 1), and whether each group's members share a node (its link).

    ``pp_grad``: the same PP members on a second communicator, which carries the gradients
    (to the previous block) while ``pp`` carries the activations (to the next). NCCL runs the
    point-to-point operations of one pair of ranks on one communicator in order, on one
    stream, and a send waits for its receive; in 1F1B's steady state a block sends an
    activation before it receives a gradient while its neighbour sends that gradient before it
    receives the activation, so on one communicator the two sends wait on each other once a
    message exceeds NCCL's buffer. One communicator per direction keeps each in the same order
    at both ends. Required on NCCL for pp > 1; optional on gloo, whose sends progress alone
    (None: gradients go over ``pp``).

    ``stage``: every worker of the model-stage, ranked by (dp_rank, index in the replica): a
    training step's last collective runs on it (``nereus.engine.train``), so that a failure
    anywhere before the update stops every worker before theirs. Required to train on more
    than one worker."""

    tp: Any = None
    pp: Any = None
    dp: Any = None
    tp_intra: bool = True
    pp_intra: bool = True
    dp_intra: bool = True
    pp_grad: Any = None
    stage: Any = None
    stage_intra: bool = True

    def check(self, pos: Position) -> None:
        """The group sizes and local ranks agree with ``pos``."""
        for name, size, rank in (("tp", pos.tp, pos.tp_rank), ("pp", pos.pp, pos.pp_rank),
                                 ("pp_grad", pos.pp, pos.pp_rank), ("dp", pos.dp, pos.dp_rank)):
            pg = getattr(self, name)
            if size == 1 or (name == "pp_grad" and pg is None and not _is_nccl(self.pp)):
                continue
            if pg is None:
                raise InputError(f"groups.{name}", f"missing for {name.split('_')[0]}={size}"
                                 + (" on NCCL" if name == "pp_grad" else ""))
            if pg.size() != size or pg.rank() != rank:
                raise InputError(f"groups.{name}",
                                 f"group has rank {pg.rank()} of {pg.size()}, position says "
                                 f"{rank} of {size}")
        if self.stage is not None and (self.stage.size() != pos.workers
                                       or self.stage.rank() != pos.stage_rank):
            raise InputError("groups.stage", f"group has rank {self.stage.rank()} of "
                             f"{self.stage.size()}, position says {pos.stage_rank} of "
                             f"{pos.workers}")


def _is_nccl(pg: Any) -> bool:
    name = getattr(pg, "name", None)
    return callable(name) and str(name()).lower() == "nccl"
