"""A trace-driven job simulator: each policy runs the same steps, meeting the same events.

Per step, a policy's job: hands the last step's telemetry to the policy and carries out its
answer -- a move costs the transition schedule's makespan under the hidden efficiencies (times
noise; the oracle's nothing), and a move whose state no GPU of the pool holds any more (every
replica of a training stage gone: ``survive``) is a restart after a failure, the oracle's too;
a restart costs start-up, the checkpoint load and, after a failure, the steps since the
last checkpoint done again on the plan and GPUs it restarts on -- then runs the step (ground
truth: ``Truth``). Every ``checkpoint_interval_steps`` steps it writes the checkpoint that a
failure restarts from, and waits for the write (``checkpoint_write_s``, the formula a planned
restart's save uses): the same for every policy, since it depends on the pool, not the plan.
If a GPU the plan uses leaves the pool during the step, the step is lost up to that moment and
the policy decides again. An empty pool pauses the job: the state on its GPUs is gone, so it
restarts from the checkpoint when GPUs return. Every number here is simulated.

Progress-aligned replay: the availability trace is a function of wall-clock time, but policies
run at different speeds, and a few seconds' difference decides which 5-minute outages a job
falls into -- luck that otherwise swamps the policies' differences. So every policy meets each
change at the same point of training progress: trace time is mapped to steps once, by a
nominal clock (each step as long as the best full-pool plan takes under the true efficiencies)
that stops while the pool is empty (``align``). Restarts and transitions take a policy's own
time but do not move the events.

Throughput is response tokens per second of time the job held GPUs (paused time -- an empty or
unusable pool -- is reported apart and is the same for every policy; a policy that waits on a
pool some plan fits holds its GPUs, and that time counts as lost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from nereus.control.controller import Action
from nereus.control.restart import RestartParams, checkpoint_write_s, restart_cost
from nereus.control.targets import fill, rebuild_s, survive
from nereus.control.telemetry import Telemetry
from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError, InputError, count
from nereus.plan.overlap import overlap_graph
from nereus.plan.search import best_plan
from nereus.plan.types import Plan, stage_estimate
from nereus.sim.policies import Act, Policy
from nereus.sim.traces import Availability, LengthTrace
from nereus.sim.truth import Truth, same_layouts
from nereus.spec.cluster import format_gpus
from nereus.spec.workflow import Workflow

OOM_LOST_FRACTION = 0.5  # assumption: an out-of-memory crash loses half a step on average
OOM_TRIES = 5  # out-of-memory crashes of one step before the run stops: no plan fits it


@dataclass(frozen=True)
class Event:
    step: int
    time_s: float
    kind: str          # move, restart, wait, loss, oom
    seconds: float     # time the event cost (simulated)
    detail: str = ""


@dataclass(frozen=True)
class StepRow:
    policy: str
    step: int
    end_s: float             # simulated wall clock when the step ended
    step_s: float            # the step itself
    transition_s: float      # transitions before it (since the previous step)
    restart_s: float         # restarts before it
    lost_s: float            # work lost to failures (and waits holding GPUs) before it
    paused_s: float          # time without GPUs before it
    pool_gpus: int           # the pool when the step ended
    plan_gpus: int
    response_len_mean: float
    tokens: float
    calib_error: float | None = None   # mean |predicted - true| / true over stages (nereus)
    checkpoint_s: float = 0.0          # the periodic checkpoint written after the step
    # moves before it (its "move" events): the oracle's cost nothing, so transition_s alone
    # cannot show them, and summed they are the table's transitions
    transitions: int = 0

    @property
    def busy_s(self) -> float:
        """The step with the transitions, restarts and lost work before it and the checkpoint
        written after it: what ``PolicyResult.mean_step_s`` averages (pauses excepted)."""
        return self.step_s + self.transition_s + self.restart_s + self.lost_s + self.checkpoint_s


@dataclass(frozen=True)
class PolicyResult:
    name: str
    rows: tuple[StepRow, ...]
    events: tuple[Event, ...]

    @property
    def total_s(self) -> float:
        return self.rows[-1].end_s if self.rows else 0.0

    @property
    def paused_s(self) -> float:
        return sum(r.paused_s for r in self.rows)

    @property
    def busy_s(self) -> float:
        return self.total_s - self.paused_s

    @property
    def tokens(self) -> float:
        return sum(r.tokens for r in self.rows)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def mean_step_s(self) -> float:
        """Mean wall-clock time per step, pauses excepted: the step itself plus the
        transitions, restarts, lost work (waits holding GPUs included) and periodic checkpoint
        writes around it (``busy_s`` over the steps)."""
        return self.busy_s / len(self.rows) if self.rows else 0.0

    @property
    def transitions(self) -> int:
        return sum(1 for e in self.events if e.kind == "move")

    @property
    def transition_s(self) -> float:
        return sum(r.transition_s for r in self.rows)

    @property
    def restarts(self) -> int:
        return sum(1 for e in self.events if e.kind == "restart")

    @property
    def restart_s(self) -> float:
        return sum(r.restart_s for r in self.rows)

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s for r in self.rows)

    @property
    def checkpoint_s(self) -> float:
        return sum(r.checkpoint_s for r in self.rows)

    def calib_error_at(self, step: int) -> float | None:
        for r in self.rows:
            if r.step == step:
                return r.calib_error
        return None

    def summary(self) -> dict[str, float | int]:
        return {"tokens_per_s": self.tokens_per_s, "mean_step_s": self.mean_step_s,
                "transitions": self.transitions, "transition_s": self.transition_s,
                "restarts": self.restarts, "restart_s": self.restart_s, "lost_s": self.lost_s,
                "checkpoint_s": self.checkpoint_s,
                "paused_s": self.paused_s, "total_s": self.total_s, "steps": len(self.rows)}


@dataclass(frozen=True)
class SimResult:
    scenario: str
    results: Mapping[str, PolicyResult]
    notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StepEvents:
    """What the pool does around one step, on the nominal clock.

    ``pause_s``: time with an empty pool before the step; ``pool``: the pool at its start;
    ``changes``: (fraction of the step, pause before it, new pool) for each change inside it
    (a pause inside the step empties the pool for that long, then it becomes the new pool).
    """

    pause_s: float
    pool: tuple[int, ...]
    changes: tuple[tuple[float, float, tuple[int, ...]], ...] = ()


def align(av: Availability, nominal: Sequence[float],
          usable: Callable[[tuple[int, ...]], bool] = bool) -> list[StepEvents]:
    """Map the trace onto steps of ``nominal`` seconds; a pool that is not ``usable`` (no plan
    fits it) counts as empty: the job waits it out."""

    def at(t: float) -> tuple[int, ...]:
        p = av.at(t)
        return p if p and usable(p) else ()

    def resume(t: float) -> float:
        """The first time >= t with a usable pool."""
        while not at(t):
            nxt = av.next_change(t)
            if nxt is None:
                raise InputError("availability", f"from {t:.0f} s on the pool is empty or "
                                 "fits no plan, and it never changes again",
                                 "a trace that gives usable GPUs again")
            t = nxt
        return t

    out: list[StepEvents] = []
    t = 0.0
    for length in nominal:
        t0 = resume(t)
        pause, t = t0 - t, t0
        pool = at(t)
        changes: list[tuple[float, float, tuple[int, ...]]] = []
        done = 0.0
        while True:
            nxt = av.next_change(t)
            if nxt is None or nxt >= t + (length - done):
                t += length - done
                break
            done += nxt - t
            t = nxt
            gap = 0.0
            if not at(t):
                back = resume(t)
                gap, t = back - t, back
            new = at(t)
            if gap > 0 or new != (changes[-1][2] if changes else pool):
                changes.append((done / length, gap, new))
        out.append(StepEvents(pause, pool, tuple(changes)))
    return out


class _Runner:
    """One policy's job moving through the steps."""

    def __init__(self, policy: Policy, sim: Simulator):
        self.p = policy
        self.sim = sim
        self.t = 0.0
        self.plan: Plan | None = None
        self.tel: Telemetry | None = None
        self.since_ckpt: list[int] = []  # steps done since the last checkpoint
        self.rows: list[StepRow] = []
        self.events: list[Event] = []
        self._acc = {"transition_s": 0.0, "restart_s": 0.0, "lost_s": 0.0, "paused_s": 0.0}
        self._moves = 0  # "move" events since the last row (StepRow.transitions)

    # ---- helpers ----
    def _telemetry(self, k: int, pool: tuple[int, ...]) -> Telemetry:
        if self.tel is not None:
            t = self.tel
            return Telemetry(t.step, t.response_len_mean, t.response_len_max, pool,
                             t.latency_s, t.peak_mem_bytes, source=t.source)
        mean, longest = self.sim.lengths.at(k)
        return Telemetry(max(0, k - 1), mean, longest, pool, source="simulated")

    def _consumed(self) -> None:
        """The policy has learned from the last step; later boundaries repeat no measurement."""
        t = self.tel
        if t is not None and (t.latency_s or t.peak_mem_bytes):
            self.tel = Telemetry(t.step, t.response_len_mean, t.response_len_max, t.pool,
                                 source=t.source)

    def _pause(self, k: int, seconds: float, why: str, held: bool = False) -> None:
        """The pool is empty for ``seconds``: the policy hears of it, the job stops.

        ``held``: the pool was not empty -- a plan fits it, the policy found none -- so the job
        held its GPUs all along: the time counts as lost, not paused (paused time is the same
        for every policy and stays out of tokens/s)."""
        upcoming = (k, *self.sim.lengths.at(k))
        self.p.decide(self._telemetry(k, ()), upcoming)
        self._consumed()
        self.events.append(Event(k, self.t, "wait", seconds, why))
        self._acc["lost_s" if held else "paused_s"] += seconds
        self.t += seconds

    def _restart(self, k: int, act: Act, pool: tuple[int, ...]) -> None:
        sim = self.sim
        job = sim.truth.job_at(pool, *sim.lengths.at(k))
        # start-up, load and (planned) save by the controller's own formula; the redone work
        # is the truth's, step by step
        rc = restart_cost(job, sim.restart, after_failure=act.after_failure, lost_steps=0,
                          source="simulated")
        secs = rc.startup_s + rc.load_s + rc.save_s
        lost = self._redo_s(act.plan, pool) if act.after_failure else 0.0
        if not act.after_failure:
            # a planned restart writes a checkpoint of this very state: nothing before it is
            # at risk any more (after a failure the redone work is unsaved again: it stays)
            self.since_ckpt.clear()
        self._acc["restart_s"] += secs
        self._acc["lost_s"] += lost
        self.t += secs + lost
        why = act.decision.reasons.summary if act.decision else ""
        self.events.append(Event(k, self.t, "restart", secs + lost,
                                 why or ("after a failure" if act.after_failure else "planned")))
        self.plan = act.plan

    def _redo_s(self, plan: Plan | None, pool: tuple[int, ...]) -> float:
        """Seconds to do the steps since the last checkpoint again on ``plan`` and ``pool``
        (what the job restarts on: after a loss, fewer GPUs than ran them), each at its own
        lengths."""
        if not self.since_ckpt:
            return 0.0
        if plan is None:
            raise RuntimeError(f"{self.p.name} restarted without a plan")
        return sum(self.sim.truth.run_step(plan, pool, j, *self.sim.lengths.at(j))[0]
                   for j in self.since_ckpt)

    def _rebuild_s(self, k: int, plan: Plan, pool: tuple[int, ...],
                   rebuilt: tuple[str, ...]) -> float:
        """Seconds to make ``rebuilt`` again on ``plan`` through storage (a frozen model's
        weights read again, a copy of θ from its training stage: the controller's formula,
        ``rebuild_s``) times the step's noise on it."""
        sim = self.sim
        job = sim.truth.job_at(pool, *sim.lengths.at(k))
        return rebuild_s(job, plan, rebuilt, sim.restart) * sim.truth.factor(k, "rebuild")

    def _apply(self, k: int, act: Act, pool: tuple[int, ...]) -> bool:
        """Carry out a decision; False when the job cannot run (no plan fits the pool)."""
        sim = self.sim
        if act.kind is Action.WAIT:
            return False
        if act.kind is Action.RESTART:
            self._restart(k, act, pool)
            return True
        if act.kind is Action.MOVE and act.plan is not None:
            if self.plan is not None and same_layouts(self.plan, act.plan):
                self.plan = act.plan
            else:
                source, lost, rebuilt = survive(self.plan, pool, sim.truth.job.workflow) \
                    if self.plan else (None, ("all",), ())
                if act.free and source is not None:
                    # the oracle's move, rebuilds included; a move of state no GPU holds any
                    # more is no move: it restarts from the checkpoint below, as all do
                    self.events.append(Event(k, self.t, "move", 0.0, "free (oracle)"))
                    self._moves += 1
                    self.plan = act.plan
                    return True
                if source is not None:
                    source = fill(source, act.plan)
                sched = sim.truth.transition(source, act.plan, pool, k) if source else None
                if sched is None or not sched.feasible:
                    # the state cannot move as planned: the job fails and restarts
                    why = sched.reason if sched is not None else f"lost {', '.join(lost)}"
                    self._restart(k, Act(Action.RESTART, act.plan, True, decision=act.decision),
                                  pool)
                    self.events[-1] = Event(k, self.t, "restart", self.events[-1].seconds,
                                            f"no copy of the state left ({why})" if act.free else
                                            f"transition failed: {why}")
                    return True
                secs = sched.estimated_s * sim.truth.factor(k, "transition")
                if rebuilt:
                    # a stage left with no replica, made again: a frozen model's weights
                    # read, a copy of θ given by its training stage
                    secs += self._rebuild_s(k, act.plan, pool, rebuilt)
                self._acc["transition_s"] += secs
                self.t += secs
                d = act.decision
                self.events.append(Event(k, self.t, "move", secs,
                                         d.log_line() if d is not None else ""))
                self._moves += 1
                self.plan = act.plan
            return True
        # keep: the plan must still have its GPUs
        if self.plan is None or not set(self.plan.gpus()) <= set(pool):
            raise RuntimeError(f"{self.p.name} kept a plan whose GPUs are gone")
        return True

    # ---- one step ----
    def advance(self, k: int) -> None:
        sim = self.sim
        ev = sim.events[k]
        mean, longest = sim.lengths.at(k)
        upcoming = (k, mean, longest)
        if ev.pause_s > 0 and self.plan is None:  # before the job starts
            self._acc["paused_s"] += ev.pause_s
            self.t += ev.pause_s
        elif ev.pause_s > 0:
            self._pause(k, ev.pause_s, "no usable GPU in the pool")
        pool = ev.pool
        pending = list(ev.changes)
        decide = True
        if self.plan is None:  # the first step: the policy's initial plan, no decision
            self.plan = self.p.start(pool, mean, longest)
            if self.plan is None:
                raise InputError("scenario", f"no plan fits the {count(len(pool), 'GPU')} of "
                                 "the start")
            decide = False
        failed = False
        ooms = 0  # out-of-memory crashes of this step
        idle = 0  # waits in a row on a pool that does not change
        for _ in range(10_000):
            if decide:
                tel = self._telemetry(k, pool)
                act = self.p.failed(tel, upcoming) if failed else self.p.decide(tel, upcoming)
                failed = False
                self._consumed()
                if not self._apply(k, act, pool):
                    # the policy finds no plan for this pool (the truth has one: ``usable``):
                    # it waits out the step's window holding the GPUs; a pause in that window
                    # is paused time, as it is for every policy
                    self._pause(k, sim.nominal[k], f"no plan found for {count(len(pool), 'GPU')}",
                                held=True)
                    gaps = sum(gap for _, gap, _ in pending)
                    if gaps > 0:
                        self._pause(k, gaps, "the pool emptied while the job waited")
                    if pending:
                        pool = pending[-1][2]
                        pending = []
                        idle = 0
                    else:
                        idle += 1
                        if idle > 3:  # the truth has a plan for this pool (``usable``)
                            raise RuntimeError(
                                f"{self.p.name}: at step {k} it finds no plan for the "
                                f"{count(len(pool), 'GPU')} {format_gpus(pool)}, where one "
                                "fits")
                    continue
            decide = True
            assert self.plan is not None
            calib = self._calibration_error(k, pool, mean, longest)
            step_s, stage_s, priced = sim.truth.run_step(self.plan, pool, k, mean, longest)
            if not sim.truth.fits(priced):
                lost = OOM_LOST_FRACTION * step_s
                self._acc["lost_s"] += lost
                self.t += lost
                self.events.append(Event(k, self.t, "oom", lost, "a stage ran out of memory"))
                ooms += 1
                if ooms >= OOM_TRIES:
                    raise InputError(
                        f"step {k}", f"{self.p.name} ran out of memory {count(ooms, 'time')} "
                        f"in a row on this step (longest response {longest} tokens, "
                        f"{count(len(pool), 'GPU')}): "
                        "no plan it finds fits it", "shorter responses or more GPUs")
                # the policy hears of the step that crashed: its lengths, and the peaks of the
                # stages that ended before the crash (``measured_before_crash``)
                cap = sim.truth.job.cluster.device.memory_bytes
                self.tel = Telemetry(k, mean, longest, pool, {},
                                     measured_before_crash(sim.truth.job.workflow, self.plan,
                                                           stage_s, priced.peak_bytes, cap),
                                     source="simulated")
                failed = True
                continue
            used = set(self.plan.gpus())
            hit = next((i for i, (_, gap, p) in enumerate(pending)
                        if gap > 0 or not used <= set(p)), None)
            if hit is not None:
                f, gap, new = pending[hit]
                self._acc["lost_s"] += f * step_s
                self.t += f * step_s
                self.events.append(Event(k, self.t, "loss", f * step_s,
                                         "GPUs of the plan left during the step"))
                if gap > 0:
                    self._pause(k, gap, "the pool emptied during the step")
                rest = max(1e-9, 1.0 - f)
                pending = [((g - f) / rest, z, q) for g, z, q in pending[hit + 1:]]
                pool = new
                continue
            self.t += step_s
            self.since_ckpt.append(k)
            # changes that missed the plan still change the pool: the checkpoint is written by
            # the nodes there when the step ends, the same for every policy (``pool`` moves
            # only when a change hits this policy's plan); the policy hears of it next boundary
            end_pool = pending[-1][2] if pending else pool
            ckpt_s = 0.0
            if (k + 1) % sim.restart.checkpoint_interval_steps == 0:
                ckpt_s = checkpoint_write_s(sim.truth.job_at(end_pool, mean, longest),
                                            sim.restart)
                self.t += ckpt_s
                self.since_ckpt.clear()
            tokens = sim.truth.job.workload.sequences_per_step * mean
            self.rows.append(StepRow(self.p.name, k, self.t, step_s, self._acc["transition_s"],
                                     self._acc["restart_s"], self._acc["lost_s"],
                                     self._acc["paused_s"], len(end_pool), len(self.plan.gpus()),
                                     mean, tokens, calib, ckpt_s, self._moves))
            for key in self._acc:
                self._acc[key] = 0.0
            self._moves = 0
            self.tel = Telemetry(k, mean, longest, end_pool, stage_s,
                                 dict(priced.peak_bytes), source="simulated")
            return
        raise RuntimeError(f"{self.p.name}: step {k} never completed")

    def _calibration_error(self, k: int, pool: tuple[int, ...], mean: float, longest: int
                           ) -> float | None:
        if k > self.sim.calibration_steps:
            return None
        eff = self.p.efficiencies()
        if eff is None or self.plan is None:
            return None
        truth = self.sim.truth.price(self.plan, pool, k, mean, longest)
        cost = CostModel(self.sim.truth.job_at(pool, mean, longest), eff)
        errs = []
        for sp in self.plan.stages:
            pred = stage_estimate(cost, self.plan, sp.stage).latency_s
            true = truth.stage_s[sp.stage]
            errs.append(abs(pred - true) / true)
        return float(sum(errs) / len(errs)) if errs else None


