"""Fit the transition's set-up, copy and bandwidth efficiencies from measured primitive times.

A Split or Extend is predicted as ``setup / e_setup + ideal_c / e_c`` where c is its slowest
link class, a Merge as ``copy / e_copy`` (its on-device copy; no set-up, no link); the local
part (dispatch, a staged primitive's host copies) is taken off the measured time first. The
times are linear in the inverse efficiencies ``x = 1 / e`` once each measurement's bottleneck
link class is known (set-up and copy add, so they need no assignment). We alternate: assign
bottlenecks under the current ``x``, solve a non-negative least-squares problem in relative
error (a small pull toward the schedule's efficiencies keeps classes the data cannot separate
where they were), repeat until the assignment stops changing. Destroy is local alone and has
no class to fit.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from nereus.cost.efficiency import Efficiencies, peak_bound
from nereus.cost.ops import OpClass
from nereus.errors import InputError
from nereus.transition.cost import SERIAL_CLASSES
from nereus.transition.schedule import Schedule

RIDGE = 1e-3  # pull toward the prior (relative units, against one measurement of weight 1)
# A measurement whose fitted part (measured minus the uncalibrated local part) is below this
# share of it says nothing about its classes (a short Merge is mostly dispatch): skipped.
MIN_FITTED_SHARE = 0.05


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| with x >= 0, exact by trying every support (a has a handful of columns)."""
    n = a.shape[1]
    best, best_r = np.zeros(n), float(np.sum(b * b))
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            sub = a[:, cols]
            sol, *_ = np.linalg.lstsq(sub, b, rcond=None)
            if np.any(sol < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = sol
            r = float(np.sum((a @ x - b) ** 2))
            if r < best_r - 1e-15:
                best, best_r = x, r
    return best


def calibrate_transition(schedule: Schedule,
                         measured_s_per_primitive: Sequence[float | None] | Mapping[int, float]
                         ) -> Efficiencies:
    """Efficiencies that make the schedule's primitives take their measured seconds.

    ``measured_s_per_primitive[i]`` is the measured time of ``schedule.primitives[i]`` (a
    sequence in schedule order, or a mapping by index; None or missing entries are skipped,
    and so are times the uncalibrated local part nearly fills: ``MIN_FITTED_SHARE``).
    Returns the schedule's efficiencies with the classes seen (``setup``, ``copy``, link
    classes) updated.
    """
    prims = schedule.primitives
    if isinstance(measured_s_per_primitive, Mapping):
        measured = dict(measured_s_per_primitive)
    else:
        if len(measured_s_per_primitive) != len(prims):
            raise InputError("measured", f"{len(measured_s_per_primitive)} times for "
                             f"{len(prims)} primitives", "one per primitive, in schedule order")
        measured = {i: m for i, m in enumerate(measured_s_per_primitive) if m is not None}
    rows: list[tuple[dict[OpClass, float], float]] = []
    for i, m in measured.items():
        if not 0 <= i < len(prims):
            raise InputError("measured", f"no primitive {i}", f"0..{len(prims) - 1}")
        if m is None:
            continue
        if not m > 0:
            raise InputError(f"measured[{i}]", f"must be > 0, got {m}")
        d = prims[i].duration
        if not d.ideal:
            continue  # Destroy: local alone, nothing to fit
        fitted = float(m) - d.local_s
        if fitted <= MIN_FITTED_SHARE * m:
            continue  # the local part is (nearly) all of it: nothing to learn
        rows.append((dict(d.ideal), fitted))
    if not rows:
        return schedule.efficiencies
    prior = schedule.efficiencies
    classes = sorted({c for ideal, _ in rows for c in ideal}, key=lambda c: c.value)
    col = {c: j for j, c in enumerate(classes)}
    x0 = np.array([1.0 / prior[c] for c in classes])
    x = x0.copy()
    # no link or copy beats its datasheet peak: a class fitted above 1 is a mislabelled link or
    # a bad timer, so its inverse efficiency stops at 1 (the cpu preset's peaks are guesses, and
    # set-up has no peak: those only stay positive)
    floor = np.array([max(1.0 / peak_bound(c, prior.device), x0[j] * 1e-3)
                      for j, c in enumerate(classes)])
    assign: list[OpClass | None] | None = None
    for _ in range(20):
        new_assign: list[OpClass | None] = []
        for ideal, _ in rows:
            links = [(v * x[col[c]], c) for c, v in ideal.items() if c not in SERIAL_CLASSES]
            new_assign.append(max(links, key=lambda t: (t[0], t[1].value))[1] if links else None)
        if new_assign == assign:
            break
        assign = new_assign
        a = np.zeros((len(rows) + len(classes), len(classes)))
        b = np.zeros(len(rows) + len(classes))
        for r, ((ideal, m), c) in enumerate(zip(rows, assign)):
            w = 1.0 / max(m, 1e-12)
            for s_cls in SERIAL_CLASSES & ideal.keys():  # set-up, copy: they add
                a[r, col[s_cls]] = ideal[s_cls] * w
            if c is not None:
                a[r, col[c]] = ideal[c] * w
            b[r] = m * w
        for j in range(len(classes)):  # ridge toward the prior, relative
            a[len(rows) + j, j] = RIDGE / x0[j]
            b[len(rows) + j] = RIDGE
        x = np.maximum(_nnls(a, b), floor)
    return prior.updated({c: float(1.0 / x[col[c]]) for c in classes})
