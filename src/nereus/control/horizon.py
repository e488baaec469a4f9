"""Horizons H_x (§4.3): how many steps until signal x crosses its threshold again.

H_x is an exponential moving average of the steps between past crossings of x, updated at
crossings (not at telemetry samples, not at admitted transitions). Before the first interval is
seen H_x is one step, so an untested signal admits only moves that repay within γ steps. With
several triggers the smallest H_x counts: the move must pay back before the soonest change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from nereus.errors import InputError

DEFAULT_ALPHA = 0.5  # weight of the newest interval; assumption (no value in the paper)


@dataclass(frozen=True)
class Horizons:
    alpha: float = DEFAULT_ALPHA
    ema: Mapping[str, float] = field(default_factory=dict)
    last_crossing: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise InputError("control.horizon_alpha", f"must be in (0, 1], got {self.alpha}")

    def crossed(self, signal: str, step: int) -> Horizons:
        """Signal ``signal`` crossed its threshold at ``step``."""
        last = self.last_crossing.get(signal)
        ema = dict(self.ema)
        if last is not None and step > last:
            interval = float(step - last)
            prev = ema.get(signal)
            ema[signal] = interval if prev is None else (
                self.alpha * interval + (1.0 - self.alpha) * prev)
        return replace(self, ema=ema, last_crossing={**self.last_crossing, signal: step})

    def of(self, signal: str) -> float:
        """H_x in steps: 1 before the first interval is seen."""
        return float(self.ema.get(signal, 1.0))

    def smallest(self, signals: Iterable[str]) -> float:
        hs = [self.of(s) for s in signals]
        return min(hs) if hs else 1.0