def measured_before_crash(workflow: Workflow, plan: Plan, stage_s: Mapping[str, float],
                          peak_bytes: Mapping[str, int], cap: int) -> dict[str, int]:
    """The peaks a job that ran out of memory measured: those of the stages that began before
    the first stage over ``cap`` did, in the step's execution order (the overlap graph of
    ``plan``'s groups, timed by ``stage_s``). The crash ends the step, so a stage after it never
    ran and measured nothing; one that began before it, also one still running beside it (on
    other GPUs, or generation in asynchronous execution), had reached its peak, which comes
    early (generation allocates its KV cache as it starts, a training step peaks in its first
    micro-batches). The crash is put at the start of the stage that ran out, the earliest it
    can happen; a stage that begins at that instant measured nothing. With no stage over
    ``cap`` (the weight sync ran out, after every stage) every peak was measured."""
    over = [s for s, b in peak_bytes.items() if b > cap]
    if not over:
        return dict(peak_bytes)
    groups = plan.all_groups()
    graph = overlap_graph(workflow, groups, stage_s, 0.0)
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for n in nx.topological_sort(graph):
        start[n] = max((end[p] for p in graph.predecessors(n)), default=0.0)
        end[n] = start[n] + graph.nodes[n]["weight"]
    crash = min(start[s] for s in over)
    return {s: b for s, b in peak_bytes.items() if b <= cap and start[s] < crash}


