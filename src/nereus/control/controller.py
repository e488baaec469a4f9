"""The adaptation controller (§4): at each safe boundary, keep the plan or move, and say why.

``Controller.on_boundary(telemetry)`` runs the loop of §4.1-§4.3 once:
1. the calibrator learns from the step's measured stage (or op-class) times and peak memory;
2. the monitor raises triggers: pool changes, a predicted memory violation, drifting signals;
3. on a trigger, a CPU-side replan prices the planner's best target S*, hybrids of S* and the
   current plan, and -- when urgent -- the current layout re-batched; admission (feasibility and
   Eq. 2, or the urgent path) picks one, or keeps the plan, or falls back to checkpoint/restart;
   once the pool has lost GPUs, S* is the plan that keeps a copy of every model-stage on
   another node when that beats the fastest plan's expected restarts from a lost last copy;
   an urgent move that stops short of S* is replanned at the next boundary;
4. references reset after every replan, admitted or not.

The decision carries its reasons as data (triggers, ΔL, L_tran, H_x, payback) and as one log
line. The triggers' values come from the telemetry (a pool change, a response length), and
the line labels them with its source (measured, simulated); an efficiency's drift is the
calibrator's fit to the telemetry's times (estimated from measured or simulated times), a
memory trigger is a prediction, and every other number is estimated. The
controller never imports the simulator: the planner and the transition planner are injectable
so a simulator can cache them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

import networkx as nx

from nereus.control.admission import (
    Option,
    Verdict,
    cheapest_to_reach,
    payback_steps,
    profitable,
    select,
    unpriced_refusal,
)
from nereus.control.horizon import DEFAULT_ALPHA, Horizons
from nereus.control.monitor import (
    Monitor,
    Trigger,
    TriggerKind,
    memory_trigger,
    pool_triggers,
)
from nereus.control.restart import RestartCost, RestartParams, restart_cost
from nereus.control.targets import (
    Priced,
    fill,
    hybrids,
    price,
    problems,
    rebatched,
    rebuild_s,
    reprice,
    survive,
)
from nereus.control.telemetry import Telemetry
from nereus.cost.calibrate import Calibrator
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.errors import InfeasibleError, InputError, is_finite_real, is_integer
from nereus.plan.exposure import exposed_fraction, spans_nodes
from nereus.plan.near import SAME_STEP, placed_near
from nereus.plan.overlap import overlap_graph
from nereus.plan.search import Planner
from nereus.plan.types import Plan, stage_estimate
from nereus.spec.cluster import GpuPool
from nereus.spec.job import JobSpec
from nereus.spec.workflow import StageKind, Workflow
from nereus.spec.workload import MAX_TOKENS
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule


class PlanFn(Protocol):
    """The planner the controller calls: the best plan for ``job`` under ``cost``; ``spread``
    asks for replicas that survive the loss of any one node (``Planner(spread=True)``)."""

    def __call__(self, job: JobSpec, cost: CostModel, spread: bool = False) -> Plan: ...


TransitionFn = Callable[[JobSpec, Plan, Plan, Efficiencies], Schedule]

log = logging.getLogger("nereus.control")

MEMORY_BUCKET = 1.05  # memory checks run at the next 5 % step of the longest response
LOSS_SIGNAL = "pool_loss"  # H of pool losses alone: how often a node may take state with it


def default_planner(job: JobSpec, cost: CostModel, spread: bool = False) -> Plan:
    """The exact search of the planning core (Eq. 1) under the calibrated cost model."""
    return Planner(job, cost=cost, spread=spread).best()


@dataclass(frozen=True)
class ControlConfig:
    """Knobs of the controller. δ_len and γ are the paper's; the rest are assumptions."""

    gamma: float = 0.5              # §4.3 default confidence margin
    delta_len: float = 0.30         # §4.1: δ_len = 30 % for per-step response length
    delta_eff: float = 0.20         # assumption: an op class's efficiency moving 20 % is drift
    eff_min_share: float = 0.05     # assumption: watch classes >= 5 % of the plan's time
    warmup_steps: int = 10          # assumption: efficiency signals arm after calibration warm-up
    eff_z: float = 3.0              # assumption: and only while a move of delta_eff is at least
    #                                 eff_z standard errors of the class's estimate (one that
    #                                 moves only together with another wanders with the noise)
    horizon_alpha: float = DEFAULT_ALPHA
    length_window: int = 20         # assumption: memory is planned for the longest of 20 steps
    length_margin: float = 0.05     # assumption: ... plus 5 %
    admission: bool = True          # False: replan every boundary, move whenever faster
    max_tries: int = 12             # transition schedules priced per replan at most (every
    #                                 target's, the onward move's of the urgent path included)
    restart_moves: bool = True      # extension: a planned restart when no transition can run
    spread_on_churn: bool = True    # extension: once the pool has lost GPUs, weigh a lost last
    #                                 copy's expected restart cost against spreading replicas
    restart: RestartParams = field(default_factory=RestartParams)

    def __post_init__(self) -> None:
        for f in ("gamma", "delta_len", "delta_eff", "length_margin", "eff_z", "eff_min_share",
                  "horizon_alpha"):
            v = getattr(self, f)
            if not is_finite_real(v):
                raise InputError(f"control.{f}", f"must be a finite number, got {v!r}")
        for f, least in (("length_window", 1), ("max_tries", 1), ("warmup_steps", 0)):
            v = getattr(self, f)
            if not (is_integer(v) and v >= least):
                raise InputError(f"control.{f}", f"must be an integer >= {least}, got {v!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise InputError("control.gamma", f"must be in [0, 1], got {self.gamma}")
        for f in ("delta_len", "delta_eff"):
            if not getattr(self, f) > 0:
                raise InputError(f"control.{f}", f"must be > 0, got {getattr(self, f)}")
        if self.length_margin < 0:
            raise InputError("control.length_margin", f"must be >= 0, got {self.length_margin}")
        if not self.eff_z > 0:
            raise InputError("control.eff_z", f"must be > 0, got {self.eff_z}")
        if not 0.0 <= self.eff_min_share <= 1.0:
            raise InputError("control.eff_min_share",
                             f"must be in [0, 1], got {self.eff_min_share}")
        if not 0.0 < self.horizon_alpha <= 1.0:
            raise InputError("control.horizon_alpha",
                             f"must be in (0, 1], got {self.horizon_alpha}")


class Action(str, Enum):
    KEEP = "keep"
    MOVE = "move"
    RESTART = "restart"   # checkpoint/restart onto ``plan``
    WAIT = "wait"         # no plan fits the pool: hold until GPUs come back


@dataclass(frozen=True)
class Reasons:
    """Why a decision was taken, as data. Times in seconds, horizons in steps (estimated).

    ``l_tran_s`` is a transition's cost (None where no transition runs: a keep without a
    priced target, a restart); a restart's cost is ``restart_s``, and a planned restart's
    ``payback_steps`` repay it."""

    step: int
    triggers: tuple[Trigger, ...] = ()
    urgent: bool = False
    horizon_steps: float | None = None
    gamma: float = 0.5
    current_step_s: float | None = None
    target_step_s: float | None = None
    delta_l_s: float | None = None
    l_tran_s: float | None = None
    payback_steps: float | None = None
    restart_s: float | None = None
    chosen: str = ""
    verdicts: tuple[Verdict, ...] = ()
    summary: str = ""
    # expected restart seconds per step from a node taking a last copy (an extension of §4.3,
    # zero until losses have a rate): delta_l_s = (current_step_s + current_risk_s) -
    # (target_step_s + target_risk_s)
    current_risk_s: float = 0.0
    target_risk_s: float = 0.0


@dataclass(frozen=True)
class Decision:
    action: Action
    plan: Plan | None                 # the plan to run next (the current one when kept)
    schedule: Schedule | None = None  # for a move
    restart: RestartCost | None = None
    reasons: Reasons = field(default_factory=lambda: Reasons(0))
    source: str = "estimated"
    # the source of the telemetry the triggers were read from (``Telemetry.source``: measured,
    # simulated); empty for a decision built outside ``Controller``
    observed: str = ""

    def log_line(self) -> str:
        """One line: the action, its triggers labelled with where their values came from
        (the telemetry's source; a memory trigger and a fitted efficiency are estimated), then
        the estimates (L, ΔL, L_tran, H, payback, restart), labelled ``source``."""
        r = self.reasons
        parts = [f"step {r.step} {self.action.value} {_triggers(r.triggers, self.observed)}"]
        if r.current_step_s is not None and r.target_step_s is not None:
            parts.append(f"L {r.current_step_s:.2f}->{r.target_step_s:.2f} s")
        elif r.target_step_s is not None:
            parts.append(f"L_target {r.target_step_s:.2f} s")
        if r.current_step_s is None:  # the current plan cannot run: it has no risk to show
            if r.target_risk_s:
                parts.append(f"node-loss risk {r.target_risk_s:.3g} s/step")
        elif r.current_risk_s or r.target_risk_s:
            parts.append(f"node-loss risk {r.current_risk_s:.3g}->{r.target_risk_s:.3g} s/step")
        if r.delta_l_s is not None:
            parts.append(f"ΔL={r.delta_l_s:.3g} s")
        if r.l_tran_s is not None:
            parts.append(f"L_tran={r.l_tran_s:.3g} s")
        if r.horizon_steps is not None:
            parts.append(f"H={r.horizon_steps:.3g}")
        if r.payback_steps is not None and math.isfinite(r.payback_steps):
            parts.append(f"payback={r.payback_steps:.3g} steps")
        if r.restart_s is not None:
            parts.append(f"restart={r.restart_s:.0f} s{_restart_terms(self.restart)}")
        if r.summary:
            parts.append(f"-- {r.summary}")
        return " ".join(parts) + f" ({self.source})"


def _restart_terms(rc: RestartCost | None) -> str:
    """`` (start-up 120 + load 250 + redo 90 s)``: a restart's terms that are not zero, so the
    log splits the estimate as ``simulate``'s table splits restart and lost time (redo)."""
    if rc is None:
        return ""
    terms = [f"{name} {v:.0f}" for name, v in (("start-up", rc.startup_s), ("load", rc.load_s),
                                                ("redo", rc.lost_s), ("save", rc.save_s))
             if round(v)]
    return f" ({' + '.join(terms)} s)" if len(terms) > 1 else ""


# triggers whose values the telemetry gave (a pool change, a drifting response length); a
# memory trigger is the cost model's prediction, an efficiency's drift the calibrator's fit to
# the telemetry's times, and the others carry no value
_OBSERVED = (TriggerKind.POOL_LOSS, TriggerKind.POOL_GAIN, TriggerKind.DRIFT)


def _source(t: Trigger, observed: str) -> str:
    """Where ``t``'s value came from: ``observed`` (the telemetry's source), ``estimated``
    (a prediction, or an efficiency fitted to the ``observed`` times), or "" (no value)."""
    if t.kind is TriggerKind.DRIFT and t.signal.startswith("eff."):
        return f"estimated from {observed} times" if observed else "estimated"
    if t.kind in _OBSERVED:
        return observed
    return "estimated" if t.kind is TriggerKind.MEMORY else ""


def _triggers(triggers: Sequence[Trigger], observed: str) -> str:
    """``[t1; t2]`` followed by the source of their values when they share one, or each
    trigger followed by its own when they differ (``_source``)."""
    if not triggers:
        return "[no trigger]"
    srcs = [_source(t, observed) for t in triggers]
    named = {x for x in srcs if x}
    if len(named) <= 1:
        tail = f" ({next(iter(named))})" if named else ""
        return "[" + "; ".join(t.describe() for t in triggers) + "]" + tail
    return "[" + "; ".join(t.describe() + (f" ({x})" if x else "")
                           for t, x in zip(triggers, srcs)) + "]"


class Controller:
    """Keeps one job on its best plan; call :meth:`on_boundary` at every safe boundary.

    ``job`` is the job as it starts (its pool and workload give the first plan unless ``plan``
    is given). The calibrator may come from a saved profile.
    """

    def __init__(self, job: JobSpec, plan: Plan | None = None, *,
                 config: ControlConfig | None = None, calibrator: Calibrator | None = None,
                 planner: PlanFn | None = None, transition: TransitionFn | None = None,
                 on_log: Callable[[str], None] | None = None):
        self.job = job
        self.config = config or ControlConfig()
        self.calibrator = calibrator or Calibrator(
            prior=Efficiencies(device=job.cluster.device.name))
        self.planner = planner or default_planner
        self.transition = transition or plan_transition
        self.on_log = on_log or log.info
        self.pool: tuple[int, ...] = job.pool.ids  # the pool the plan was last chosen for
        self._seen_pool: tuple[int, ...] = job.pool.ids  # at the last boundary
        # the length the first plan is made for is the length reference, as the pool it is
        # made for is the pool's: a first step far from it is a drift, not the new normal
        self.monitor = Monitor({"response_len": self.config.delta_len,
                                "eff.*": self.config.delta_eff},
                               {"response_len": float(job.workload.response_len_mean)})
        self.horizons = Horizons(self.config.horizon_alpha)
        self.pending: tuple[Trigger, ...] = ()
        self.steps_seen = 0
        self.stopped = False  # after a wait: the state on the GPUs is gone until a restart
        self._crash = ""      # why the job stopped, where it crashed (``on_failure``)
        self._observed = ""   # the source of the telemetry of this boundary
        # step -> its longest response, for the last ``length_window`` steps seen (a step
        # decided on again -- a pause, a mid-step loss, a crash -- keeps one entry: its max)
        self._recent_longest: dict[int, int] = {}
        self._mem_bound: tuple[object, float, float, Trigger | None] | None = None
        # this boundary's job at the longest response itself (no margin), and (pool, need) once
        # no plan fitted a need with the margin: the margin is then waived, not the job stopped
        self._bare: JobSpec | None = None
        self._capped: tuple[tuple[int, ...], int] | None = None
        if plan is None:
            w = job.workload
            now = self._job(job.pool.ids, w.response_len_mean, w.response_len_max)
            plan = self.planner(now, self._cost(now))
        self.plan: Plan = plan

    # ------------------------------------------------------------------ helpers
    def _job(self, pool: tuple[int, ...], mean: float, longest: float,
             margin: bool = True) -> JobSpec:
        m = 1.0 + (self.config.length_margin if margin else 0.0)
        w = self.job.workload.with_response_len(int(round(mean)), math.ceil(longest * m))
        return self.job.with_pool(GpuPool(self.job.cluster, pool)).with_workload(w)

    def _longest(self, tel: Telemetry) -> float:
        """The longest response of the last ``length_window`` steps: the noise envelope that
        memory must cover (planning for the last step alone flip-flops with noise)."""
        return max([tel.response_len_max, *self._recent_longest.values()])

    def _remember_longest(self, tel: Telemetry) -> None:
        """Enter ``tel``'s longest response in the window, one entry per step: the simulator
        and a framework decide again within a step (a pause, GPUs lost mid-step, an
        out-of-memory crash), and such repeats must not push older steps out of the window.
        A repeat keeps the larger of its step's lengths and counts as the latest step seen."""
        window = self._recent_longest
        prev = window.pop(tel.step, None)
        window[tel.step] = tel.response_len_max if prev is None else max(prev,
                                                                         tel.response_len_max)
        while len(window) > self.config.length_window:
            del window[next(iter(window))]

    def _cost(self, job: JobSpec) -> CostModel:
        return CostModel(job, self.calibrator.efficiencies(), self.calibrator.memory_scale())

    def _log(self, d: Decision) -> Decision:
        d = replace(d, observed=self._observed)
        self.on_log(d.log_line())
        return d

    # ------------------------------------------------------------------ learning
    def _learn(self, tel: Telemetry) -> dict[str, float]:
        """Calibrate from the step just measured; return each op class's share of its time.

        Memory is learned from every stage with a measured peak, timed or not: a framework may
        measure a stage's memory in a profiled run whose times it does not report. Times are
        learned from every stage with its wall time or with op-class times, or both."""
        self._remember_longest(tel)
        if not tel.latency_s and not tel.peak_mem_bytes and not tel.op_time_s:
            return {}
        if tel.transition_running:
            # the step shared its GPUs and links with a transition that moves state between
            # two plans: its times and peaks measure neither plan alone (and ``self.plan`` is
            # already the target), so the calibrator does not learn from them
            return {}
        if not self.pool or self.stopped:
            # no plan runs (the pool emptied, or the job stopped and waits for a restart):
            # these figures measure no plan on the controller's pool; nothing to learn
            return {}
        ran = self._job(self.pool, tel.response_len_mean, tel.response_len_max, margin=False)
        cost = CostModel(ran, self.calibrator.efficiencies())
        time_by_class: dict[str, float] = {}
        for sp in self.plan.stages:
            ops = tel.op_times(sp.stage)
            timed = sp.stage in tel.latency_s or bool(ops)
            if not timed and sp.stage not in tel.peak_mem_bytes:
                continue
            est = stage_estimate(cost, self.plan, sp.stage)
            if sp.stage in tel.peak_mem_bytes:
                kind = self.job.workflow.stage(sp.stage).kind
                self.calibrator.observe_memory(kind, est.peak_mem_bytes,
                                               tel.peak_mem_bytes[sp.stage])
            if not timed:
                continue
            # per-class times where the framework gives them, and the stage's wall time where it
            # does: it also holds work no op class times (Python, elementwise kernels)
            self.calibrator.observe_timed(est, ops)
            if sp.stage in tel.latency_s:
                self.calibrator.observe_stage(est, tel.latency_s[sp.stage])
            for c, t in est.time_by_class().items():
                time_by_class[c.value] = time_by_class.get(c.value, 0.0) + t
        if not time_by_class:
            return {}
        self.calibrator.next_step()
        self.steps_seen += 1
        total = sum(time_by_class.values()) or 1.0
        return {c: t / total for c, t in time_by_class.items()}

    def _signals(self, tel: Telemetry, shares: Mapping[str, float]) -> dict[str, float]:
        sig = {"response_len": float(tel.response_len_mean)}
        if self.steps_seen >= self.config.warmup_steps:
            eff = self.calibrator.efficiencies()
            spread = self.calibrator.relative_error()
            most = self.config.delta_eff / self.config.eff_z
            for name, share in shares.items():
                c = OpClass(name)
                if share >= self.config.eff_min_share and spread.get(c, math.inf) <= most:
                    sig[f"eff.{name}"] = eff[c]
        return sig

    def _reset(self, tel: Telemetry, signals: Mapping[str, float]) -> None:
        """After a replan (admitted or not, a restart included): every reference becomes its
        signal's current value -- each efficiency watched so far too, also at a boundary that
        brought no times (a second decision within a step, a resume) and so watches none.
        The next crossing of each is measured from here, so its interval for H_x starts here
        too (see :mod:`nereus.control.horizon`)."""
        now = {"response_len": float(tel.response_len_mean), **signals}
        eff = self.calibrator.efficiencies()
        for name in self.monitor.references:
            if name.startswith("eff.") and name not in now:
                now[name] = eff[OpClass(name[4:])]
        self.monitor = self.monitor.reset(now)
        self.horizons = self.horizons.reset(now, tel.step)

    def _memory_check(self, tel: Telemetry) -> tuple[bool, Trigger | None]:
        """Does the current plan fit the longest response it must plan for?

        Peaks grow with the longest response, so a length known to fit (or to fail) answers
        for all shorter (longer) ones; a new check runs at the next 5 % step above the need,
        and exactly at the need only when that step does not fit.
        """
        need = self._longest(tel) * (1.0 + self.config.length_margin)
        scale = tuple(sorted((k.value, round(v, 3))
                             for k, v in self.calibrator.memory_scale().items()))
        if self._mem_bound is None or self._mem_bound[0] != scale:
            self._mem_bound = (scale, 0.0, math.inf, None)
        _, fits_to, fails_from, trig = self._mem_bound
        if need <= fits_to:
            return True, None
        if need >= fails_from:
            if need == fails_from:
                return False, trig
            # known to fail, but the trigger's numbers are the need's of this boundary
            job = self._job(self.pool, min(tel.response_len_mean, need), need, margin=False)
            return False, self._memory_trigger(job, reprice(job, self._cost(job), self.plan))
        step = MEMORY_BUCKET ** math.ceil(math.log(need) / math.log(MEMORY_BUCKET))
        for longest in (step, need):
            job = self._job(self.pool, min(tel.response_len_mean, longest), longest,
                            margin=False)
            priced = reprice(job, self._cost(job), self.plan)
            if priced.fits:
                self._mem_bound = (scale, max(fits_to, longest), fails_from, trig)
                return True, None
        if self._capped is not None and self._capped[0] == tuple(tel.pool) \
                and need >= self._capped[1]:
            # no plan fits this need with the margin: the plan only has to fit the longest
            bare = self._job(tel.pool, tel.response_len_mean, self._longest(tel), margin=False)
            if reprice(bare, self._cost(bare), self.plan).fits:
                return True, None
        trig = self._memory_trigger(job, priced)
        self._mem_bound = (scale, fits_to, need, trig)
        return False, trig

    @staticmethod
    def _memory_trigger(job: JobSpec, priced: Priced) -> Trigger:
        """The urgent memory trigger of the current plan ``priced`` for ``job``, with its
        predicted peak against the limit."""
        limit = HEADROOM * job.cluster.device.memory_bytes
        peaks = {sp.stage: sp.peak_mem_bytes for sp in priced.plan.stages} if priced.plan else {}
        return memory_trigger(peaks, limit) or Trigger(
            TriggerKind.MEMORY, "memory", True, detail="; ".join(priced.problems))

    # ------------------------------------------------------------------ the boundary
    def on_boundary(self, tel: Telemetry) -> Decision:
        self._check(tel)
        with self._committed():
            return self._boundary(tel, self._learn(tel))

    def _check(self, tel: Telemetry) -> None:
        """Telemetry this job cannot have produced is refused before it changes anything (an
        InputError naming the telemetry's field): a pool the cluster cannot hold, a longest
        response the controller cannot plan memory for, a model-stage the workflow does not
        have (a misspelt name, whose times and peaks would be dropped without a word).
        An empty pool is valid (every GPU lost: the controller waits)."""
        if tel.pool:
            GpuPool(self.job.cluster, tel.pool)
        most, why = self._longest_allowed()
        if tel.response_len_max > most:
            raise InputError("telemetry.response_len_max",
                             f"a longest response of {tel.response_len_max} tokens {why}",
                             f"a longest response up to {most:,} tokens")
        names = [s.name for s in self.job.workflow.stages]
        for fld in ("latency_s", "peak_mem_bytes", "op_time_s"):
            for stage in getattr(tel, fld):
                if stage not in names:
                    raise InputError(f"telemetry.{fld}.{stage}",
                                     f"unknown model-stage {stage!r} for "
                                     f"{self.job.workflow.algo}"
                                     f"{self.job.workflow.absence(stage)}", names)

    def _longest_allowed(self) -> tuple[int, str]:
        """The longest response telemetry may report, and what bounds it: memory is planned
        for it plus ``length_margin`` within the workload's bound (``MAX_TOKENS``), and a
        prompt plus it must fit the model's context window where the model has one."""
        m = 1.0 + self.config.length_margin
        most = int(MAX_TOKENS / m)
        while most > 1 and math.ceil(most * m) > MAX_TOKENS:
            most -= 1
        why = (f"is longer than the controller can plan memory for: {most:,} plus the "
               f"{self.config.length_margin:.0%} margin reaches the workload's bound of "
               f"{MAX_TOKENS:,}")
        limit = self.job.model.max_position_embeddings
        prompt = self.job.workload.prompt_len
        if limit is not None and limit - prompt < most:
            most = max(0, limit - prompt)
            why = (f"does not fit {self.job.model.name}'s context window of {limit:,} tokens "
                   f"after a {prompt}-token prompt")
        return most, why

    @contextmanager
    def _committed(self) -> Iterator[None]:
        """Run a boundary whose state (the calibrator, the length window, H_x, references,
        pool counters, the memory bound) is kept only when it returns a decision: a boundary
        that raises leaves the controller as it was before it."""
        saved = dict(self.__dict__)
        window = dict(self._recent_longest)
        learned = self.calibrator.snapshot()
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            self._recent_longest = window
            self.calibrator.restore(learned)
            raise

    def _boundary(self, tel: Telemetry, shares: Mapping[str, float]) -> Decision:
        cfg = self.config
        step = tel.step
        self._observed = tel.source  # what the log line calls the triggers' values
        # H_pool learns from every change since the last boundary, also while a replan waits
        # for a running transition (the pool may change again meanwhile); the replan answers
        # the change since the pool it last planned for
        self._count_pool_changes(pool_triggers(self._seen_pool, tel.pool, self.plan.gpus()),
                                 step, emptied=not tel.pool)
        self._seen_pool = tel.pool
        triggers = pool_triggers(self.pool, tel.pool, self.plan.gpus())
        if not tel.pool:
            self.pool = ()
            self.stopped = True
            return self._log(Decision(Action.WAIT, None, reasons=Reasons(
                step, tuple(triggers), True, gamma=cfg.gamma,
                summary="no GPU left: wait for the pool to come back")))
        now = self._job(tel.pool, tel.response_len_mean, self._longest(tel))
        self._bare = self._job(tel.pool, tel.response_len_mean, self._longest(tel), margin=False)
        cost = self._cost(now)
        if self.stopped:
            return self._log(self._resume(step, tuple(triggers), now, cost, tel))
        survivors, lost, rebuilt = survive(self.plan, tel.pool, self.job.workflow)
        whole = survivors is not None and not rebuilt and all(
            len(a.replicas) == len(b.replicas) for a, b in zip(survivors.stages, self.plan.stages))
        broken = not whole
        if whole:
            fits, mem = self._memory_check(tel)
            if not fits:
                broken = True
                triggers.append(mem or Trigger(TriggerKind.MEMORY, "memory", True))
        signals = self._signals(tel, shares)
        self.monitor, drift = self.monitor.check(signals)
        triggers += drift
        self._count_crossings(drift, step)
        urgent = any(t.urgent for t in triggers)
        if not cfg.admission and not triggers:
            triggers.append(Trigger(TriggerKind.ALWAYS, "always", False))
        fresh = {t.signal for t in triggers}
        # a waiting pool change or memory violation is measured anew each boundary (GPUs that
        # came and went since are no change to answer; a plan that fits the window's longest
        # response now has no violation, and an urgent trigger listed but not weighed as
        # urgent would contradict ``Reasons.urgent``)
        pending = tuple(t for t in self.pending if t.kind is TriggerKind.ONWARD or (
            t.signal not in fresh and t.kind not in (TriggerKind.POOL_LOSS, TriggerKind.POOL_GAIN,
                                                     TriggerKind.MEMORY))) + tuple(triggers)
        if not pending:
            self.pending = ()
            return self._log(Decision(Action.KEEP, self.plan, reasons=Reasons(
                step, (), False, gamma=cfg.gamma)))
        lost_gpus = any(t.kind is TriggerKind.POOL_LOSS for t in triggers)
        # a replan starts when the running transition ends (its target is the plan that
        # memory is then checked against), or at once when GPUs are lost
        if tel.transition_running and not lost_gpus:
            self.pending = pending
            after = "; an urgent trigger waits with it" if any(t.urgent for t in pending) \
                else ""
            return self._log(Decision(Action.KEEP, self.plan, reasons=Reasons(
                step, pending, False, gamma=cfg.gamma,
                summary=f"deferred: a transition is still running{after}")))
        self.pending = ()
        decision = self._replan(step, pending, urgent, now, cost, broken, survivors, lost,
                                rebuilt)
        self._reset(tel, signals)
        self.pool = tel.pool
        self._adopt(decision)
        return self._log(decision)

    def _count_crossings(self, triggers: Sequence[Trigger], step: int) -> None:
        """H_x learns from every threshold crossing of a drifting x; a deferred trigger
        re-listed while a transition runs crossed already (its reference waits for the
        replan)."""
        waiting = {t.signal for t in self.pending if t.kind is not TriggerKind.ONWARD}
        for sig in sorted({t.signal for t in triggers if t.kind is TriggerKind.DRIFT}
                          - waiting):
            self.horizons = self.horizons.crossed(sig, step)

    def _count_pool_changes(self, changes: Sequence[Trigger], step: int, *,
                            emptied: bool = False) -> None:
        """A change of the pool since the last boundary is a crossing of "pool"; a loss also
        one of the losses alone (the hazard ``_loss_risk_s`` prices), unless it ``emptied``
        the pool: a loss of every GPU takes every plan's state, spread over nodes or not, so
        it says nothing of how often a node takes a last copy that another could keep."""
        if changes:
            self.horizons = self.horizons.crossed("pool", step)
        if not emptied and any(t.kind is TriggerKind.POOL_LOSS for t in changes):
            self.horizons = self.horizons.crossed(LOSS_SIGNAL, step)

    def _adopt(self, decision: Decision) -> None:
        if decision.action is Action.WAIT:
            self.stopped = True
        elif decision.plan is not None and decision.action in (Action.MOVE, Action.RESTART):
            self.plan = decision.plan
            self.stopped = False
            self._mem_bound = None

    def on_failure(self, tel: Telemetry, out_of_memory: bool = False) -> Decision:
        """The job crashed (out of memory, a lost process): restart from the checkpoint.

        ``tel`` describes the step that crashed: its lengths, and the peaks of the stages that
        measured one. Its longest response enters the window memory is planned for, so the
        restart's plan holds it. ``out_of_memory``: where the plan that crashed was estimated
        to hold that response, the estimate was short; each of its stages that may have run
        out (no measured peak, and every stage before it in the step measured one: a stage
        after an unmeasured one never ran) is learned to need at least the whole device there
        (a lower bound: the stage that ran out measured none), so the restart plans for more
        memory."""
        self._check(tel)
        with self._committed():
            shares = self._learn(tel)  # the plan ran until it crashed
            if out_of_memory and not self.stopped and self.pool and tel.pool \
                    and not tel.transition_running:  # which plan ran out is not known then
                self._learn_oom(tel)
            self.stopped = True
            # what the restart's log line says it restarts after
            self._crash = (f"out of memory at step {tel.step} (longest response "
                           f"{tel.response_len_max} tokens)" if out_of_memory
                           else f"a crash at step {tel.step}")
            return self._boundary(tel, shares)

    def _learn_oom(self, tel: Telemetry) -> None:
        """Memory evidence from an out-of-memory crash of ``self.plan`` at ``tel``'s lengths."""
        ran = self._job(self.pool or tel.pool, tel.response_len_mean, tel.response_len_max,
                        margin=False)
        cap = ran.cluster.device.memory_bytes
        scaled = reprice(ran, self._cost(ran), self.plan).plan
        if scaled is None or any(sp.peak_mem_bytes > HEADROOM * cap for sp in scaled.stages):
            return  # the estimate saw it coming: the longest response alone is the evidence
        raw = CostModel(ran, self.calibrator.efficiencies())
        # one sample per kind of stage, from its fullest stage that may have run out: which
        # stage ran out is unknown, and the fullest needs the least scaling to fill the device
        fullest: dict[StageKind, int] = {}
        suspects = _may_have_run_out(self.job.workflow, self.plan, tel.peak_mem_bytes)
        for sp in self.plan.stages:
            if sp.stage not in suspects:
                continue
            est = stage_estimate(raw, self.plan, sp.stage).peak_mem_bytes
            kind = self.job.workflow.stage(sp.stage).kind
            if 0 < est < cap and est > fullest.get(kind, 0):
                fullest[kind] = est
        for kind, est in fullest.items():
            self.calibrator.observe_memory(kind, est, cap)

    def _resume(self, step: int, triggers: tuple[Trigger, ...], now: JobSpec, cost: CostModel,
                tel: Telemetry) -> Decision:
        """GPUs are back after a wait: restart from the checkpoint on the best plan."""
        base = Reasons(step, triggers, True, None, self.config.gamma)
        best, why_none, note = self._best(now, cost)
        why = f"restarting after {self._crash}" if self._crash else \
            "restarting after the job stopped"
        self._crash = ""
        decision = _noted(self._restart(base, now, best, why_none, after_failure=True,
                                        why=why), best, note)
        self._reset(tel, {})
        self.pending = ()  # replanned now: what waited from before the stop is answered
        self.pool = tel.pool
        self._adopt(decision)
        return decision

    def _best(self, now: JobSpec, cost: CostModel) -> tuple[Priced | None, str, str]:
        """S*, or why there is none, and a note when S* is the spread plan (see
        :meth:`_loss_risk_s`)."""
        best, why_none = self._plan_for(now, cost)
        capped = ""
        bare = self._bare
        if best is None and bare is not None and bare.pool == now.pool \
                and bare.workload.response_len_max < now.workload.response_len_max:
            bare_cost = self._cost(bare)
            best, _ = self._plan_for(bare, bare_cost)
            if best is None:
                return None, why_none, ""
            self._capped = (now.pool.ids, now.workload.response_len_max)
            now, cost = bare, bare_cost
            capped = (f"no plan fits the longest response plus the "
                      f"{self.config.length_margin:.0%} margin: planned for the longest itself "
                      f"({bare.workload.response_len_max} tokens)")
        if best is None:
            return None, why_none, ""
        risk = self._loss_risk_s(now, best.plan, best.step_s)
        if risk <= 0.0:
            return best, "", capped
        try:
            alt = reprice(now, cost, self.planner(now, cost, spread=True))
        except InfeasibleError:
            return best, "", capped
        alt_risk = self._loss_risk_s(now, alt.plan, alt.step_s)
        if not alt.fits or alt.step_s + alt_risk >= best.step_s + risk:
            return best, "", capped
        note = (f"S* spreads replicas over nodes: {alt.step_s:.4g} s/step against "
                f"{best.step_s:.4g} s plus {risk:.3g} s/step of expected restarts from a last "
                f"copy lost with a node (a loss every {self.horizons.of(LOSS_SIGNAL):.3g} steps)")
        return alt, "", "; ".join(n for n in (capped, note) if n)

    def _plan_for(self, job: JobSpec, cost: CostModel) -> tuple[Priced | None, str]:
        """The planner's best plan for ``job`` priced, or None and why nothing fits."""
        try:
            best = reprice(job, cost, self.planner(job, cost))
        except InfeasibleError as e:
            return None, str(e)
        if not best.fits:
            return None, "; ".join(best.problems)
        return best, ""

    def _loss_risk_s(self, now: JobSpec, plan: Plan | None, step_s: float) -> float:
        """Expected seconds per step that ``plan`` loses to restarts after a node takes the last
        copy of a model-stage's state: (1 / H_loss) x (share of its nodes whose loss does
        that) x (restart from checkpoint after a failure). Zero until two pool losses have
        shown how often they come, on a pool of one node, or with ``spread_on_churn`` off.
        Estimated."""
        if not self.config.spread_on_churn or plan is None \
                or LOSS_SIGNAL not in self.horizons.ema or not spans_nodes(now.pool):
            return 0.0
        share = exposed_fraction(plan, now.cluster, now.workflow)
        if share <= 0.0:
            return 0.0
        rc = restart_cost(now, self.config.restart, step_s=step_s, after_failure=True)
        return share * rc.seconds / max(1.0, self.horizons.of(LOSS_SIGNAL))

    def _replan(self, step: int, triggers: tuple[Trigger, ...], urgent: bool, now: JobSpec,
                cost: CostModel, broken: bool, survivors: Plan | None,
                lost: tuple[str, ...], rebuilt: tuple[str, ...] = ()) -> Decision:
        cfg = self.config
        # the smallest H_x over every trigger: a memory violation is driven by the lengths
        signals = ["response_len" if t.kind is TriggerKind.MEMORY else t.signal
                   for t in triggers if t.kind is not TriggerKind.ALWAYS]
        horizon = self.horizons.smallest(signals) if signals else 1.0
        cur_s = None if broken else reprice(now, cost, self.plan).step_s
        cur_risk = 0.0 if cur_s is None else self._loss_risk_s(now, self.plan, cur_s)
        base = Reasons(step, triggers, urgent, horizon, cfg.gamma, cur_s,
                       current_risk_s=cur_risk)
        best, why_none, note = self._best(now, cost)
        return _noted(self._decide(step, triggers, urgent, now, cost, survivors, lost, horizon,
                                   cur_s, base, best, why_none, rebuilt), best, note)

    def _decide(self, step: int, triggers: tuple[Trigger, ...], urgent: bool, now: JobSpec,
                cost: CostModel, survivors: Plan | None, lost: tuple[str, ...], horizon: float,
                cur_s: float | None, base: Reasons, best: Priced | None, why_none: str,
                rebuilt: tuple[str, ...] = ()) -> Decision:
        cfg = self.config
        if survivors is None:  # the last copy of some model's state is gone
            return self._restart(base, now, best, why_none, after_failure=True,
                                 why=f"last copy of {', '.join(lost)} lost with the GPUs")
        partial = survivors
        if rebuilt:
            # every replica of a stage made again without a restart is gone (a frozen
            # model's weights read again, a copy of θ from its training stage): the move
            # makes it where its target puts it
            if best is None:
                return self._restart(base, now, best, why_none, after_failure=False,
                                     why=f"no plan to rebuild {', '.join(rebuilt)} on")
            assert best.plan is not None  # _best returns S* only where it fits
            survivors = fill(partial, best.plan)

        def option(label: str, plan: Plan, step_s: float) -> Option:
            return Option(label, plan, step_s, self._loss_risk_s(now, plan, step_s))

        cur_risk = base.current_risk_s
        cur_l = None if cur_s is None else cur_s + cur_risk  # what ΔL compares
        transition_job = self.job.with_pool(now.pool)
        eff = self.calibrator.efficiencies()
        schedules: dict[int, Schedule] = {}  # id(plan) -> its schedule, computed once
        # the moves that carry no state, which the urgent path can always fall back on
        source_specs = rebatched(cost, survivors, every_stage=False)
        in_place: list[Option] = []
        if urgent:
            for label, specs in (("re-batched in place", rebatched(cost, survivors)),
                                 ("survivors as they are", source_specs)):
                p = price(now, cost, specs)
                if p.fits:
                    assert p.plan is not None  # a plan that fits is one
                    in_place.append(replace(option(label, p.plan, p.step_s), in_place=True))
        # at most max_tries schedules a replan, each counted where it is priced. On the urgent
        # path S*'s placements leave room for the moves in place, and every target leaves
        # room for the move on from a stopgap to S* (ONWARD below)
        onward_kept = int(urgent and cfg.restart_moves and best is not None and cfg.max_tries > 1)
        held = min(onward_kept + len(in_place), cfg.max_tries - 1)  # S* is always priced
        priced = 0

        def schedule_for(plan: Plan) -> Schedule | None:
            """The schedule from the surviving units to ``plan``; None once the budget is
            spent (a plan priced before still has its schedule)."""
            nonlocal priced
            got = schedules.get(id(plan))
            if got is None:
                if priced >= cfg.max_tries - held:
                    return None
                priced += 1
                got = self.transition(transition_job, fill(partial, plan), plan, eff)
                if rebuilt and got.feasible:
                    extra = rebuild_s(now, plan, rebuilt, cfg.restart)
                    why = (f"make {', '.join(rebuilt)} again through storage: "
                           f"{extra:.3g} s (estimated)")
                    got = replace(got, estimated_s=got.estimated_s + extra,
                                  reason="; ".join(r for r in (got.reason, why) if r))
                schedules[id(plan)] = got
            return got

        options: list[Option] = []
        if best is not None:
            assert best.plan is not None  # _best returns S* only where it fits
            s_star = option("best", best.plan, best.step_s)
            # the near placements' transitions are priced up front only where S* may be moved
            # to at all (select prices lazily, and gives up on a target that is not faster or
            # under γ = 0)
            may_move = unpriced_refusal(cur_l, s_star.expected_s, urgent=urgent,
                                        gamma=cfg.gamma, profitability=cfg.admission) is None
            options += self._nearest(s_star, now, cost, survivors, option,
                                     schedule_for if may_move else None)
        held = onward_kept
        star = options[0].plan if options else None  # S*, placed where its move is cheapest
        if best is not None:
            assert best.plan is not None  # as above
            for label, specs in hybrids(now, survivors, source_specs, best.plan):
                p = price(now, cost, specs)
                if p.fits:
                    assert p.plan is not None  # a plan that fits is one
                    options.append(option(label, p.plan, p.step_s))
        for opt in in_place:
            # one that another option already is moves no state either: ``select`` prices
            # it first as well
            stages = opt.plan.to_dict()["stages"]
            twin = next((i for i, o in enumerate(options)
                         if o.plan.to_dict()["stages"] == stages), None)
            if twin is None:
                options.append(opt)
            else:
                options[twin] = replace(options[twin], in_place=True)

        def schedule_of(opt: Option) -> Schedule | None:
            return schedule_for(opt.plan)

        idx, sched, verdicts = select(options, cur_l, urgent=urgent, gamma=cfg.gamma,
                                      horizon_steps=horizon, schedule_of=schedule_of,
                                      profitability=cfg.admission, max_tries=cfg.max_tries)
        first = verdicts[0] if verdicts else None
        restart = None
        if cfg.admission and cfg.restart_moves and not urgent and best is not None \
                and cur_s is not None and first is not None and first.feasible is False:
            restart = self._restart_move(step, triggers, horizon, cur_s, cur_risk, options[0],
                                         now, verdicts)
        if urgent and cfg.restart_moves and best is not None:
            # a planned restart into S* against the best feasible move, over the horizon
            h = max(1.0, horizon)
            s0 = options[0]  # S*, placed where its move is cheapest: what the restart runs
            best_l = s0.expected_s
            rc = restart_cost(now, cfg.restart, step_s=s0.step_s, after_failure=False)
            move_score = math.inf
            if idx is not None and sched is not None:
                opt = options[idx]
                move_score = sched.estimated_s + h * opt.expected_s
                if opt.plan is not star and h > 1.0 and priced < cfg.max_tries:
                    assert star is not None  # best is not None: options[0] is S*
                    # or move on from there to S* at the next boundary (see ONWARD below)
                    priced += 1
                    onward = self.transition(transition_job, opt.plan, star, eff)
                    if onward.feasible:
                        move_score = min(move_score, sched.estimated_s + opt.expected_s
                                         + onward.estimated_s + (h - 1.0) * best_l)
            if rc.seconds + h * best_l < move_score and idx is not None:
                r = Reasons(step, triggers, True, horizon, cfg.gamma, cur_s, s0.step_s, None,
                            None, None, rc.seconds, "planned checkpoint/restart", verdicts,
                            "restart + H·(L_step + risk) = "
                            f"{rc.seconds + h * best_l:.4g} s beats the "
                            f"best feasible move's {move_score:.4g} s over H = {h:.3g}",
                            cur_risk, s0.risk_s)
                return Decision(Action.RESTART, s0.plan, None, rc, r)
        if idx is not None and sched is not None:
            opt = options[idx]
            v = next(v for v in verdicts if v.admitted)
            gain = (v.delta_l_s or 0.0) * horizon - sched.estimated_s
            if restart is not None and restart.reasons.delta_l_s is not None and \
                    restart.reasons.delta_l_s * horizon - (restart.reasons.restart_s or 0.0) > gain:
                return restart
            r = Reasons(step, triggers, urgent, horizon, cfg.gamma, cur_s, opt.step_s,
                        v.delta_l_s, sched.estimated_s, v.payback_steps, None, opt.label,
                        verdicts, v.why, cur_risk, opt.risk_s)
            if urgent and best is not None and opt.plan is not star:
                # the urgent path took what could run now; S* is priced again (under Eq. 2,
                # over the horizon of what drove this move) at the next boundary
                driver = "pool" if any(t.kind in (TriggerKind.POOL_LOSS, TriggerKind.POOL_GAIN)
                                       for t in triggers if t.urgent) else "response_len"
                self.pending = (Trigger(TriggerKind.ONWARD, driver, False,
                                        detail=f"after the urgent move to {opt.label}"),)
            return Decision(Action.MOVE, opt.plan, sched, None, r)
        if restart is not None:
            return restart
        if urgent:
            why = "no feasible move" if options else f"no plan fits: {why_none}"
            # every model-stage keeps an intact copy (``survivors``): it is saved, not redone
            return self._restart(base, now, best, why_none, after_failure=False, why=why,
                                 verdicts=verdicts)
        summary = (f"keep: best target {_short(first.why)}" if first else
                   f"keep: no target ({why_none})" if best is None else "keep")
        # the target the verdicts speak of: S* placed where its move is cheapest
        r = Reasons(step, triggers, urgent, horizon, cfg.gamma, cur_s,
                    options[0].step_s if options else None,
                    first.delta_l_s if first else None,
                    first.l_tran_s if first and math.isfinite(first.l_tran_s) else None,
                    first.payback_steps if first else None, None, "", verdicts, summary,
                    cur_risk, first.risk_s if first else 0.0)
        return Decision(Action.KEEP, self.plan, None, None, r)

    def _nearest(self, best: Option, now: JobSpec, cost: CostModel, survivors: Plan,
                 option: Callable[[str, Plan, float], Option],
                 schedule_for: Callable[[Plan], Schedule | None] | None) -> list[Option]:
        """S* and its placements near the surviving units (``placed_near``): the one of them
        with the cheapest feasible transition among those no slower than S* comes first, as
        the target; a slower one follows as a fallback (a slower target with a cheaper
        transition, which ``select`` tries only if S* is rejected). Without ``schedule_for``
        (no move to S* can be admitted) nothing is priced and S* stays first."""
        # placed_near prices them with ``cost``; as for the hybrids, only a placement that
        # fits (memory, pool) is an option
        fit = [p for p in placed_near(now, cost, best.plan, survivors)
               if not problems(now, cost, p)]
        nears = [option(f"best, placed near the current GPUs ({k})", p, p.step_latency_s)
                 for k, p in enumerate(fit, 1)]
        limit = best.expected_s * (1 + SAME_STEP)
        same = [best] + [o for o in nears if o.expected_s <= limit]
        slower = [o for o in nears if o.expected_s > limit]
        if len(same) > 1 and schedule_for is not None:
            # the placements the replan's budget prices (S* first: it always is)
            scheds = {id(o): got for o in same if (got := schedule_for(o.plan)) is not None}
            first = cheapest_to_reach([o for o in same if id(o) in scheds],
                                      lambda o: scheds[id(o)], lambda o: o.expected_s)
            same = [first] + [o for o in same if o is not first]
        return same + slower

    def _restart_move(self, step: int, triggers: tuple[Trigger, ...], horizon: float,
                      cur_s: float, cur_risk: float, best: Option, now: JobSpec,
                      verdicts: tuple[Verdict, ...]) -> Decision | None:
        """A planned checkpoint/restart into S* when no transition to it can run (an extension
        of §4.3: the state moves through storage), admitted by the same Eq. 2."""
        cfg = self.config
        rc = restart_cost(now, cfg.restart, step_s=best.step_s, after_failure=False)
        delta = cur_s + cur_risk - best.expected_s
        if not profitable(rc.seconds, delta, cfg.gamma, horizon):
            return None
        pb = payback_steps(rc.seconds, delta)
        r = Reasons(step, triggers, False, horizon, cfg.gamma, cur_s, best.step_s, delta,
                    None, pb, rc.seconds, "planned checkpoint/restart", verdicts,
                    f"no feasible transition to the best target; a restart repays in {pb:.3g} "
                    f"steps <= γ·H = {cfg.gamma * horizon:.3g}", cur_risk, best.risk_s)
        return Decision(Action.RESTART, best.plan, None, rc, r)

    def _restart(self, base: Reasons, now: JobSpec, best: Priced | None, why_none: str, *,
                 after_failure: bool, why: str, verdicts: tuple[Verdict, ...] = ()) -> Decision:
        if best is None:
            r = Reasons(base.step, base.triggers, True, base.horizon_steps, base.gamma,
                        base.current_step_s, verdicts=verdicts,
                        summary=f"{why}; no plan fits the pool ({why_none}): wait")
            return Decision(Action.WAIT, None, reasons=r)
        cost = restart_cost(now, self.config.restart, step_s=best.step_s,
                            after_failure=after_failure)
        r = Reasons(base.step, base.triggers, True, base.horizon_steps, base.gamma,
                    base.current_step_s, best.step_s, None, None, None, cost.seconds,
                    "checkpoint/restart", verdicts, f"{why}: checkpoint/restart")
        return Decision(Action.RESTART, best.plan, None, cost, r)


def _noted(decision: Decision, best: Priced | None, note: str) -> Decision:
    """``decision`` with ``note`` added to its summary when it runs S* (``best``), as the
    search placed it or near the current GPUs."""
    if not note or best is None or decision.plan is None:
        return decision
    assert best.plan is not None  # _best returns S* only where it fits
    if [sp.candidate for sp in decision.plan.stages] != \
            [sp.candidate for sp in best.plan.stages]:
        return decision
    r = decision.reasons
    return replace(decision, reasons=replace(r, summary=f"{r.summary}; {note}" if r.summary
                                             else note))


def _short(text: str, limit: int = 160) -> str:
    """The first clause of a long reason (the schedule's reasons list every GPU)."""
    head = text.split("; ")[0]
    return head if len(head) <= limit else head[:limit - 3] + "..."


def _may_have_run_out(workflow: Workflow, plan: Plan, measured: Mapping[str, int]
                      ) -> set[str]:
    """The stages of ``plan`` that may have run out of memory in a step that crashed, given the
    stages that ``measured`` a peak: those with none whose every earlier stage in the step's
    execution order (the overlap graph of the plan's groups) measured one. A stage after an
    unmeasured one never ran: the crash ended the step first."""
    groups = plan.all_groups()
    names = [s.stage for s in plan.stages]
    graph = overlap_graph(workflow, groups, dict.fromkeys(names, 0.0), 0.0)
    return {n for n in names if n not in measured
            and all(a in measured for a in nx.ancestors(graph, n) if a in names)}
