"""Online calibration: learn each op class's efficiency from measured times.

A stage's predicted time is ``sum_c ideal_c / eff_c``: linear in the inverse efficiencies
``x_c = 1 / eff_c``. Each measurement adds one row (ideal seconds per class -> measured seconds);
the calibrator solves a least-squares problem in relative error, pulled toward the prior
by a small ridge term so that classes a measurement cannot separate stay where they were, and
weighs old rows down exponentially so that drift (congestion, throttling) is followed.
Measurements per op class (a framework that times its kernels and collectives) are rows with a
single regressor, so both granularities share one solver.

Memory is calibrated per stage kind: the ratio of measured to predicted peak, averaged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from nereus.cost.efficiency import (
    MIN_EFFICIENCY,
    Efficiencies,
    default_efficiency,
    peak_bound,
)
from nereus.cost.estimate import Estimate
from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.files import read_json, validate
from nereus.spec.workflow import StageKind

PROFILE_VERSION = 1
# measured / estimated peak memory a calibrator keeps and a profile may hold: beyond a factor
# of 1000 either way the estimate is not being corrected but replaced (an assumption)
MEMORY_SCALE_BOUNDS = (1e-3, 1e3)
# The ridge never fades below (σ_meas / σ_prior)^2: a prior of ±50 % on each efficiency against
# stage times measured to ±2 % (assumption; the paper reports max-min step spreads under 2 %).
# Without it, classes that move together with others (decode time and the decode all-reduces'
# latency both scale with decode steps; attention with GEMMs) were fitted from noise and swung
# by tens of percent from step to step, which the controller read as efficiency drift.
RIDGE_FLOOR = (0.02 / 0.5) ** 2


@dataclass
class _Row:
    ideal: dict[OpClass, float]
    measured_s: float
    step: int
    # ``ideal`` over the classes of the last fit that read it, and which of them it lists
    dense: tuple[tuple[OpClass, ...], np.ndarray, np.ndarray] | None = \
        field(default=None, compare=False, repr=False)

    def over(self, classes: tuple[OpClass, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(ideal seconds per class of ``classes``, 0 where absent; whether it lists each):
        a fit reads every row at every step, and the classes rarely change."""
        if self.dense is None or self.dense[0] != classes:
            self.dense = (classes, np.array([self.ideal.get(c, 0.0) for c in classes]),
                          np.array([c in self.ideal for c in classes], dtype=bool))
        return self.dense[1], self.dense[2]


@dataclass(frozen=True)
class CalibratorState:
    """A :class:`Calibrator`'s learned state at one moment (``snapshot``)."""

    rows: tuple[_Row, ...]
    memory: Mapping[StageKind, tuple[float, ...]]
    current: Efficiencies | None
    spread: Mapping[OpClass, float]
    step: int


