"""Layout nesting: which GPU goes where in Split and Merge (the runtime uses the same mapping).

For T = (tp, pp) and T_sub = (tp / m_tp, pp / m_pp), the GPU at T-position (t, r) belongs to
sub-unit ``j = t % m_tp + m_tp * (r % m_pp)`` at T_sub-position ``(t // m_tp, r // m_pp)``.
A sub-unit's GPU list is ordered by its own ``pp_rank * tp_sub + tp_rank``. Split all-gathers
inside each group of the ``m_tp * m_pp`` GPUs that share a T_sub-position; Merge is the inverse
mapping and moves nothing. Shard ranges nest under this mapping (``spec.sharding``), which is
what makes both local to those groups.

The GPU mapping itself (``factors``, ``split_gpus``, ``merge_gpus``) is the plan layer's
(``plan.nesting``), which placement reads too; it is imported here for the primitives.
"""

from __future__ import annotations

import math
from functools import lru_cache

from nereus.cost.candidate import Layout
from nereus.plan.nesting import factors, merge_gpus, split_gpus
from nereus.spec.model import ModelSpec
from nereus.spec.sharding import layout_problem, padded_vocab

__all__ = ["common_layout", "factors", "gather_groups", "merge_gpus", "nesting_problem",
           "split_gpus", "sub_index"]


def common_layout(a: Layout, b: Layout) -> Layout:
    """The largest layout both ``a`` and ``b`` split into: (gcd(tp, tp*), gcd(pp, pp*))."""
    return Layout(math.gcd(a.tp, b.tp), math.gcd(a.pp, b.pp))


def nesting_problem(model: ModelSpec, layout: Layout, sub: Layout) -> str | None:
    """Why shards of ``layout`` do not nest inside those of ``sub`` (None when they do)."""
    if layout.tp % sub.tp or layout.pp % sub.pp:
        return f"{sub} does not divide {layout}"
    for lay in (layout, sub):
        p = layout_problem(model, lay.tp, lay.pp)
        if p:
            return f"{model.name}: {p}"
    if padded_vocab(model, layout.tp) != padded_vocab(model, sub.tp):
        return (f"vocabulary padding differs between tp={layout.tp} and tp={sub.tp}, "
                "so embedding rows do not nest")
    return None


@lru_cache(maxsize=256)
def gather_groups(layout: Layout, sub: Layout) -> tuple[tuple[int, ...], ...]:
    """Indices (into a ``layout`` unit's GPU list) of each all-gather group of a Split, one
    group per T_sub-position, members ordered by sub-unit j."""
    m_tp, m_pp = factors(layout, sub)
    groups: list[tuple[int, ...]] = []
    for r_ in range(sub.pp):
        for t_ in range(sub.tp):
            members = []
            for j in range(m_tp * m_pp):
                t, r = t_ * m_tp + j % m_tp, r_ * m_pp + j // m_tp
                members.append(r * layout.tp + t)
            groups.append(tuple(members))
    return tuple(groups)


def sub_index(index: int, layout: Layout, sub: Layout) -> tuple[int, int]:
    """(sub-unit j, index inside it) of position ``index`` of a ``layout`` unit."""
    m_tp, m_pp = factors(layout, sub)
    t, r = index % layout.tp, index // layout.tp
    return t % m_tp + m_tp * (r % m_pp), (r // m_pp) * sub.tp + t // m_tp
