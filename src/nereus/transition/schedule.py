"""The schedule of a transition: list scheduling of the global DAG, and its result type.

Ready primitives run side by side on disjoint GPUs; one starts when its predecessors are done,
none of its GPUs is busy, and every GPU it touches has the memory its buffers need. Which ready
primitive goes first is a priority rule (longest path to the end, Destroys first, stage by
stage, ...); a few rules are tried and the best schedule is improved by forward-backward passes
within a fixed work budget, so the result is deterministic and a 256-GPU transition is planned
in tens of milliseconds. A primitive may jump ahead of the DAG's memory-safe serial order
(``TransitionDag.order``) only if, on every GPU where it keeps memory, the rest of that order
still fits afterwards: so no order ever takes memory that a later primitive needs and nothing
releases, and every pass finishes. The makespan is ``L_tran``; the schedule records every GPU's
bytes over time.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nereus.cost.efficiency import Efficiencies
from nereus.transition.cost import Duration, TransitionCost
from nereus.transition.emu import Emu, renames
from nereus.transition.global_dag import RESOURCE, TransitionDag
from nereus.transition.primitives import Destroy, MemStep, Primitive


@dataclass(frozen=True)
class ScheduledPrimitive:
    """One primitive placed in time. ``deps``: indices (into ``Schedule.primitives``) that must
    end before it starts; ``resource_deps`` the subset that are resource edges."""

    index: int
    primitive: Primitive
    start_s: float
    end_s: float
    deps: tuple[int, ...]
    resource_deps: tuple[int, ...]
    duration: Duration
    memory: Mapping[int, MemStep]

    @property
    def op(self) -> str:
        return self.primitive.op

    @property
    def stage(self) -> str:
        return self.primitive.stage

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.primitive.gpus

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Schedule:
    """How to move every model-stage from the current plan to the target, and how long it takes.

    ``estimated_s`` is L_tran (estimated, from the transition cost model); ``memory[g]`` lists
    (time, bytes) steps of GPU g; ``initial``/``final`` are the EMU collections before and after
    (``final[stage][i]`` realizes target replica i). An infeasible schedule has no primitives
    and a ``reason`` that names the GPUs and model-stages.
    """

    feasible: bool
    estimated_s: float
    primitives: tuple[ScheduledPrimitive, ...]
    memory: Mapping[int, tuple[tuple[float, int], ...]]
    capacity_bytes: int
    initial: Mapping[str, tuple[Emu, ...]]
    final: Mapping[str, tuple[Emu, ...]]
    efficiencies: Efficiencies
    reason: str = ""
    changed: tuple[str, ...] = ()
    source: str = "estimated"

    def peak_bytes(self) -> dict[int, int]:
        return {g: max(b for _, b in steps) for g, steps in self.memory.items()}

    def by_stage(self) -> dict[str, list[ScheduledPrimitive]]:
        out: dict[str, list[ScheduledPrimitive]] = {}
        for p in self.primitives:
            out.setdefault(p.stage, []).append(p)
        return out

    def renames(self) -> dict[str, str]:
        """Final unit ids -> the ids Φ(target) gives them (``"<stage>/<replica>"``)."""
        return renames(self.final)

    def to_json_dict(self) -> dict[str, Any]:
        """The shape ``nereus transition --json`` prints."""
        return {
            "estimated_s": self.estimated_s if self.feasible else None,
            "feasible": self.feasible,
            "primitives": [{"op": p.op, "stage": p.stage, "gpus": list(p.gpus),
                            "start_s": p.start_s, "end_s": p.end_s} for p in self.primitives],
        }


def infeasible_schedule(dag: TransitionDag, efficiencies: Efficiencies) -> Schedule:
    return Schedule(False, math.inf, (), {}, dag.capacity_bytes, dag.initial, dag.final,
                    efficiencies, dag.problem or "infeasible", dag.changed)


@dataclass
class _Problem:
    """What one list-scheduling pass needs, forward or in reversed time.

    Reversed: edges point back, each primitive turns its after-state into its before-state
    (so its extra is during - after), it starts from the final bytes, and the serial order runs
    backwards, which fits memory exactly when the forward one does.
    """

    dur: list[float]
    succ: list[list[int]]
    npred: list[int]
    order: list[int]
    gpus: list[tuple[int, ...]]
    steps: list[tuple[tuple[int, int, int], ...]]  # (gpu, extra, net) per primitive
    initial: dict[int, int]
    cap: int
    destroy: list[bool]
    stage: list[int]       # rank of each primitive's model-stage (generation first)
    rem: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    pos_rem: dict[int, int] = field(default_factory=dict)
    settle: list[dict[int, int]] = field(default_factory=list)  # per primitive: net - extra

    def __post_init__(self) -> None:
        """Per GPU: the primitives touching it in serial order, and their positive extras."""
        self.settle = [{g: net - extra for g, extra, net in st} for st in self.steps]
        rem, pos_rem, initial, steps = self.rem, self.pos_rem, self.initial, self.steps
        for i in self.order:
            for g, extra, net in steps[i]:
                lst = rem.get(g)
                if lst is None:
                    rem[g] = lst = []
                    pos_rem[g] = 0
                    initial.setdefault(g, 0)
                lst.append((i, extra, net))
                if extra > 0:
                    pos_rem[g] += extra

    @classmethod
    def forward(cls, dag: TransitionDag, dur: list[float]) -> _Problem:
        n = len(dag.primitives)
        succ: list[list[int]] = [[] for _ in range(n)]
        npred = [0] * n
        for a, b, _ in dag.edges:
            succ[a].append(b)
            npred[b] += 1
        return cls(dur, succ, npred, list(dag.order), [tuple(m) for m in dag.memory],
                   [tuple((g, s.extra, s.net) for g, s in m.items()) for m in dag.memory],
                   dict(dag.initial_bytes), dag.capacity_bytes,
                   [isinstance(p, Destroy) for p in dag.primitives],
                   [dag.changed.index(p.stage) for p in dag.primitives])

    def reversed(self) -> _Problem:
        n = len(self.dur)
        succ: list[list[int]] = [[] for _ in range(n)]
        npred = [0] * n
        for a in range(n):
            for b in self.succ[a]:
                succ[b].append(a)
                npred[a] += 1
        final = dict(self.initial)
        for st in self.steps:
            for g, _, net in st:
                final[g] = final.get(g, 0) + net
        steps = [tuple((g, extra - net, -net) for g, extra, net in st) for st in self.steps]
        return _Problem(self.dur, succ, npred, self.order[::-1], self.gpus, steps, final,
                        self.cap, self.destroy, self.stage)

    def memory_succ(self) -> list[list[int]]:
        """Release -> later acquisitions on its GPU that would not fit without it (in the
        serial order). Not edges of the DAG: they make priorities see chains through memory."""
        out: list[list[int]] = [[] for _ in self.dur]
        cap = self.cap
        for g, seq in self.rem.items():
            cur = self.initial.get(g, 0)
            freed: list[tuple[int, int]] = []  # (release, bytes), in order
            for i, extra, net in seq:
                if extra > 0:
                    over = cur + sum(b for _, b in freed) + extra - cap
                    for r, b in reversed(freed):
                        if over <= 0:
                            break
                        out[r].append(i)
                        over -= b
                cur += net
                if net < 0:
                    freed.append((i, -net))
        return out

    def tails(self) -> list[float]:
        """Longest path to the end from each primitive, through DAG and memory successors."""
        tail = [0.0] * len(self.dur)
        mem = self.memory_succ()
        for i in reversed(self.order):
            tail[i] = self.dur[i] + max((tail[s] for s in (*self.succ[i], *mem[i])),
                                        default=0.0)
        return tail


# Starting points (priority rule, reservation), tried in turn while the work budget lasts; each
# is improved by forward-backward passes. The budget counts (primitive, GPU) updates over all
# passes, so a small transition gets the whole portfolio and a 256-GPU one a few passes.
STARTS = (("stage_rev", True), ("stage", False), ("wide", False), ("tail", True),
          ("release", False), ("wide", True), ("tail", False), ("stage", True),
          ("stage_rev", False), ("release", True))
IMPROVE_ROUNDS = 3   # forward-backward rounds at most per starting point
WORK_BUDGET = 8000   # (primitive, GPU) updates over all passes
MIN_PASSES = 3
MAX_PASSES = 70
JITTER = 0.3         # then random starts: the best order so far, starts shifted by up to JITTER x makespan


def list_schedule(dag: TransitionDag, cost: TransitionCost) -> Schedule:
    """The best list schedule found from a few priority rules, each improved by
    forward-backward passes (re-schedule in the order the previous pass found, right- then
    left-justified: the classic improvement of list schedules in project scheduling), then
    perturbations of the best order, while the work budget lasts."""
    durs = [cost.duration(p) for p in dag.primitives]
    fwd = _Problem.forward(dag, [d.seconds for d in durs])
    n = len(durs)
    pos = [0] * n
    for k, i in enumerate(fwd.order):
        pos[i] = k
    tail = fwd.tails()
    rules = {
        "tail": [(-tail[i], pos[i]) for i in range(n)],
        "release": [(0 if fwd.destroy[i] else 1, -tail[i], pos[i]) for i in range(n)],
        "wide": [(-tail[i] * len(fwd.gpus[i]), pos[i]) for i in range(n)],
        # one model-stage after another (stages compete for the same GPUs' links)
        "stage": [(fwd.stage[i], -tail[i], pos[i]) for i in range(n)],
        "stage_rev": [(-fwd.stage[i], -tail[i], pos[i]) for i in range(n)],
    }
    bwd = fwd.reversed() if n > 1 else fwd
    per_pass = sum(len(st) for st in fwd.steps)  # a pass costs about this many GPU updates
    passes = min(MAX_PASSES, max(MIN_PASSES, WORK_BUDGET // max(1, per_pass)))
    rng = random.Random(n)  # deterministic: the same DAG always gets the same schedule
    best: _ListScheduler | None = None
    k = 0
    while passes > 0:
        if k < len(STARTS):
            rule, reserve = STARTS[k]
            prio = rules[rule]
        else:  # perturb the best order found so far (iterated local search)
            assert best is not None
            reserve = rng.random() < 0.5
            span = max(best.makespan, 1e-9) * JITTER
            prio = [(best.start[i] + span * rng.random(), pos[i]) for i in range(n)]
        k += 1
        run = _ListScheduler(fwd, prio, reserve).run()
        passes -= 1
        run, used = _improve(fwd, bwd, run, pos, passes, reserve)
        passes -= used
        if best is None or run.makespan < best.makespan - 1e-12:
            best = run
    assert best is not None
    return _assemble(dag, cost, durs, best.start, best.end, pos,
                     _timeline(dag, best.start, best.end))


def _improve(fwd: _Problem, bwd: _Problem, run: _ListScheduler, pos: list[int], passes: int,
             reserve: bool) -> tuple[_ListScheduler, int]:
    """Forward-backward improvement: right-justify in the order of the latest ends, then
    left-justify in the order of those starts (with and without reservations), while the
    makespan shrinks. Returns the best run and the passes spent."""
    n = len(pos)
    used = 0
    if n < 2:
        return run, used
    for _ in range(IMPROVE_ROUNDS):
        if passes - used < 3:
            break
        back = _ListScheduler(bwd, [(-run.end[i], pos[i]) for i in range(n)], reserve).run()
        late = [(back.makespan - back.end[i], pos[i]) for i in range(n)]
        again = min((_ListScheduler(fwd, late, r).run() for r in (reserve, not reserve)),
                    key=lambda x: x.makespan)
        used += 3
        if again.makespan >= run.makespan - 1e-12:
            break
        run = again
    return run, used


class _ListScheduler:
    """One pass of list scheduling (parallel schedule generation) under a priority per primitive.

    ``reserve``: a primitive that is blocked only until a running one ends (its GPUs busy, or
    memory that the running one frees) holds its GPUs against lower-priority primitives that
    would still run at that moment, so a long copy does not grab the GPUs a critical one is
    about to need.
    """

    def __init__(self, prob: _Problem, prio: list[tuple[float, ...]], reserve: bool):
        n = self.n = len(prob.dur)
        self.cap = prob.cap
        self.dur = prob.dur
        self.reserve = reserve
        self.succ = prob.succ
        self.waiting = list(prob.npred)
        self.prio = prio
        self.gpus = prob.gpus
        self.steps = prob.steps
        self.settle = prob.settle
        self.usage: dict[int, int] = dict(prob.initial)
        self.committed: dict[int, int] = dict(prob.initial)
        self.rem = prob.rem                      # per GPU, in serial order (read only)
        self.pos_rem = dict(prob.pos_rem)        # per GPU: positive extras not yet started
        self.started = [False] * n
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.on: dict[int, int] = {}          # busy GPU -> running primitive
        self.held: dict[int, tuple[float, int]] = {}  # GPU -> (free at, reserving primitive)
        self.holds: dict[int, list[int]] = {}  # primitive -> GPUs it reserves
        self.hold_at: dict[int, float] = {}    # primitive -> when it expects to start
        self.makespan = 0.0

    def guard_ok(self, i: int) -> bool:
        """Starting ``i`` now leaves the rest of the serial order feasible on its GPUs."""
        cap = self.cap
        for g, extra, net in self.steps[i]:
            if net <= 0:
                continue
            cur = self.committed[g] + net
            if cur + self.pos_rem[g] - (extra if extra > 0 else 0) <= cap:
                continue
            started = self.started
            for r, e2, n2 in self.rem[g]:
                if started[r] or r == i:
                    continue
                if cur + e2 > cap:
                    return False
                cur += n2
        return True

    def free_at(self, i: int) -> float:
        """When ``i`` could start if only running primitives ended (inf: later than that, or
        never held back by a running one)."""
        if not self.guard_ok(i):
            return math.inf
        t = -math.inf
        on, usage, cap, end, settle = self.on, self.usage, self.cap, self.end, self.settle
        for g, extra, _ in self.steps[i]:
            r = on.get(g)
            if r is None:
                if usage[g] + extra > cap:
                    return math.inf
                continue
            if end[r] > t:
                t = end[r]
            if usage[g] + settle[r][g] + extra > cap:
                return math.inf
        return t if t > -math.inf else math.inf

    def unhold(self, i: int) -> None:
        self.hold_at.pop(i, None)
        for g in self.holds.pop(i, ()):
            if self.held.get(g, (0.0, -1))[1] == i:
                del self.held[g]

    def hold(self, i: int, at: float) -> None:
        mine = []
        for g in self.gpus[i]:
            h = self.held.get(g)
            if h is None or self.prio[i] < self.prio[h[1]]:
                self.held[g] = (at, i)
                mine.append(g)
        if mine:
            self.holds[i] = mine
            self.hold_at[i] = at

    def blocker(self, i: int) -> int | None:
        """None if ``i`` can start now; else a busy GPU it waits for, or -1 (memory)."""
        on = self.on
        for g in self.gpus[i]:
            if g in on:
                return g
        usage, cap = self.usage, self.cap
        for g, extra, _ in self.steps[i]:
            if usage[g] + extra > cap:
                return -1
        return None if self.guard_ok(i) else -1

    def held_against(self, j: int, t: float) -> int | None:
        """A GPU of ``j`` reserved by a higher-priority primitive that ``j`` would delay."""
        pj = self.prio[j]
        tj = t + self.dur[j]
        held = self.held
        for g in self.gpus[j]:
            h = held.get(g)
            if h is not None and h[1] != j and tj > h[0] and self.prio[h[1]] < pj:
                return g
        return None

    def run(self) -> _ListScheduler:
        """Event by event; a primitive that cannot start is looked at again only when a GPU it
        waits for frees (or, blocked by memory, when anything on its GPUs ends)."""
        n, steps, started, prio, gpus = self.n, self.steps, self.started, self.prio, self.gpus
        waiting_on: dict[int, set[int]] = {}
        running: list[tuple[float, int]] = []
        cand = {i for i in range(n) if not self.waiting[i]}
        t = 0.0
        done = 0
        reserve = self.reserve
        while done < n:
            if self.hold_at:
                cand |= {i for i, at in self.hold_at.items() if at <= t}
            later: set[int] = set()
            for i in sorted(cand, key=prio.__getitem__):
                if started[i]:
                    continue
                if i in self.holds:
                    for g in self.holds[i]:
                        later |= waiting_on.pop(g, set())
                    self.unhold(i)
                b = self.blocker(i)
                if b is None and reserve and self.held:
                    b = self.held_against(i, t)
                if b is None:
                    self._start(i, t, running)
                    continue
                if b >= 0:
                    waiting_on.setdefault(b, set()).add(i)
                else:
                    for g in gpus[i]:
                        waiting_on.setdefault(g, set()).add(i)
                if reserve:
                    at = self.free_at(i)
                    if at < math.inf:
                        self.hold(i, at)
            cand = later
            if not running:  # reservations held everything back: drop them
                self.held.clear()
                self.holds.clear()
                self.hold_at.clear()
                for i in sorted((i for i in range(n) if not started[i] and not self.waiting[i]),
                                key=prio.__getitem__):
                    if self.blocker(i) is None:
                        self._start(i, t, running)
            if not running:
                raise RuntimeError("transition scheduler stalled: the serial order does not fit "
                                   "memory (a bug in the global DAG)")
            t = running[0][0]
            on, usage = self.on, self.usage
            while running and running[0][0] <= t:
                _, i = heapq.heappop(running)
                done += 1
                for g, extra, net in steps[i]:
                    del on[g]
                    usage[g] += net - extra
                    w = waiting_on.pop(g, None)
                    if w:
                        cand |= w
                for s in self.succ[i]:
                    self.waiting[s] -= 1
                    if not self.waiting[s]:
                        cand.add(s)
        self.makespan = max(self.end, default=0.0)
        return self

    def _start(self, i: int, t: float, running: list[tuple[float, int]]) -> None:
        self.started[i] = True
        self.start[i] = t
        self.end[i] = t + self.dur[i]
        heapq.heappush(running, (self.end[i], i))
        on, usage, committed, pos_rem = self.on, self.usage, self.committed, self.pos_rem
        for g, extra, net in self.steps[i]:
            on[g] = i
            usage[g] += extra
            committed[g] += net
            if extra > 0:
                pos_rem[g] -= extra


def _timeline(dag: TransitionDag, start: Sequence[float], end: Sequence[float]
              ) -> dict[int, tuple[tuple[float, int], ...]]:
    """Every GPU's bytes over time, replayed from start and end times (ends first at ties):
    (t, bytes from t on) steps, one per time at which the bytes change."""
    n = len(dag.primitives)
    usage = dict(dag.initial_bytes)
    steps: dict[int, list[tuple[float, int]]] = {g: [(0.0, b)] for g, b in usage.items()}
    events = [(end[i], 0, i) for i in range(n)] + [(start[i], 1, i) for i in range(n)]
    events.sort()
    memory = dag.memory
    for t, kind, i in events:
        for g, m in memory[i].items():
            d = m.extra if kind else m.net - m.extra
            if not d:
                continue
            u = usage.get(g, 0) + d
            usage[g] = u
            lst = steps.get(g)
            if lst is None:
                steps[g] = lst = [(0.0, 0)]
            if lst[-1][0] == t:
                lst[-1] = (t, u)
            else:
                lst.append((t, u))
    return {g: tuple(_compact(v)) for g, v in steps.items()}


def _assemble(dag: TransitionDag, cost: TransitionCost, durs: list[Duration],
              start: list[float], end: list[float], pos: list[int],
              mem: Mapping[int, tuple[tuple[float, int], ...]]) -> Schedule:
    """Primitives ordered by start time, dependencies renumbered to that order."""
    n = len(dag.primitives)
    preds: list[list[int]] = [[] for _ in range(n)]
    resource: set[tuple[int, int]] = set()
    for a, b, kind in dag.edges:
        preds[b].append(a)
        if kind == RESOURCE:
            resource.add((a, b))
    order = sorted(range(n), key=lambda i: (start[i], pos[i]))
    new = {old: k for k, old in enumerate(order)}
    out = tuple(
        ScheduledPrimitive(k, dag.primitives[i], start[i], end[i],
                           tuple(sorted(new[a] for a in preds[i])),
                           tuple(sorted(new[a] for a in preds[i] if (a, i) in resource)),
                           durs[i], dag.memory[i])
        for k, i in enumerate(order))
    return Schedule(True, max(end, default=0.0), out, mem, dag.capacity_bytes, dag.initial,
                    dag.final, cost.eff, "", dag.changed)


def fixed_schedule(dag: TransitionDag, cost: TransitionCost, start: Sequence[float],
                   end: Sequence[float]) -> Schedule:
    """A schedule with given start and end times (e.g. an exact solver's), its memory timeline
    replayed from them. Nothing is checked here: that is the validator's job."""
    n = len(dag.primitives)
    durs = [cost.duration(p) for p in dag.primitives]
    pos = [0] * n
    for k, i in enumerate(dag.order):
        pos[i] = k
    return _assemble(dag, cost, durs, list(start), list(end), pos, _timeline(dag, start, end))


def _compact(steps: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """One entry per time (the last one), dropping entries that change nothing."""
    out: list[tuple[float, int]] = []
    for t, b in steps:
        if out and out[-1][0] == t:
            out[-1] = (t, b)
        else:
            out.append((t, b))
    dedup = [out[0]]
    for t, b in out[1:]:
        if b != dedup[-1][1]:
            dedup.append((t, b))
    return dedup