@dataclass
class Calibrator:
    """Learns efficiencies per op class and a memory scale per stage kind from measurements.

    Rows carry the step they were measured in; at each :meth:`next_step` the weight of every
    older row is multiplied by ``forgetting`` (1.0 keeps all rows equally). ``ridge`` is the
    pull toward the prior, relative to one measurement; it fades as rows about a class
    accumulate, down to ``ridge_floor``.
    """

    prior: Efficiencies = field(default_factory=Efficiencies)
    forgetting: float = 0.9
    ridge: float = 0.02
    ridge_floor: float = RIDGE_FLOOR
    max_rows: int = 256
    _rows: list[_Row] = field(default_factory=list)
    _memory: dict[StageKind, list[float]] = field(default_factory=dict)
    _current: Efficiencies | None = None
    _spread: dict[OpClass, float] = field(default_factory=dict)
    _step: int = 0

    def next_step(self) -> None:
        """Older measurements count less from now on (drift: congestion, throttling)."""
        self._step += 1
        self._current = None

    # ---- observations ----
    def observe_stage(self, estimate: Estimate, measured_s: float) -> None:
        """One model-stage's measured latency for the ops its estimate lists."""
        self.observe_ideal(estimate.ideal_by_class(), measured_s)

    def observe_ideal(self, ideal: Mapping[OpClass, float], measured_s: float) -> None:
        """A measured time of work whose ideal seconds (at peak) per op class are ``ideal``."""
        if not measured_s > 0:
            raise InputError("measured_s", f"must be > 0, got {measured_s}")
        self._add(_Row(dict(ideal), float(measured_s), self._step))

    def observe_op(self, cls: OpClass, ideal_s: float, measured_s: float) -> None:
        """A measured time of work whose ideal time (at peak) is ``ideal_s``, one op class."""
        for name, v in (("ideal_s", ideal_s), ("measured_s", measured_s)):
            if not v > 0:
                raise InputError(name, f"must be > 0, got {v}")
        self._add(_Row({cls: float(ideal_s)}, float(measured_s), self._step))

    def observe_timed(self, estimate: Estimate, measured: Mapping[OpClass, float]) -> int:
        """Measured seconds per timed op class of one stage (framework instrumentation).

        Each class the estimate prices and the framework timed adds one row; an all-reduce's
        row holds its bandwidth and latency parts, so both are learned. Returns the rows added.
        """
        parts = estimate.ideal_by_timed_class()
        added = 0
        for cls, secs in measured.items():
            ideal = parts.get(cls)
            if ideal and secs > 0 and sum(ideal.values()) > 0:
                self._add(_Row(dict(ideal), float(secs), self._step))
                added += 1
        return added

    def observe_memory(self, kind: StageKind, estimated_bytes: int, measured_bytes: int) -> None:
        if estimated_bytes > 0 and measured_bytes > 0:
            self._memory.setdefault(kind, []).append(measured_bytes / estimated_bytes)

    def _add(self, row: _Row) -> None:
        self._rows.append(row)
        if len(self._rows) > self.max_rows:
            self._rows.pop(0)
        self._current = None

    @property
    def samples(self) -> int:
        return len(self._rows)

    def snapshot(self) -> CalibratorState:
        """What the calibrator has learned so far, for :meth:`restore`: a caller that learns
        from input it may still reject (the controller at a boundary) takes one first."""
        return CalibratorState(tuple(self._rows), {k: tuple(v) for k, v in self._memory.items()},
                               self._current, dict(self._spread), self._step)

    def restore(self, state: CalibratorState) -> None:
        """Forget everything learned since ``state`` was taken (in place: who holds this
        calibrator keeps it)."""
        self._rows = list(state.rows)
        self._memory = {k: list(v) for k, v in state.memory.items()}
        self._current = state.current
        self._spread = dict(state.spread)
        self._step = state.step

    # ---- the fit ----
    def efficiencies(self) -> Efficiencies:
        if self._current is None:
            self._current = self._fit()
        return self._current

    def relative_error(self) -> dict[OpClass, float]:
        """Standard error of each fitted efficiency relative to its value (estimated from the
        fit's weighted residuals and its normal matrix, ridge included): small for a class the
        measurements pin down, large for one that only moves together with others (decode time
        and the decode all-reduces' latency both scale with decode steps), whose estimate then
        wanders with the noise. Classes never measured are absent."""
        self.efficiencies()
        return dict(self._spread)

    def memory_samples(self) -> dict[StageKind, int]:
        """How many memory observations of each kind of stage the scale averages."""
        return {k: len(v) for k, v in self._memory.items() if v}

    def memory_scale(self) -> dict[StageKind, float]:
        """Measured over estimated peak memory per stage kind (the mean of the last 20),
        within the bounds a profile may hold."""
        return {k: float(np.clip(np.mean(v[-20:]), *MEMORY_SCALE_BOUNDS))
                for k, v in self._memory.items() if v}

    def _fit(self) -> Efficiencies:
        self._spread = {}
        if not self._rows:
            return self.prior
        classes = tuple(sorted(set().union(*(r.ideal for r in self._rows)),
                               key=lambda c: c.value))
        x0 = np.array([1.0 / self.prior[c] for c in classes])
        dense = [r.over(classes) for r in self._rows]
        ideal = np.array([d[0] for d in dense]).reshape(len(dense), len(classes))
        measured = np.array([r.measured_s for r in self._rows])
        weights = np.array([self.forgetting ** (self._step - r.step) for r in self._rows])
        # relative error: divide each row by its measured time
        w = np.sqrt(weights) / measured
        a = ideal * w[:, None]
        b = measured * w
        # ridge toward the prior, in relative terms of each x (scale-free); it keeps classes
        # no row can separate near the prior and fades as rows about a class accumulate, to a
        # floor that keeps classes only noise could separate near it too
        seen = np.array([d[1] for d in dense]).reshape(len(dense), len(classes)).sum(axis=0)
        lam = np.diag(np.sqrt(np.maximum(self.ridge / (1.0 + seen), self.ridge_floor)) / x0)
        a_full = np.vstack([a, lam])
        b_full = np.concatenate([b, lam @ x0])
        x, *_ = np.linalg.lstsq(a_full, b_full, rcond=None)
        # standard errors: residual variance per unit weight over the normal matrix
        n_eff = weights.sum() ** 2 / max(float((weights ** 2).sum()), 1e-300)
        resid = a @ x - b
        s2 = float(resid @ resid) / max(weights.sum(), 1e-300) * n_eff / max(n_eff - len(x), 1.0)
        cov = s2 * np.linalg.pinv(a_full.T @ a_full)
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
        self._spread = {c: float(e / xi) if xi > 0 else float("inf")
                        for c, e, xi in zip(classes, se, x)}
        # an inverse efficiency negative, below 1e-3 or under the peak's (efficiency above
        # peak_bound) is noise the data cannot support
        device = self.prior.device
        low = np.array([max(1e-3, 1.0 / peak_bound(c, device)) for c in classes])
        clipped = np.clip(x, low, 1.0 / MIN_EFFICIENCY)
        # a class held at a bound is not pinned down by the data: its error is unbounded
        self._spread = {c: (v if xi == ci else float("inf"))
                        for (c, v), xi, ci in zip(self._spread.items(), x, clipped)}
        x = clipped
        return self.prior.updated({c: float(1.0 / xi) for c, xi in zip(classes, x)})

    # ---- profiles ----
    def to_profile(self, model: str = "") -> dict[str, object]:
        eff = self.efficiencies()
        return {"version": PROFILE_VERSION, "device": eff.device or self.prior.device,
                "model": model, "samples": self.samples,
                "efficiency": {c.value: v for c, v in sorted(eff.values.items())},
                "memory_scale": {k.value: v for k, v in self.memory_scale().items()}}

    def save(self, path: str | Path, model: str = "") -> None:
        Path(path).write_text(json.dumps(self.to_profile(model), indent=2) + "\n")

    @classmethod
    def from_profile(cls, path: str | Path, device: str,
                     op_classes: frozenset[OpClass] | None = None) -> Calibrator:
        """Start from a saved profile of the same device; a new model reuses it when the op
        classes it will use are all in the profile (else the missing ones start at defaults).
        The profile is checked strictly: an error names ``profile.<field>``."""
        data = read_json(path, "profile")
        if not isinstance(data, Mapping):
            raise InputError("profile", "must be a JSON object", list(_ProfileFile.model_fields))
        kinds = [k.value for k in StageKind]
        if not isinstance(data.get("memory_scale", {}), Mapping):
            raise InputError("profile.memory_scale", "must be a mapping of stage kind to scale",
                             kinds)
        p = validate(_ProfileFile, data, "profile", prefix="profile.")
        if p.device and p.device != device:
            raise InputError("profile.device", f"profile is for {p.device!r}, job runs on "
                             f"{device!r}", f"a profile measured on {device}, or a job on "
                             f"{p.device}")
        if not p.efficiency and not p.memory_scale:  # calibrates nothing: say so, not use it
            raise InputError("profile", f"{path} holds no efficiency and no memory_scale entry",
                             "efficiency per op class, memory_scale per stage kind")
        eff = Efficiencies.from_dict({"efficiency": p.efficiency, "device": device})
        if op_classes is not None:
            eff = Efficiencies({c: v for c, v in eff.values.items() if c in op_classes}, device)
        cal = cls(prior=eff)
        for k, v in p.memory_scale.items():
            try:
                kind = StageKind(k)
            except ValueError:
                raise InputError(f"profile.memory_scale.{k}", "unknown stage kind",
                                 kinds) from None
            cal._memory[kind] = [float(v)]
        return cal


class _ProfileFile(BaseModel):
    """A calibration profile, as :meth:`Calibrator.to_profile` writes it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = Field(PROFILE_VERSION, ge=1, le=PROFILE_VERSION)
    device: str = ""
    model: str = ""
    samples: int = Field(0, ge=0)
    efficiency: dict[str, Any] = Field(default_factory=dict)  # checked by Efficiencies
    # measured over predicted peak memory per stage kind, within MEMORY_SCALE_BOUNDS
    memory_scale: dict[str, Annotated[float, Field(ge=MEMORY_SCALE_BOUNDS[0],
                                                   le=MEMORY_SCALE_BOUNDS[1],
                                                   allow_inf_nan=False)]] = \
        Field(default_factory=dict)


def profile_matches(profile: Mapping[OpClass, float], needed: frozenset[OpClass]) -> bool:
    """Whether a profile covers every op class a model's plans use."""
    return needed <= frozenset(profile)


__all__ = ["Calibrator", "default_efficiency", "profile_matches"]
