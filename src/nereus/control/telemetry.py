"""What the running job reports at each safe boundary (one RL step): the monitor's input.

A plain frozen value, so the engine (real measurements) and the simulator (simulated ones)
build the same thing. Per-op-class times are optional: frameworks that time their kernels and
collectives give them, others give stage latencies only; the calibrator uses whatever is there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nereus.cost.ops import OpClass
from nereus.errors import InputError, is_finite_real, is_integer


@dataclass(frozen=True)
class Telemetry:
    """One step's measurements, taken when the step ended.

    ``pool`` is the GPU ids the job holds *now* (after the step), so a loss that happened during
    the step shows here. ``latency_s`` and ``peak_mem_bytes`` are per model-stage of the plan
    that ran the step; ``op_time_s[stage][op_class]`` are measured seconds of one op class inside
    a stage. ``transition_running`` tells the controller a transition has not finished yet
    (asynchronous execution), so replans wait for it; only a loss of GPUs replans at once. Such
    a step's times and peaks are not learned from: it shared the GPUs with the transition.
    """

    step: int
    response_len_mean: float
    response_len_max: int
    pool: tuple[int, ...]
    latency_s: Mapping[str, float] = field(default_factory=dict)
    peak_mem_bytes: Mapping[str, int] = field(default_factory=dict)
    op_time_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    transition_running: bool = False
    source: str = "measured"

    def __post_init__(self) -> None:
        # bool is an int to Python: step=True would pass as step 1
        if not is_integer(self.step) or self.step < 0:
            raise InputError("telemetry.step", f"must be an integer >= 0, got {self.step!r}")
        if not (is_finite_real(self.response_len_mean) and self.response_len_mean >= 1):
            raise InputError("telemetry.response_len_mean",
                             f"must be a number >= 1, got {self.response_len_mean!r}")
        if not is_finite_real(self.response_len_max):
            raise InputError("telemetry.response_len_max",
                             f"must be a finite number of tokens, got {self.response_len_max!r}")
        if self.response_len_max < self.response_len_mean:
            raise InputError("telemetry.response_len_max",
                             f"{self.response_len_max} is below the mean {self.response_len_mean}")
        try:
            pool = tuple(sorted({_gpu_id(g) for g in self.pool}))
        except (TypeError, ValueError):
            raise InputError("telemetry.pool", f"GPU ids must be integers, got {self.pool!r}"
                             ) from None
        if any(g < 0 for g in pool):
            raise InputError("telemetry.pool", f"negative GPU ids {[g for g in pool if g < 0]}",
                             "ids >= 0")
        object.__setattr__(self, "pool", pool)
        for name in ("latency_s", "peak_mem_bytes", "op_time_s"):
            if not isinstance(getattr(self, name), Mapping):
                raise InputError(f"telemetry.{name}", f"must be a mapping by stage, got "
                                 f"{getattr(self, name)!r}")
        for stage, v in self.latency_s.items():
            if not (is_finite_real(v) and v > 0):
                raise InputError(f"telemetry.latency_s.{stage}",
                                 f"must be a number > 0, got {v!r}")
        for stage, b in self.peak_mem_bytes.items():
            if not (is_finite_real(b) and b >= 0):
                raise InputError(f"telemetry.peak_mem_bytes.{stage}",
                                 f"must be a finite number >= 0, got {b!r}")
        allowed = [c.value for c in OpClass]
        for stage, per in self.op_time_s.items():
            if not isinstance(per, Mapping):
                raise InputError(f"telemetry.op_time_s.{stage}",
                                 f"must be a mapping by op class, got {per!r}")
            for cls, v in per.items():
                if str(getattr(cls, "value", cls)) not in allowed:
                    raise InputError(f"telemetry.op_time_s.{stage}", f"unknown op class {cls!r}",
                                     allowed)
                if not (is_finite_real(v) and v > 0):
                    raise InputError(f"telemetry.op_time_s.{stage}.{cls}",
                                     f"must be a number > 0, got {v!r}")

    def op_times(self, stage: str) -> dict[OpClass, float]:
        """Measured seconds per op class of one stage (empty when the framework gives none)."""
        return {OpClass(getattr(c, "value", c)): float(v)
                for c, v in self.op_time_s.get(stage, {}).items()}


def _gpu_id(g: object) -> int:
    """An integer GPU id (an integral float such as 3.0 too); TypeError for what is no number
    or string, ValueError for any other value."""
    if isinstance(g, bool) or not isinstance(g, (int, float, str)):
        raise TypeError(g)
    v = float(g)
    if not v.is_integer():
        raise ValueError(g)
    return int(v)
