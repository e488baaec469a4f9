"""From what the engine measured in one RL step to the ``Telemetry`` the controller consumes.

A step may run a model-stage several times (one training update per PPO mini-batch); its
latency is the sum of those runs, its peak memory the largest, its op-class times the sums.
The engine's ``other`` bucket (time outside every op class) and its ``wait`` bucket (time blocked
on a peer: the pipeline bubble, a late member of a collective) are not op classes and stay out
of ``op_time_s``; they are still inside the stage latency. A profiled run (the CPU memory run) gives
its peak memory only: the profiler inflates its times.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nereus.control.telemetry import Telemetry
from nereus.cost.ops import OpClass
from nereus.engine.generate import GenerationResult
from nereus.engine.measure import StageMeasurement

_CLASSES = {c.value for c in OpClass}


def response_lengths(results: Iterable[GenerationResult]) -> tuple[float, int]:
    """(mean, max) generated tokens per sequence over a step's generations."""
    lengths = [int(n) for r in results for n in r.lengths.tolist()]
    if not lengths:
        return 1.0, 1
    return max(1.0, sum(lengths) / len(lengths)), max(1, max(lengths))


def telemetry(step: int, measurements: Sequence[StageMeasurement], pool: Iterable[int],
              response_len_mean: float, response_len_max: int,
              transition_running: bool = False) -> Telemetry:
    """One step's ``Telemetry`` (source "measured") from its stage measurements."""
    latency: dict[str, float] = {}
    peak: dict[str, int] = {}
    ops: dict[str, dict[str, float]] = {}
    for m in measurements:
        if m.peak_mem_bytes is not None:
            peak[m.stage] = max(peak.get(m.stage, 0), int(m.peak_mem_bytes))
        if m.profiled:
            continue
        latency[m.stage] = latency.get(m.stage, 0.0) + m.wall_s
        per = ops.setdefault(m.stage, {})
        for cls, secs in m.op_s.items():
            if cls in _CLASSES and secs > 0:
                per[cls] = per.get(cls, 0.0) + secs
    return Telemetry(step=step, response_len_mean=response_len_mean,
                     response_len_max=response_len_max, pool=tuple(pool), latency_s=latency,
                     peak_mem_bytes=peak, op_time_s={s: v for s, v in ops.items() if v},
                     transition_running=transition_running, source="measured")
