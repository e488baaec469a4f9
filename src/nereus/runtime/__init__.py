"""Runtime: real sharded state on Ray workers, moved between layouts with torch.distributed.

- ``WorkerPool`` (workers.py): one Ray actor per device; ``pool.submit(d, fn, ...)`` runs
  ``fn(ctx, ...)`` in worker ``d`` with its ``WorkerContext`` (units, groups, byte counter).
- ``open_groups`` / ``close_groups`` / ``Rendezvous`` (comm.py): process groups among any
  subset of workers, no global world; inside a worker, ``ctx.groups[name]`` has the collectives.
- ``ShardedState`` / ``LogicalState`` / ``gather`` (state.py), ``seeded_shard`` /
  ``load_safetensors`` (loading.py): the sharded state and where it comes from.
- ``Executor`` (executor.py): runs a transition ``Schedule``, measured per primitive.
- ``TransitionFailed`` / ``FaultReport`` / ``recover`` (faults.py), ``Checkpointer``
  (checkpoint.py): faults and the checkpoint fallback.
- ``place_plan`` / ``gather_unit`` (placement.py): put a plan's state on workers, read it back.
- ``cli_execute`` (demo.py): what ``nereus transition --execute`` runs.
"""

from typing import Any

from nereus.runtime.checkpoint import Checkpointer
from nereus.runtime.comm import Group, GroupSpec, Rendezvous, close_groups, open_groups
from nereus.runtime.executor import ExecutionReport, Executor, state_specs
from nereus.runtime.faults import FaultReport, Recovery, TransitionFailed, recover
from nereus.runtime.inventory import Inventory, detect_inventory
from nereus.runtime.loading import load_safetensors, seeded_logical, seeded_shard
from nereus.runtime.memory import ByteCounter, CapacityError
from nereus.runtime.placement import gather_unit, place_plan, place_units
from nereus.runtime.primitives import PrimitiveTiming
from nereus.runtime.state import LogicalState, ShardedState, StateMeta, StateSpec, gather
from nereus.runtime.workers import WorkerContext, WorkerPool


def cli_execute(*args: Any, **kwargs: Any) -> int:
    """``nereus transition --execute``: ``nereus.runtime.demo.cli_execute(job, current, target,
    schedule=None, *, seed=0, kind="cpu", address=None, as_json=False)`` runs the schedule on
    local workers on a seeded model, prints measured vs estimated per primitive, and returns
    the exit code (0 when the state survived bitwise)."""
    from nereus.runtime.demo import cli_execute as run

    return run(*args, **kwargs)


__all__ = [
    "ByteCounter", "CapacityError", "Checkpointer", "ExecutionReport", "Executor", "FaultReport",
    "Group", "GroupSpec", "Inventory", "LogicalState", "Recovery", "Rendezvous", "ShardedState",
    "StateMeta", "StateSpec", "TransitionFailed", "WorkerContext", "WorkerPool",
    "PrimitiveTiming", "cli_execute", "close_groups", "detect_inventory", "gather",
    "gather_unit", "load_safetensors", "open_groups", "place_plan", "place_units", "recover",
    "seeded_logical", "seeded_shard", "state_specs",
]
