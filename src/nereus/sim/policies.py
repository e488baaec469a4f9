"""The policies a simulation compares.

- ``static``: what a user of verl or OpenRLHF runs: per GPU budget, the fastest plan that stays
  feasible for the whole trace, chosen at start with the true efficiencies (a parameter sweep
  measures them). It never moves: a lost GPU crashes the job, which restarts from the last
  checkpoint on the GPUs left; GPUs that come back are used at its next restart.
- ``static_verl``: ``static`` within the plan space a verl user configures
  (``nereus.plan.frameworks``: every model-stage on the same GPUs, a rollout without pipeline,
  the critic's values on its training layout); on a pool where no plan of that space fits the
  whole trace it runs ``static``'s plan (generous to it: a verl job would wait), and says how
  often (``fallback_pools``). Not in ``POLICIES``: run it by name.
- ``replan_always``: the controller with admission off: it replans at every boundary and moves
  whenever a faster feasible plan exists, whatever the move costs.
- ``nereus``: the controller as §4 describes it (triggers, horizons, Eq. 2, urgent path).
- ``oracle``: the best plan for every step, knowing that step's lengths and the true
  efficiencies, with free transitions: the bound on what moving gains. It also knows which GPUs
  leave during each step (``Policy.foresee``) and takes the fastest plan no such loss hits
  where one fits (on the GPUs that stay), so a loss costs it neither work nor state. Where none
  fits, or the pool empties, it restarts from the checkpoint as every policy does when a loss
  takes every copy of some state (every replica of a training stage: the simulator's
  ``survive`` check), since there is then nothing left to move, and after a pause.

All of them pause while the pool is empty (the state on the GPUs is gone; they restart from the
checkpoint when GPUs return), and all wait when no plan fits the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from nereus.control.controller import Action, ControlConfig, Controller, Decision
from nereus.control.telemetry import Telemetry
from nereus.cost.calibrate import Calibrator
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError, InputError
from nereus.plan.frameworks import best_verl_plan
from nereus.plan.search import best_plan
from nereus.plan.types import Plan
from nereus.sim.plancache import PlanCache, bucket
from nereus.sim.traces import LengthTrace
from nereus.sim.truth import Truth
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution

POLICIES = ("static", "replan_always", "nereus", "oracle")
# policies run only when named (``--policies``)
EXTRA_POLICIES = ("static_verl",)
ALL_POLICIES = POLICIES + EXTRA_POLICIES


@dataclass(frozen=True)
class Act:
    """What a policy does at a boundary. ``free``: the move costs nothing (oracle), where the
    state survives on the pool; where it does not, the simulator restarts after a failure."""

    kind: Action
    plan: Plan | None = None
    after_failure: bool = True
    free: bool = False
    decision: Decision | None = None


class Policy:
    name = "policy"

    def start(self, pool: tuple[int, ...], mean: float, longest: int) -> Plan | None:
        raise NotImplementedError

    def decide(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        """``upcoming``: (step, mean, longest) of the step about to run (only the oracle may
        look)."""
        raise NotImplementedError

    def failed(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        """The job crashed (out of memory): restart from the checkpoint."""
        raise NotImplementedError

    def efficiencies(self) -> Efficiencies | None:
        """The efficiencies the policy believes (for the calibration error); None if none."""
        return None

    def foresee(self, stays: Sequence[frozenset[int]]) -> None:
        """Per step, the GPUs of its starting pool that no change during the step takes away
        (empty where the pool empties): the future, which only the oracle may look at."""


class StaticPolicy(Policy):
    name = "static"

    def __init__(self, truth: Truth, lengths: LengthTrace, samples: int = 12, candidates: int = 6):
        self.truth = truth
        self.lengths = lengths
        self.samples = samples
        self.candidates = candidates
        self._plans: dict[tuple[int, ...], Plan | None] = {}
        self.plan: Plan | None = None
        self.stopped = False

    def plan_for(self, pool: tuple[int, ...]) -> Plan | None:
        """The fastest plan over the trace among those that fit its longest responses."""
        if pool in self._plans:
            return self._plans[pool]
        tr, lt = self.truth, self.lengths
        longest = max(lt.longest)
        order = np.argsort(lt.mean)
        picks = [int(order[int(q)]) for q in np.linspace(0, len(order) - 1, self.samples)]
        means = sorted({int(round(lt.mean[int(order[int(q)])]))
                        for q in np.linspace(0, len(order) - 1, self.candidates)})
        found: list[Plan] = []
        for m in means + [int(round(max(lt.mean)))]:
            try:
                found.append(self.best_at(tr.job_at(pool, min(m, longest), longest)))
            except InfeasibleError:
                continue
        best: tuple[float, Plan] | None = None
        for p in found:
            if not tr.fits(tr.price(p, pool, 0, max(lt.mean), longest)):
                continue
            total = sum(tr.price(p, pool, k, *lt.at(k)).step_s for k in picks)
            if best is None or total < best[0]:
                best = (total, p)
        self._plans[pool] = best[1] if best else None
        return self._plans[pool]

    def best_at(self, job: JobSpec) -> Plan:
        """The fastest plan of the policy's space for ``job`` (its pool and lengths), under
        the true efficiencies."""
        return best_plan(job, self.truth.hidden)

    def start(self, pool: tuple[int, ...], mean: float, longest: int) -> Plan | None:
        self.plan = self.plan_for(pool)
        return self.plan

    def decide(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        if not tel.pool:
            self.stopped = True
            return Act(Action.WAIT)
        if self.stopped or self.plan is None or not set(self.plan.gpus()) <= set(tel.pool):
            self.stopped = False
            self.plan = self.plan_for(tel.pool)
            if self.plan is None:
                self.stopped = True
                return Act(Action.WAIT)
            return Act(Action.RESTART, self.plan, after_failure=True)
        return Act(Action.KEEP, self.plan)

    def failed(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        self.stopped = True
        return self.decide(tel, upcoming)


class VerlStaticPolicy(StaticPolicy):
    name = "static_verl"

    def __init__(self, truth: Truth, lengths: LengthTrace, samples: int = 12,
                 candidates: int = 6):
        super().__init__(truth, lengths, samples, candidates)
        # pools where verl's space has no plan for the whole trace, so ``static``'s ran
        self.fallback_pools: set[tuple[int, ...]] = set()
        self._static = StaticPolicy(truth, lengths, samples, candidates)

    def best_at(self, job: JobSpec) -> Plan:
        return best_verl_plan(job, self.truth.hidden)

    def plan_for(self, pool: tuple[int, ...]) -> Plan | None:
        if pool in self._plans:
            return self._plans[pool]
        plan = super().plan_for(pool)
        if plan is None:
            plan = self._static.plan_for(pool)
            self._plans[pool] = plan
            if plan is not None:
                self.fallback_pools.add(pool)
        return plan


class OraclePolicy(Policy):
    name = "oracle"

    def __init__(self, truth: Truth, cache: PlanCache):
        self.truth = truth
        self.cache = cache
        self.plan: Plan | None = None
        self.stopped = False
        self.stays: Sequence[frozenset[int]] = ()  # ``foresee``

    def foresee(self, stays: Sequence[frozenset[int]]) -> None:
        self.stays = stays

    def _best(self, pool: tuple[int, ...], step: int, mean: float, longest: int) -> Plan | None:
        """The fastest plan at this step by the ground truth: its lengths, its efficiencies and
        its memory rule (the whole device); where GPUs leave during the step (``foresee``),
        the fastest among the plans on the GPUs that stay, if one fits, since it loses no work
        and keeps its state (a plan blind to the loss lost the step so far, and restarted
        where the loss took a training stage's last replica: under churn more often than
        Nereus, which prices that risk).

        The plan cache solves each response-length bucket at its upper edge, up to 10 %
        longer than the step's longest response, with the planner's 10 % memory headroom; the
        plans of the bucket below are candidates too, kept when the truth says they fit this
        step, so the oracle is not held to a longer response than the step has (a controller
        plans for its recent longest plus 5 %, and could run what such an oracle never
        tries). The planner's best is already the faster of the packed plan and the one
        spread over nodes (which can sync its weights inside them for less)."""
        tr = self.truth
        eff = tr.efficiencies(step)
        cands: list[Plan] = []
        below = int(self.cache.ratio ** (bucket(longest, self.cache.ratio) - 1))  # bucket b-1
        # where GPUs leave during the step, the plans on those that stay are candidates too
        stay = tuple(g for g in pool if g in self.stays[step]) \
            if step < len(self.stays) else pool
        pools = (pool, stay) if stay and len(stay) < len(pool) else (pool,)
        for gpus in pools:
            for need in dict.fromkeys((longest, min(longest, max(1, below)))):
                job = tr.job_at(gpus, min(mean, need), need)
                try:
                    cands.append(self.cache(job, CostModel(job, eff)))
                except InfeasibleError:
                    pass
        if self.plan is not None and set(self.plan.gpus()) <= set(pool):
            cands.append(self.plan)
        kept = set(stay)
        priced = [(tr.price(p, pool, step, mean, longest), p) for p in cands]
        # a plan that no change of the step hits first (it loses no work and needs no copy of
        # the state to survive), then the fastest
        fit = [(not set(p.gpus()) <= kept, q.step_s, i, p) for i, (q, p) in enumerate(priced)
               if tr.fits(q)]
        return min(fit, key=lambda x: x[:3])[3] if fit else None

    def start(self, pool: tuple[int, ...], mean: float, longest: int) -> Plan | None:
        self.plan = self._best(pool, 0, mean, longest)
        return self.plan

    def decide(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        if not tel.pool:
            self.stopped = True
            return Act(Action.WAIT)
        plan = self._best(tel.pool, *upcoming)
        if plan is None:
            self.stopped = True
            return Act(Action.WAIT)
        if self.stopped:
            self.stopped = False
            self.plan = plan
            return Act(Action.RESTART, plan, after_failure=True)
        moved = plan is not self.plan
        self.plan = plan
        return Act(Action.MOVE if moved else Action.KEEP, plan, free=True)

    def failed(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        self.stopped = True
        return self.decide(tel, upcoming)


class ControllerPolicy(Policy):
    """Nereus (``admission=True``) or replan-without-admission (``admission=False``)."""

    def __init__(self, name: str, truth: Truth, cache: PlanCache, config: ControlConfig,
                 on_log: Callable[[str], None] | None = None):
        self.name = name
        self.truth = truth
        self.cache = cache
        self.config = config
        self.on_log = on_log or (lambda line: None)
        self.controller: Controller | None = None

    def start(self, pool: tuple[int, ...], mean: float, longest: int) -> Plan | None:
        job = self.truth.job_at(pool, mean, longest)
        cal = Calibrator(prior=Efficiencies(device=job.cluster.device.name))
        try:
            self.controller = Controller(job, config=self.config, calibrator=cal,
                                         planner=self.cache, on_log=self.on_log)
        except InfeasibleError:
            return None
        return self.controller.plan

    def _act(self, d: Decision) -> Act:
        if d.action is Action.RESTART:
            planned = d.restart is not None and d.restart.save_s > 0
            return Act(Action.RESTART, d.plan, after_failure=not planned, decision=d)
        return Act(d.action, d.plan, decision=d)

    def decide(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        assert self.controller is not None
        return self._act(self.controller.on_boundary(tel))

    def failed(self, tel: Telemetry, upcoming: tuple[int, float, int]) -> Act:
        assert self.controller is not None
        return self._act(self.controller.on_failure(tel, out_of_memory=True))

    def efficiencies(self) -> Efficiencies | None:
        return self.controller.calibrator.efficiencies() if self.controller else None


def check_runs(names: Sequence[str], job: JobSpec, field: str = "policy") -> None:
    """Refuse a policy that cannot run ``job``: ``static_verl`` an asynchronous one (every pool
    would fall back to static's plan, and print static's figures under another name)."""
    if "static_verl" in names and job.workflow.execution is not Execution.SYNC:
        raise InputError(field, "static_verl runs every model-stage on the same GPUs, as "
                         "verl's hybrid engine does; this job's generation is asynchronous",
                         "a synchronous job, or the other policies")


def make_policies(names: Sequence[str], truth: Truth, lengths: LengthTrace,
                  config: ControlConfig,
                  on_log: Callable[[str, str], None] | None = None) -> list[Policy]:
    """Policies by name; each has its own plan cache, so what one finds never reaches another
    and a policy's result does not depend on which others run beside it."""
    out: list[Policy] = []
    for n in names:
        log = (lambda line, n=n: on_log(n, line)) if on_log else None
        if n == "static":
            out.append(StaticPolicy(truth, lengths))
        elif n == "static_verl":
            check_runs(names, truth.job)
            out.append(VerlStaticPolicy(truth, lengths))
        elif n == "oracle":
            out.append(OraclePolicy(truth, PlanCache()))
        elif n == "nereus":
            out.append(ControllerPolicy("nereus", truth, PlanCache(), config, log))
        elif n == "replan_always":
            out.append(ControllerPolicy("replan_always", truth, PlanCache(),
                                        replace(config, admission=False), log))
        else:
            raise InputError("policy", f"unknown policy {n!r}", ALL_POLICIES)
    return out
