"""Transition planning: how to move every model-stage's state from one plan to another.

EMUs (one DP replica of one model-stage), the four primitives over them (Split, Merge, Extend,
Destroy), the local DAG per model-stage, the global DAG with resource edges, the list schedule
with per-GPU memory over time, and its cost L_tran (paper §5-§6). Pure Python: no torch, no ray.

Public entry: ``plan_transition(job, current, target, efficiencies=None) -> Schedule``.
"""

from nereus.transition.calibrate import calibrate_transition
from nereus.transition.emu import Emu, Holds, phi, realization_problem, realizes
from nereus.transition.global_dag import TransitionDag, build_dag
from nereus.transition.local_dag import LocalDag, local_dag
from nereus.transition.planner import capacity_bytes, plan_transition, transition_dag
from nereus.transition.primitives import (
    Destroy,
    Extend,
    MemStep,
    Merge,
    Primitive,
    PrimitiveError,
    Split,
    Transfer,
)
from nereus.transition.schedule import Schedule, ScheduledPrimitive
from nereus.transition.validate import validate

__all__ = [
    "Destroy", "Emu", "Extend", "Holds", "LocalDag", "MemStep", "Merge", "Primitive",
    "PrimitiveError", "Schedule", "ScheduledPrimitive", "Split", "Transfer", "TransitionDag",
    "build_dag", "calibrate_transition", "capacity_bytes", "local_dag", "phi",
    "plan_transition", "realization_problem", "realizes", "transition_dag", "validate",
]