class Simulator:
    """Runs policies over one scenario's traces, in lockstep by step (they share caches)."""

    def __init__(self, truth: Truth, lengths: LengthTrace, availability: Availability,
                 restart: RestartParams, steps: int | None = None, calibration_steps: int = 40,
                 clock: LengthTrace | None = None):
        """``clock``: the lengths of the whole run when ``lengths`` are its first steps (the
        availability is mapped onto steps by them, so a shorter run meets each change of the
        pool at the step the whole run meets it); by default ``lengths`` up to ``steps``."""
        self.truth = truth
        self.lengths = lengths
        self.availability = availability
        self.restart = restart
        self.steps = min(steps or len(lengths), len(lengths))
        self.calibration_steps = calibration_steps
        self.clock = clock if clock is not None else lengths.head(self.steps)
        if len(self.clock) < self.steps:
            raise InputError("clock", f"{count(len(self.clock), 'step')} of lengths map the "
                             f"pool onto steps, fewer than the {self.steps} simulated",
                             f">= {count(self.steps, 'step')}")
        self.min_gpus, nominal = nominal_clock(truth, self.clock, availability,
                                               len(self.clock))
        self.nominal = nominal[:self.steps]
        self._usable: dict[tuple[int, ...], bool] = {}
        self.events = align(availability, self.nominal, self.usable)

    def usable(self, pool: tuple[int, ...]) -> bool:
        """Whether some plan fits ``pool`` at the longest responses of the whole run (``clock``;
        under the true efficiencies): a pool that fits none is waited out like an empty one.
        Pools of the same size differ (a split across nodes may fit what a whole node does
        not)."""
        if len(pool) < self.min_gpus:
            return False
        hit = self._usable.get(pool)
        if hit is None:
            means = self.clock.mean
            top = max(self.clock.longest)
            try:
                best_plan(self.truth.job_at(pool, max(means), top), self.truth.hidden)
                hit = True
            except InfeasibleError:
                hit = False
            self._usable[pool] = hit
        return hit

    def run(self, policies: Sequence[Policy], scenario: str = "",
            progress: Callable[[int], None] | None = None,
            notes: Mapping[str, str] | None = None) -> SimResult:
        stays = [frozenset() if any(gap > 0 for _, gap, _ in ev.changes) else
                 frozenset(ev.pool).intersection(*(q for _, _, q in ev.changes))
                 for ev in self.events]
        for p in policies:
            p.foresee(stays)
        runners = [_Runner(p, self) for p in policies]
        for k in range(self.steps):
            for r in runners:
                r.advance(k)
            if progress is not None:
                progress(k + 1)
        return SimResult(scenario, {r.p.name: PolicyResult(r.p.name, tuple(r.rows),
                                                           tuple(r.events)) for r in runners},
                         dict(notes or {}))


