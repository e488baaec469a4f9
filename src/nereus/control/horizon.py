"""Horizons H_x (§4.3): how many steps until signal x crosses its threshold again.

H_x is an exponential moving average of the steps between past crossings of x, updated at
crossings (not at telemetry samples, not at admitted transitions). Before the first interval is
seen H_x is one step, so an untested signal admits only moves that repay within γ steps. With
several triggers the smallest H_x counts: the move must pay back before the soonest change.

A crossing of a drifting signal is measured from its reference, and every replan resets the
references (§4.1), also a replan that another signal started. H_x is read at a replan -- right
after such a reset -- to say how many steps remain until the next crossing, so an interval
starts at the later of x's last crossing and the last reset of x's reference (``reset``): the
steps before a reset drifted against a reference that is gone and are no part of the next
crossing. Without an intervening reset that is the last crossing itself (a crossing replans and
resets at once). Pool changes have no reference: their intervals run change to change.
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
    # where the running interval of each signal started: its last crossing, or a later reset
    # of its reference
    since: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise InputError("control.horizon_alpha", f"must be in (0, 1], got {self.alpha}")

    def crossed(self, signal: str, step: int) -> Horizons:
        """Signal ``signal`` crossed its threshold at ``step``."""
        start = self.since.get(signal, self.last_crossing.get(signal))
        ema = dict(self.ema)
        if start is not None and step > start:
            interval = float(step - start)
            prev = ema.get(signal)
            ema[signal] = interval if prev is None else (
                self.alpha * interval + (1.0 - self.alpha) * prev)
        return replace(self, ema=ema, last_crossing={**self.last_crossing, signal: step},
                       since={**self.since, signal: step})

    def reset(self, signals: Iterable[str], step: int) -> Horizons:
        """The references of ``signals`` were reset at ``step`` (a replan): the next interval
        of each signal that has crossed before starts here. A signal that never crossed has no
        interval to start (H_x stays one step until two crossings are seen)."""
        since = dict(self.since)
        for s in signals:
            start = since.get(s, self.last_crossing.get(s))
            if start is not None and step > start:
                since[s] = step
        return replace(self, since=since)

    def of(self, signal: str) -> float:
        """H_x in steps: 1 before the first interval is seen."""
        return float(self.ema.get(signal, 1.0))

    def smallest(self, signals: Iterable[str]) -> float:
        hs = [self.of(s) for s in signals]
        return min(hs) if hs else 1.0
