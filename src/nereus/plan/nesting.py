"""Layout nesting: which GPU goes where when a unit splits into sub-units or merges from them.

For T = (tp, pp) and T_sub = (tp / m_tp, pp / m_pp), the GPU at T-position (t, r) belongs to
sub-unit ``j = t % m_tp + m_tp * (r % m_pp)`` at T_sub-position ``(t // m_tp, r // m_pp)``.
A sub-unit's GPU list is ordered by its own ``pp_rank * tp_sub + tp_rank``. Shard ranges nest
under this mapping (``spec.sharding``), which is what makes Split and Merge local.

The mapping lives in the plan layer, not beside the primitives (``transition.nesting``), since
placement reads it too: a plan that lays a unit where an in-place Split or Merge of the current
units leaves it (``plan.near``) lets the transition move nothing for that unit.
"""

from __future__ import annotations

from collections.abc import Sequence

from nereus.cost.candidate import Layout
from nereus.errors import InputError


def factors(layout: Layout, sub: Layout) -> tuple[int, int]:
    """(m_tp, m_pp) with layout = (sub.tp * m_tp, sub.pp * m_pp); raises if ``sub`` does not
    divide ``layout``."""
    if sub.tp < 1 or sub.pp < 1 or layout.tp % sub.tp or layout.pp % sub.pp:
        raise InputError("layout", f"{sub} does not divide {layout}",
                         "a sub-layout whose tp and pp divide the unit's")
    return layout.tp // sub.tp, layout.pp // sub.pp


def split_gpus(gpus: Sequence[int], layout: Layout, sub: Layout) -> tuple[tuple[int, ...], ...]:
    """The GPU lists of the k sub-units (index j) that Split of a ``layout`` unit produces."""
    m_tp, m_pp = factors(layout, sub)
    if len(gpus) != layout.size:
        raise InputError("gpus", f"{len(gpus)} GPUs for {layout}")
    k = m_tp * m_pp
    out: list[list[int]] = [[0] * sub.size for _ in range(k)]
    tp = layout.tp
    for i, g in enumerate(gpus):
        t, r = i % tp, i // tp
        j = t % m_tp + m_tp * (r % m_pp)
        out[j][(r // m_pp) * sub.tp + t // m_tp] = g
    return tuple(tuple(u) for u in out)


def merge_gpus(units: Sequence[Sequence[int]], sub: Layout, layout: Layout) -> tuple[int, ...]:
    """The GPU list of the ``layout`` unit that Merge of ``units`` (index j, layout ``sub``)
    produces: unit j's GPU at sub-position (t', r') takes T-position
    (t' * m_tp + j % m_tp, r' * m_pp + j // m_tp)."""
    m_tp, m_pp = factors(layout, sub)
    if len(units) != m_tp * m_pp:
        raise InputError("units", f"{len(units)} units to merge {sub} into {layout}",
                         f"exactly {m_tp * m_pp}")
    out = [0] * layout.size
    for j, unit in enumerate(units):
        if len(unit) != sub.size:
            raise InputError("units", f"unit {j} lists {len(unit)} GPUs for {sub}")
        for s, g in enumerate(unit):
            t_, r_ = s % sub.tp, s // sub.tp
            t, r = t_ * m_tp + j % m_tp, r_ * m_pp + j // m_tp
            out[r * layout.tp + t] = g
    return tuple(out)
