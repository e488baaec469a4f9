"""control layer: telemetry in, triggers, horizons, admission, and the adaptation controller."""

from nereus.control.admission import Option, Verdict, payback_steps, profitable, select
from nereus.control.controller import (
    Action,
    ControlConfig,
    Controller,
    Decision,
    Reasons,
    default_planner,
)
from nereus.control.horizon import Horizons
from nereus.control.monitor import Monitor, Trigger, TriggerKind, memory_trigger, pool_triggers
from nereus.control.restart import (
    RESTART_SOURCES,
    RestartCost,
    RestartParams,
    checkpoint_bytes,
    restart_cost,
    saved_bytes,
)
from nereus.control.telemetry import Telemetry

__all__ = [
    "RESTART_SOURCES", "Action", "ControlConfig", "Controller", "Decision", "Horizons",
    "Monitor", "Option", "Reasons", "RestartCost", "RestartParams", "Telemetry", "Trigger",
    "TriggerKind", "Verdict", "checkpoint_bytes", "default_planner", "memory_trigger",
    "payback_steps", "pool_triggers", "profitable", "restart_cost", "saved_bytes", "select",
]
