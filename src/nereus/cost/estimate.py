"""An estimate of one model-stage candidate: latency by term and op, peak memory by term.

Latency is linear in the inverse efficiencies: ``latency = sum(op.ideal_s / eff[op.cls])``, so an
estimate can say which term costs what, and the calibrator can fit efficiencies to measured
times by least squares.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from nereus.cost.candidate import Candidate
from nereus.cost.efficiency import Efficiencies
from nereus.cost.ops import Op, OpClass

# memory feasibility: predicted peak within 90 % of capacity (project design rule; an
# assumption, not measured)
HEADROOM = 0.90
# The term of a pipeline's idle slots ((pp - 1) micro-batch slots per step): priced as work,
# measured as waiting
BUBBLE = "bubble"
GiB = 1024**3


@dataclass(frozen=True)
class Estimate:
    """Predicted latency (seconds per RL step) and peak memory (bytes per GPU) of a candidate."""

    stage: str
    candidate: Candidate
    ops: tuple[Op, ...]
    efficiencies: Efficiencies
    memory: Mapping[str, int]          # bytes per GPU by term, on the fullest GPU
    resident_bytes: int                # what stays on the GPU while the stage is idle in its phase
    capacity_bytes: int
    notes: tuple[str, ...] = ()
    source: str = "estimated"
    extra_s: Mapping[str, float] = field(default_factory=dict)  # terms added after pricing

    @property
    def terms(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for op in self.ops:
            out[op.term] = out.get(op.term, 0.0) + op.ideal_s / self.efficiencies[op.cls]
        for k, v in self.extra_s.items():
            out[k] = out.get(k, 0.0) + v
        return out

    @cached_property
    def latency_s(self) -> float:
        """Computed once: planners and controllers read it many times per estimate."""
        return sum(self.terms.values())

    @property
    def peak_mem_bytes(self) -> int:
        return int(sum(self.memory.values()))

    @property
    def transient_bytes(self) -> int:
        """Memory the stage needs only while it runs (activations, KV cache, workspace...)."""
        return self.peak_mem_bytes - self.resident_bytes

    @property
    def fits(self) -> bool:
        return self.peak_mem_bytes <= HEADROOM * self.capacity_bytes

    def ideal_by_class(self) -> dict[OpClass, float]:
        """Seconds at peak rate per op class: the regressors of calibration."""
        out: dict[OpClass, float] = {}
        for op in self.ops:
            out[op.cls] = out.get(op.cls, 0.0) + op.ideal_s
        return out

    def ideal_by_timed_class(self) -> dict[OpClass, dict[OpClass, float]]:
        """For each class a framework times (gemm, allreduce.intra, ...), the ideal seconds per
        priced class inside it (an all-reduce's bandwidth and latency parts). The pipeline's
        bubble is left out: its rows price a block's idle slots as the work of the slowest
        one, and a block files that time as waiting, under no class (``engine.measure``)."""
        out: dict[OpClass, dict[OpClass, float]] = {}
        for op in self.ops:
            if op.term == BUBBLE:
                continue
            part = out.setdefault(op.timed_class, {})
            part[op.cls] = part.get(op.cls, 0.0) + op.ideal_s
        return out

    def time_by_class(self) -> dict[OpClass, float]:
        return {c: v / self.efficiencies[c] for c, v in self.ideal_by_class().items()}

    def explain(self) -> str:
        """Which term costs what: latency by term and op, memory by term."""
        lat = self.latency_s
        lines = [(f"{self.stage} [{self.candidate}]: {lat:.3f} s per step ({self.source}), "
                  f"peak {self.peak_mem_bytes / GiB:.2f} GiB of {self.capacity_bytes / GiB:.2f} "
                  f"GiB per GPU ({self.source})")]
        terms = self.terms
        # columns as wide as this estimate's longest op name and op class
        name_w = max([34, *(len(op.name) for op in self.ops)])
        cls_w = max([16, *(len(op.cls.value) for op in self.ops)])
        for term, secs in sorted(terms.items(), key=lambda kv: -kv[1]):
            share = secs / lat if lat else 0.0
            lines.append(f"  {term:<12} {secs:10.4f} s  {share:6.1%}")
            for op in self.ops:
                if op.term != term:
                    continue
                eff = self.efficiencies[op.cls]
                lines.append(f"      {op.name:<{name_w}} {op.cls.value:<{cls_w}} "
                             f"x{op.count:<10.4g} "
                             f"{op.ideal_s / eff:9.4f} s "
                             f"(ideal {op.ideal_s:.4f} s / eff {eff:.2f})")
        lines.append("  memory per GPU:")
        for term, b in sorted(self.memory.items(), key=lambda kv: -kv[1]):
            if b:
                lines.append(f"      {term:<{name_w}} {b / GiB:9.3f} GiB")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)