def nominal_clock(truth: Truth, lengths: LengthTrace, av: Availability, steps: int,
                  samples: int = 24) -> tuple[int, list[float]]:
    """The smallest pool any plan fits, and each step's nominal seconds.

    The nominal step is the best plan on the largest pool of the trace, under the true
    efficiencies, at the trace's longest responses (so it runs everywhere), priced at sample
    lengths and interpolated.
    """
    full = max(av.pools, key=len)
    if not full:
        raise InputError("availability", "the trace never gives a GPU")
    means = lengths.mean[:steps]
    top = max(lengths.longest[:steps])
    try:
        plan = best_plan(truth.job_at(full, max(means), top), truth.hidden)
    except InfeasibleError as e:
        # the field to change: the job's GPUs where the trace gives them all at once, else
        # the trace that never does
        whole = set(full) >= set(truth.job.pool.ids)
        raise InputError("job.gpus" if whole else "availability",
                         f"no plan fits the largest pool of the trace "
                         f"({count(len(full), 'GPU')}) at the longest responses: {e}",
                         "more GPUs, or shorter responses (lengths)" if whole else
                         "a trace that gives a pool some plan fits") from None
    grid = np.linspace(min(means), max(means), samples)
    secs = [truth.price(plan, full, 0, float(m), top).step_s for m in grid]
    nominal = [float(np.interp(m, grid, secs)) for m in means]
    min_gpus = len(full)
    lo = 1
    while lo < min_gpus:  # bisect the smallest prefix pool that fits at the longest lengths
        mid = (lo + min_gpus) // 2
        try:
            best_plan(truth.job_at(tuple(range(mid)), max(means), top), truth.hidden)
            min_gpus = mid
        except InfeasibleError:
            lo = mid + 1
    return min_gpus, nominal
