"""Best plans cached by (pool, response-length buckets, efficiency fingerprint).

The exact search takes tens of milliseconds; a policy that replans at every one of 1,000 steps
(the oracle, replan-without-admission) would spend most of a run in it. Plans change slowly
with length, so the cache solves each bucket once, at the bucket's upper edge (memory grows
with length, so a plan that fits there fits anywhere in the bucket), and reuses it while the
efficiencies stay within 5 % of those it was solved under. Callers re-price the cached plan at
the actual lengths and efficiencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError
from nereus.plan.search import Planner
from nereus.plan.types import Plan
from nereus.spec.job import JobSpec
from nereus.spec.workflow import StageKind

LENGTH_BUCKET = 1.10   # response-length buckets of 10 %
EFF_GRID = 1.05        # efficiencies rounded to a 5 % (log) grid for the cache key


def bucket(x: float, ratio: float = LENGTH_BUCKET) -> int:
    return math.ceil(math.log(max(1.0, x)) / math.log(ratio) - 1e-9)


def edge(b: int, ratio: float = LENGTH_BUCKET) -> int:
    return int(math.ceil(ratio ** b))


class PlanCache:
    """A caching planner with the controller's ``PlanFn`` signature ``(job, cost) -> Plan``.

    A cached plan is reused for efficiencies within ``grid`` (per op class, either way) of the
    ones it was searched under, so calibration noise does not force a new search.
    """

    def __init__(self, ratio: float = LENGTH_BUCKET, grid: float = EFF_GRID):
        self.ratio = ratio
        self.tolerance = math.log(grid) + 1e-12
        self._plans: dict[tuple[object, ...], list[tuple[Efficiencies, Plan | InfeasibleError]]] = {}
        self.searches = 0
        self.hits = 0

    def _close(self, a: Efficiencies, b: Efficiencies) -> bool:
        classes = set(a.values) | set(b.values)
        return all(abs(math.log(a[c] / b[c])) <= self.tolerance for c in classes)

    def __call__(self, job: JobSpec, cost: CostModel) -> Plan:
        w = job.workload
        bm, bx = bucket(w.response_len_mean, self.ratio), bucket(w.response_len_max, self.ratio)
        key = (job.pool.ids, bm, bx, _scale_key(cost.memory_scale))
        entries = self._plans.setdefault(key, [])
        hit = next((p for e, p in entries if self._close(e, cost.eff)), None)
        if hit is None:
            mean = min(edge(bm, self.ratio), edge(bx, self.ratio))
            rep = job.with_workload(w.with_response_len(mean, edge(bx, self.ratio)))
            self.searches += 1
            try:
                hit = Planner(rep, cost=CostModel(rep, cost.eff, cost.memory_scale)).best()
            except InfeasibleError as e:
                hit = e
            entries.append((cost.eff, hit))
        else:
            self.hits += 1
        if isinstance(hit, InfeasibleError):
            # the bucket's upper edge may not fit where the actual lengths do: search exactly
            self.searches += 1
            return Planner(job, cost=cost).best()
        return hit


def _scale_key(scale: Mapping[StageKind, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((k.value, round(v, 2)) for k, v in scale.items()))
