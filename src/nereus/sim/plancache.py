"""Best plans cached by (pool, response-length buckets, efficiency fingerprint).

The exact search takes tens of milliseconds; a policy that replans at every one of 1,000 steps
(the oracle, replan-without-admission) would spend most of a run in it. Plans change slowly
with length, so the cache solves each bucket once, at the bucket's upper edge (memory grows
with length, so a plan that fits there fits anywhere in the bucket), and reuses it while the
efficiencies stay close to those it was solved under. Callers re-price the cached plan at the
actual lengths and efficiencies.

The calibrated memory scale is keyed to two decimals, and a plan is solved under the scale of
the call that searched: a later call whose scale rounds alike but is larger may find the plan
over the memory limit (the planner's best plans often fill the device within 1 %). Such a
call gets an exact search at its own lengths and scale; a call whose scale is no larger gets
the cached plan, which fits it as it fits the bucket's edge.

"Close" is weighed by time: an op class that takes at least 5 % of the cached plan's time must
stay within 5 % (log scale); a smaller one may move further, in inverse proportion to its share
(so it moves the plan's time by at most about 0.25 %), and one the plan does not use at most
ten times as far (a rival plan may use it). Fitted from stage times alone, the efficiencies
of minor classes (attention, the optimizer, p2p) swing by tens of percent from step to step
without changing which plan is best; a strict test on every class would search at nearly
every step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from nereus.control.targets import reprice
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.errors import InfeasibleError
from nereus.plan.search import Planner
from nereus.plan.types import Plan, stage_estimate
from nereus.spec.job import JobSpec
from nereus.spec.workflow import StageKind

# efficiencies and memory scale searched under, the answer, its op classes' time shares
_Entry = tuple[Efficiencies, "Mapping[StageKind, float]", "Plan | InfeasibleError",
               "dict[OpClass, float] | None"]

LENGTH_BUCKET = 1.10   # response-length buckets of 10 %
EFF_GRID = 1.05        # efficiencies rounded to a 5 % (log) grid for the cache key
MAJOR_SHARE = 0.05     # an op class with this share of the plan's time is held to the grid
UNUSED_WEIGHT = 0.1    # a class the plan does not use: ten times the grid


def bucket(x: float, ratio: float = LENGTH_BUCKET) -> int:
    return math.ceil(math.log(max(1.0, x)) / math.log(ratio) - 1e-9)


def edge(b: int, ratio: float = LENGTH_BUCKET) -> int:
    return math.ceil(ratio ** b)


class PlanCache:
    """A caching planner with the controller's ``PlanFn`` signature
    ``(job, cost, spread=False) -> Plan``.

    A cached plan is reused for efficiencies within ``grid`` (per op class, either way) of the
    ones it was searched under, so calibration noise does not force a new search.
    """

    def __init__(self, ratio: float = LENGTH_BUCKET, grid: float = EFF_GRID):
        self.ratio = ratio
        self.tolerance = math.log(grid) + 1e-12
        self._plans: dict[tuple[object, ...], list[_Entry]] = {}
        self.searches = 0
        self.hits = 0

    @staticmethod
    def _entry(eff: Efficiencies, hit: Plan | InfeasibleError, cost: CostModel) -> _Entry:
        return (eff, dict(cost.memory_scale), hit,
                None if isinstance(hit, InfeasibleError) else time_shares(cost, hit))

    def _close(self, entry: _Entry, b: Efficiencies) -> bool:
        a, shares = entry[0], entry[3]
        for c in set(a.values) | set(b.values):
            w = 1.0 if shares is None else \
                min(1.0, max(UNUSED_WEIGHT, shares.get(c, 0.0) / MAJOR_SHARE))
            if w * abs(math.log(a[c] / b[c])) > self.tolerance:
                return False
        return True

    def __call__(self, job: JobSpec, cost: CostModel, spread: bool = False) -> Plan:
        w = job.workload
        bm, bx = bucket(w.response_len_mean, self.ratio), bucket(w.response_len_max, self.ratio)
        key = (job.pool.ids, bm, bx, _scale_key(cost.memory_scale), spread)
        entries = self._plans.setdefault(key, [])
        found = next((e for e in entries if self._close(e, cost.eff)), None)
        hit = None if found is None else found[2]
        if found is not None and isinstance(found[2], Plan) \
                and _larger(cost.memory_scale, found[1]) \
                and not reprice(job, cost, found[2]).fits:
            # solved under a scale that rounds alike, but smaller: over the limit here
            self.searches += 1
            return Planner(job, cost=cost, spread=spread).best()
        if hit is None:
            mean = min(edge(bm, self.ratio), edge(bx, self.ratio))
            rep = job.with_workload(w.with_response_len(mean, edge(bx, self.ratio)))
            rep_cost = CostModel(rep, cost.eff, cost.memory_scale)
            self.searches += 1
            planner = Planner(rep, cost=rep_cost, spread=spread)
            try:
                hit = planner.best()
            except InfeasibleError as e:
                hit = e
            entries.append(self._entry(cost.eff, hit, rep_cost))
            alt = planner.spread_plan
            if alt is not None and not spread:
                # the spread plan the packed search weighed: the answer to the same question
                # with spread, which the controller asks next where the plan is exposed
                self._plans.setdefault(key[:-1] + (True,), []).append(
                    self._entry(cost.eff, alt, rep_cost))
        else:
            self.hits += 1
        if isinstance(hit, InfeasibleError):
            # the bucket's upper edge may not fit where the actual lengths do: search exactly
            self.searches += 1
            return Planner(job, cost=cost, spread=spread).best()
        return hit


def time_shares(cost: CostModel, plan: Plan) -> dict[OpClass, float]:
    """Each op class's share of the time of ``plan``'s model-stages under ``cost``."""
    by_class: dict[OpClass, float] = {}
    for sp in plan.stages:
        est = stage_estimate(cost, plan, sp.stage)
        for c, t in est.time_by_class().items():
            by_class[c] = by_class.get(c, 0.0) + t
    total = sum(by_class.values()) or 1.0
    return {c: t / total for c, t in by_class.items()}


def _larger(scale: Mapping[StageKind, float], searched: Mapping[StageKind, float]) -> bool:
    """Whether ``scale`` scales some stage kind's memory more than the search's did."""
    return any(v > searched.get(k, 1.0) for k, v in scale.items()) or \
        any(scale.get(k, 1.0) > v for k, v in searched.items())


def _scale_key(scale: Mapping[StageKind, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((k.value, round(v, 2)) for k, v in scale.items()))
