"""Triggers (§4.1): when the controller should replan.

Two kinds, because the signals behave differently. A change of the GPU pool or a predicted
memory violation triggers a replan outright (urgent when GPUs the plan uses are gone or the
plan no longer fits). A drifting signal x (response length, an op class's achieved efficiency)
triggers when it differs from its reference -- its value at the last replan -- by more than
δ_x. References reset after every replan, even a rejected one, so a persistent deviation does
not retrigger at every step while steady growth still produces repeated crossings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from nereus.spec.cluster import gpu_ranges
from nereus.spec.device import gib


class TriggerKind(str, Enum):
    POOL_LOSS = "pool_loss"   # GPUs left the pool
    POOL_GAIN = "pool_gain"   # GPUs joined the pool
    MEMORY = "memory"         # the current plan is predicted not to fit
    DRIFT = "drift"           # a drifting signal crossed its threshold
    ALWAYS = "always"         # replan at every boundary (the replan-without-admission baseline)
    ONWARD = "onward"         # an urgent move stopped short of S*: replan at the next boundary


@dataclass(frozen=True)
class Trigger:
    """Why a replan starts. ``signal`` names what changed (``pool``, ``memory``,
    ``response_len``, ``eff.<op class>``); drift triggers carry value, reference and δ."""

    kind: TriggerKind
    signal: str
    urgent: bool
    value: float | None = None
    reference: float | None = None
    threshold: float | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.kind is TriggerKind.DRIFT and self.reference:
            change = relative_change(self.value or 0.0, self.reference)
            delta = self.threshold or 0.0
            return (f"{self.signal} {self.value:.4g} vs ref {self.reference:.4g} "
                    f"({_past(change, delta)}, past δ={delta * 100:.6g}%)")
        return f"{self.kind.value}{': ' + self.detail if self.detail else ''}"


def _past(change: float, delta: float) -> str:
    """``change`` as a percentage with one decimal, or as many more (up to six) as it takes
    to read as past δ: +30.05 % against δ = 30 % prints +30.05%, not +30.0%."""
    for digits in range(1, 7):
        if round(abs(change) * 100, digits) > delta * 100:
            break
    return f"{change:+.{digits}%}"


def relative_change(value: float, reference: float) -> float:
    return (value - reference) / reference if reference else float("inf")


def pool_triggers(old_pool: Iterable[int], new_pool: Iterable[int],
                  plan_gpus: Iterable[int]) -> list[Trigger]:
    """Pool changes; a loss is urgent when the plan uses a lost GPU."""
    old, new, used = set(old_pool), set(new_pool), set(plan_gpus)
    out: list[Trigger] = []
    lost, gained = sorted(old - new), sorted(new - old)
    if lost:
        hit = sorted(set(lost) & used)
        used_part = (", none used by the plan" if not hit
                     else f", the plan used {'it' if len(hit) == 1 else 'all of them'}"
                     if hit == lost else f", the plan used {_gpus(hit)}")
        detail = f"lost {_gpus(lost)}{used_part}"
        out.append(Trigger(TriggerKind.POOL_LOSS, "pool", bool(hit), float(len(new)),
                           float(len(old)), None, detail))
    if gained:
        out.append(Trigger(TriggerKind.POOL_GAIN, "pool", False, float(len(new)),
                           float(len(old)), None, f"gained {_gpus(gained)}"))
    return out


def memory_trigger(peaks: Mapping[str, int], limit_bytes: float) -> Trigger | None:
    """Urgent when any stage's predicted peak exceeds the per-GPU limit."""
    over = {s: p for s, p in peaks.items() if p > limit_bytes}
    if not over:
        return None
    worst = max(over, key=over.__getitem__)
    return Trigger(TriggerKind.MEMORY, "memory", True, float(over[worst]), float(limit_bytes),
                   None, f"{worst} predicted {gib(over[worst])} > "
                   f"{gib(limit_bytes)} allowed")


@dataclass(frozen=True)
class Monitor:
    """Reference values of the drifting signals and their thresholds δ_x.

    A signal seen for the first time (or after :meth:`reset`) sets its reference and does not
    trigger. Signals with no δ are ignored.
    """

    deltas: Mapping[str, float]
    references: Mapping[str, float] = field(default_factory=dict)

    def delta_of(self, signal: str) -> float | None:
        if signal in self.deltas:
            return self.deltas[signal]
        prefix = signal.split(".", 1)[0] + ".*"
        return self.deltas.get(prefix)

    def check(self, values: Mapping[str, float]) -> tuple[Monitor, list[Trigger]]:
        """Triggers for values beyond δ of their reference; new signals get a reference."""
        refs = dict(self.references)
        out: list[Trigger] = []
        for name, v in values.items():
            delta = self.delta_of(name)
            if delta is None:
                continue
            ref = refs.get(name)
            if ref is None:
                refs[name] = v
                continue
            if abs(relative_change(v, ref)) > delta:
                out.append(Trigger(TriggerKind.DRIFT, name, False, float(v), float(ref), delta))
        return replace(self, references=refs), out

    def reset(self, values: Mapping[str, float]) -> Monitor:
        """After a replan (admitted or not): every reference becomes the current value."""
        refs = dict(self.references)
        for name, v in values.items():
            if self.delta_of(name) is not None:
                refs[name] = float(v)
        return replace(self, references=refs)


def _gpus(ids: list[int]) -> str:
    """"GPU 7" for one (a bare "GPUs 7" read as seven GPUs); else runs, as the rest of the
    project writes GPU sets, and their count: "GPUs 0-2,11-15 (8)" (a first..last span would
    name GPUs still in the pool; the count saves adding up the runs)."""
    return f"GPU {ids[0]}" if len(ids) == 1 else f"GPUs {gpu_ranges(ids)} ({len(ids)})"
