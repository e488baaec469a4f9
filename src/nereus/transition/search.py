"""List scheduling of a transition DAG: one pass of parallel schedule generation, and the search
over priority rules that stops as soon as a schedule is within 1 % of the lower bound.

Ready primitives run side by side on disjoint GPUs; one starts when its predecessors are done,
none of its GPUs is busy, and every GPU it touches has the memory its buffers need. Which ready
primitive goes first is a priority rule (longest path to the end, Destroys first, stage by
stage, ...). A primitive may jump ahead of the DAG's memory-safe serial order
(``TransitionDag.order``) only if, on every GPU where it keeps memory, the rest of that order
still fits afterwards: so no order ever takes memory that a later primitive needs and nothing
releases, and every pass finishes.

Most transitions are scheduled at the bound (``nereus.transition.bound``) by the first rule, so
the common path is one pass. Only a schedule more than ``TOLERANCE`` above the bound pays for
more: the other rules, each improved by forward-backward passes, then changes of the best
order (first its critical chain's moves, then random perturbations), within a work budget,
each step stopping as soon as the bound is met. Where memory binds nowhere, the improvement
also runs serial passes, which may leave a GPU idle for a primitive that comes later: the
parallel passes never do, and some optimal schedules need it. Everything is deterministic:
the same DAG always gets the same schedule.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import add

from nereus.transition.bound import critical_paths, refutes
from nereus.transition.global_dag import TransitionDag
from nereus.transition.primitives import Destroy, Primitive

# Whether this module runs compiled (``NEREUS_MYPYC=1`` at install, setup.py) or interpreted:
# the same schedules either way, about twice as fast compiled
COMPILED = not __file__.endswith(".py")

TOLERANCE = 0.01     # a schedule within 1 % of the lower bound is not improved further

# The first pass: the rule that meets the bound most often on the benchmark instances (as often
# as any), without reservations (the cheapest pass). Since Extend fan-outs seed every node first
# (a seed copy feeds the copies inside its node), "wide_succ": 31 of the 49 scheduled
# instances in one pass where "stage_rev" (it came first before) now gets 29, 407 passes in
# all instead of 461, and no schedule longer (random-256-12: one pass, 3.062 s, instead of 49
# passes and 3.096 s). On other seeds of the benchmark's generator it is about as good as
# "stage_rev" (60 of 97 in one pass either way).
PROBE = ("wide_succ", False)
# Then starting points (priority rule, reservation), tried in turn while the bound is not met
# and the work budget lasts; each is improved by forward-backward passes. The order covers
# the hard cases (it was tuned before the probe came first; a probe among them has its pass
# reused when its turn comes; the probe is not among them now, and putting "wide_succ" among
# the first starts made some benchmark schedules up to 2 % longer).
STARTS = (("stage_rev", True), ("stage", False), ("wide", False), ("tail", True),
          ("release", False), ("wide", True), ("tail", False), ("stage", True),
          ("stage_rev", False), ("release", True))
IMPROVE_ROUNDS = 3   # forward-backward rounds at most per starting point
# Work budgets in (primitive, GPU) updates, spent one after the other: the second only when the
# first ends more than TOLERANCE above the bound. The search carries on where it stopped, so a
# larger budget never gives a worse schedule. The second costs up to about 80 ms on a
# 256-GPU transition, and only the rare ones the first leaves 4-6 % above the bound pay it.
WORK_BUDGETS: tuple[int, ...] = (8000, 32000)  # (any length: a test cuts it short)
MIN_PASSES = 3       # per budget
MAX_PASSES = 70      # per budget
# Then, on the best schedule still above the goal, the moves on its critical chain
# (``_Search.critical_moves``), each left-justified, within this many passes (random-256-2 of
# the benchmark: from 7.3 % above CP-SAT's optimum to 4.9 %, for about 20 ms)
CHAIN_PASSES = 12
JITTER = 0.3         # then random starts: the best order, starts shifted by <= JITTER x makespan
# Once the search has run this many passes, the best schedule so far, above the goal, is checked
# against a stronger bound: whether any schedule ends within TOLERANCE of it
# (``nereus.transition.bound.refutes``, about one to four passes' time); when none can, it is
# kept. Each later best schedule is checked again until REFUTE_TRIES checks found no proof.
REFUTE_AFTER = 8
REFUTE_TRIES = 1


@dataclass(frozen=True)
class Times:
    """Start and end of every DAG primitive (seconds, estimated), the makespan, the lower
    bound it was measured against, and how many list-scheduling passes it took."""

    start: tuple[float, ...]
    end: tuple[float, ...]
    makespan: float
    bound: float
    passes: int


class _Problem:
    """What one list-scheduling pass needs, forward or in reversed time, on resources 0..R-1.

    A resource is a set of GPUs that are busy or free together. A GPU where memory cannot bind
    (its bytes before the transition plus every positive extra of every primitive on it fit
    capacity: no order of those primitives can exceed it) only matters for being busy, and it
    is busy exactly when every other such GPU touched by the same primitives is, so those GPUs
    form one resource; if only one primitive touches them, they are no resource at all (nothing
    else ever waits for them). A GPU where memory may bind is a resource of its own and its
    bytes are tracked (``steps``: (resource, extra, net) per primitive). The passes are the
    same as on single GPUs, only cheaper.

    Reversed: edges point back, each primitive turns its after-state into its before-state
    (so its extra is during - after), it starts from the final bytes, and the serial order runs
    backwards, which fits memory exactly when the forward one does (and memory binds on the
    same GPUs: a reversed schedule is a forward one read backwards).
    """

    def __init__(self, dur: list[float], succ: list[list[int]], npred: list[int],
                 order: list[int], res: list[list[int]],
                 steps: list[list[tuple[int, int, int]]], initial: list[int], cap: int,
                 prims: Sequence[Primitive], width: list[int]):
        self.dur, self.succ, self.npred, self.order = dur, succ, npred, order
        self.res, self.steps, self.initial, self.cap = res, steps, initial, cap
        self.prims = prims  # what the priority rules look at
        self.width = width  # GPUs per primitive (its memory's; ``Extend.gpus`` adds tuples)
        self.work = sum(width)  # (primitive, GPU) pairs: what a pass on single GPUs updates
        self.tracked = any(steps)  # memory binds somewhere
        # ``_run_free`` may run its passes: memory binds nowhere, and no primitive takes no
        # time (one that ends as it starts frees its GPUs within the same instant, which only
        # ``_run_plain``'s order of looking handles as ``run`` does)
        self.free = not self.tracked and min(dur, default=1.0) > 0
        # set by ``forward``: (head, tail) critical paths and the lower bound
        self.paths: tuple[list[float], list[float]] | None = None
        self.bound = 0.0
        # per tracked resource: the primitives touching it in serial order, positive extras
        rem: list[list[tuple[int, int, int]]] = [[] for _ in initial] if self.tracked else []
        pos_rem = [0] * len(initial)
        if self.tracked:
            for i in order:
                for g, extra, net in steps[i]:
                    rem[g].append((i, extra, net))
                    if extra > 0:
                        pos_rem[g] += extra
        self.rem, self.pos_rem = rem, pos_rem

    @classmethod
    def forward(cls, dag: TransitionDag, dur: list[float]) -> _Problem:
        """The DAG's problem, with its critical paths (``paths``) and lower bound (``bound``,
        ``nereus.transition.bound.bound_from_paths``): each resource's share of the bound is
        taken as the resource is made, from its primitives."""
        n = len(dag.primitives)
        succ: list[list[int]] = [[] for _ in range(n)]
        npred = [0] * n
        for a, b, _ in dag.edges:
            succ[a].append(b)
            npred[b] += 1
        order, memory, init, cap = list(dag.order), dag.memory, dag.initial_bytes, \
            dag.capacity_bytes
        paths = head, tail = critical_paths(dur, succ, order)
        # GPU -> [sum of positive extras, then its primitives in order]: one dict look-up per
        # (primitive, GPU) pair, the loop that costs the most here
        touch: dict[int, list[int]] = {}
        for i in order:
            for g, step in memory[i].items():
                if g in touch:
                    seen = touch[g]
                    seen.append(i)
                else:
                    seen = touch[g] = [0, i]
                extra = step[1] - step[0]  # during - before (indexing a named tuple is cheaper
                if extra > 0:              # than unpacking it)
                    seen[0] += extra
        # each primitive's resources, filled per resource from its GPUs' primitive lists
        # (far fewer entries than (primitive, GPU) pairs); the order within a list does not
        # change a schedule, only which busy resource a blocked primitive watches first
        res: list[list[int]] = [[] for _ in range(n)]
        steps: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        sigs: set[tuple[int, ...]] = set()
        initial: list[int] = []
        # the bound: the longest critical path, and per resource the earliest head among its
        # primitives, their seconds (added in index order, as bound_from_paths does) and the
        # least tail
        bound = 0.0
        for v in map(add, map(add, head, dur), tail):
            if v > bound:
                bound = v
        inf = math.inf
        room = cap - max(max(init.values(), default=0), 0)  # extras that fit on any GPU
        prev: list[int] | None = None
        for g, seen in touch.items():
            extra = seen[0]
            seen[0] = -1  # then the list is its primitives, behind the same mark everywhere
            if extra > room and init.get(g, 0) + extra > cap:  # memory may bind: a resource
                r = len(initial)                                # of its own
                initial.append(init.get(g, 0))
                for i in seen[1:]:
                    b, d, a = memory[i][g]
                    steps[i].append((r, d - b, a - b))
            elif len(seen) == 2 or seen == prev:
                # one primitive: nothing else ever waits for this GPU, and its share of the
                # bound is that primitive's critical path; or the same primitives as the GPU
                # before (often: GPUs of one unit come one after another)
                continue
            else:
                prev = seen
                sig = tuple(seen)
                if sig in sigs:
                    continue
                sigs.add(sig)
                r = len(initial)
                initial.append(0)
            first = last = inf
            load = 0.0
            for i in sorted(seen)[1:]:  # the mark sorts first
                res[i].append(r)
                load += dur[i]
                h, t = head[i], tail[i]
                if h < first:
                    first = h
                if t < last:
                    last = t
            v = first + load + last
            if v > bound:
                bound = v
        prob = cls(dur, succ, npred, order, res, steps, initial, cap, dag.primitives,
                   list(map(len, memory)))
        prob.paths, prob.bound = paths, bound
        return prob

    def reversed(self) -> _Problem:
        n = len(self.dur)
        succ: list[list[int]] = [[] for _ in range(n)]
        npred = [0] * n
        for a in range(n):
            for b in self.succ[a]:
                succ[b].append(a)
                npred[a] += 1
        final = list(self.initial)
        for st in self.steps:
            for g, _, net in st:
                final[g] += net
        steps = [[(g, extra - net, -net) for g, extra, net in st] for st in self.steps]
        return _Problem(self.dur, succ, npred, self.order[::-1], self.res, steps, final,
                        self.cap, self.prims, self.width)

    def memory_succ(self) -> list[list[int]]:
        """Release -> later acquisitions on its GPU that would not fit without it (in the
        serial order). Not edges of the DAG: they make priorities see chains through memory."""
        out: list[list[int]] = [[] for _ in self.dur]
        cap = self.cap
        for g, seq in enumerate(self.rem):
            cur = self.initial[g]
            freed: list[tuple[int, int]] = []  # (release, bytes), in order
            total = 0                          # sum of freed bytes
            for i, extra, net in seq:
                if extra > 0 and freed:
                    over = cur + total + extra - cap
                    for r, b in reversed(freed):
                        if over <= 0:
                            break
                        out[r].append(i)
                        over -= b
                cur += net
                if net < 0:
                    freed.append((i, -net))
                    total -= net
        return out

    def tails(self) -> list[float]:
        """Longest path to the end from each primitive, through DAG and memory successors."""
        dur, succ = self.dur, self.succ
        tail = [0.0] * len(dur)
        mem = self.memory_succ()
        for i in reversed(self.order):
            t = 0.0
            for s in succ[i]:
                if tail[s] > t:
                    t = tail[s]
            for s in mem[i]:
                if tail[s] > t:
                    t = tail[s]
            tail[i] = dur[i] + t
        return tail


def _ranks(keys: Sequence[tuple[float, ...]]) -> list[int]:
    """Priority keys as ranks 0..n-1 (lower first): one sort, then integer comparisons."""
    return _rank_of(sorted(range(len(keys)), key=keys.__getitem__))


def _rank_of(by: list[int]) -> list[int]:
    """The ranks of the primitives listed highest priority first (the inverse permutation)."""
    rank = [0] * len(by)
    for k, i in enumerate(by):
        rank[i] = k
    return rank


class _Pass:
    """One pass of list scheduling (parallel schedule generation) under a priority rank.

    ``reserve``: a primitive that is blocked only until a running one ends (its GPUs busy, or
    memory that the running one frees) holds its GPUs against lower-priority primitives that
    would still run at that moment, so a long copy does not grab the GPUs a critical one is
    about to need.
    """

    def __init__(self, prob: _Problem, rank: list[int], reserve: bool,
                 by: list[int] | None = None):
        n = self.n = len(prob.dur)
        self.prob = prob
        self.dur = prob.dur
        self.reserve = reserve
        self.succ = prob.succ
        self.waiting = list(prob.npred)
        self.rank = rank
        self.by = by  # the primitives highest priority first, if known (the inverse of rank)
        self.res = prob.res
        self.start = [0.0] * n
        self.end = [0.0] * n
        self.on = [-1] * len(prob.initial)       # busy resource -> running primitive
        self.makespan = 0.0

    def _track(self) -> None:
        """The state of memory and reservations (``_run_free`` needs none of it)."""
        prob = self.prob
        self.cap = prob.cap
        self.steps = prob.steps
        self.usage = list(prob.initial)
        self.committed = list(prob.initial)
        self.rem = prob.rem                      # per GPU, in serial order (read only)
        self.pos_rem = list(prob.pos_rem)        # per GPU: positive extras not yet started
        self.started = [False] * self.n
        self.on_settle = [0] * len(prob.initial)  # tracked, busy: net - extra of what runs
        self.held: dict[int, tuple[float, int]] = {}  # resource -> (free at, reserving prim.)
        self.holds: dict[int, list[int]] = {}  # primitive -> resources it reserves
        self.hold_at: dict[int, float] = {}    # primitive -> when it expects to start

    def guard_ok(self, i: int) -> bool:
        """Starting ``i`` now leaves the rest of the serial order feasible on its GPUs."""
        cap, committed, pos_rem = self.cap, self.committed, self.pos_rem
        for g, extra, net in self.steps[i]:
            if net <= 0:
                continue
            cur = committed[g] + net
            if cur + pos_rem[g] - (extra if extra > 0 else 0) <= cap:
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
        on, usage, cap, end, settle = self.on, self.usage, self.cap, self.end, self.on_settle
        for g in self.res[i]:
            r = on[g]
            if r >= 0 and end[r] > t:
                t = end[r]
        for g, extra, _ in self.steps[i]:
            if usage[g] + (settle[g] if on[g] >= 0 else 0) + extra > cap:
                return math.inf
        return t if t > -math.inf else math.inf

    def unhold(self, i: int) -> None:
        self.hold_at.pop(i, None)
        for g in self.holds.pop(i, ()):
            if self.held.get(g, (0.0, -1))[1] == i:
                del self.held[g]

    def hold(self, i: int, at: float) -> None:
        mine = []
        rank = self.rank
        for g in self.res[i]:
            h = self.held.get(g)
            if h is None or rank[i] < rank[h[1]]:
                self.held[g] = (at, i)
                mine.append(g)
        if mine:
            self.holds[i] = mine
            self.hold_at[i] = at

    def blocker(self, i: int) -> int | None:
        """None if ``i`` can start now; else a busy resource it waits for, or -1 (memory)."""
        on = self.on
        for g in self.res[i]:
            if on[g] >= 0:
                return g
        usage, cap = self.usage, self.cap
        for g, extra, _ in self.steps[i]:
            if usage[g] + extra > cap:
                return -1
        return None if self.guard_ok(i) else -1

    def held_against(self, j: int, t: float) -> int | None:
        """A resource of ``j`` reserved by a higher-priority primitive that ``j`` would
        delay."""
        rank = self.rank
        pj = rank[j]
        tj = t + self.dur[j]
        held = self.held
        for g in self.res[j]:
            h = held.get(g)
            if h is not None and h[1] != j and tj > h[0] and rank[h[1]] < pj:
                return g
        return None

    def run(self) -> _Pass:
        """Event by event; a primitive that cannot start is looked at again only when a GPU it
        waits for frees (or, blocked by memory, when anything on its GPUs ends). Without
        reservations and with memory binding nowhere (most transitions' one pass), the loop
        that has nothing else to check (``_run_free``)."""
        if self.reserve:
            return self._run_general()
        return self._run_free() if self.prob.free else self._run_plain()

    def _run_general(self) -> _Pass:
        """``run`` with or without reservations (without: what ``_run_plain`` inlines)."""
        self._track()
        n, steps, started, res = self.n, self.steps, self.started, self.res
        key = self.rank.__getitem__
        waiting_on: dict[int, set[int]] = {}
        running: list[tuple[float, int]] = []
        cand = {i for i in range(n) if not self.waiting[i]}
        t = 0.0
        done = 0
        reserve = self.reserve
        on, usage, on_settle, succ, waiting = self.on, self.usage, self.on_settle, self.succ, \
            self.waiting
        while done < n:
            if self.hold_at:
                cand |= {i for i, at in self.hold_at.items() if at <= t}
            later: set[int] = set()
            for i in sorted(cand, key=key):
                if started[i]:
                    continue
                if i in self.holds:
                    for g in self.holds[i]:
                        w = waiting_on.pop(g, None)
                        if w:
                            later |= w
                    self.unhold(i)
                b = self.blocker(i)
                if b is None and reserve and self.held:
                    b = self.held_against(i, t)
                if b is None:
                    self._start(i, t, running)
                    continue
                if b >= 0:
                    w = waiting_on.get(b)
                    if w is None:
                        waiting_on[b] = {i}
                    else:
                        w.add(i)
                else:
                    for g in res[i]:
                        w = waiting_on.get(g)
                        if w is None:
                            waiting_on[g] = {i}
                        else:
                            w.add(i)
                if reserve:
                    at = self.free_at(i)
                    if at < math.inf:
                        self.hold(i, at)
            cand = later
            if not running:  # reservations held everything back: drop them
                self.held.clear()
                self.holds.clear()
                self.hold_at.clear()
                for i in sorted((i for i in range(n) if not started[i] and not waiting[i]),
                                key=key):
                    if self.blocker(i) is None:
                        self._start(i, t, running)
            if not running:
                raise RuntimeError("transition scheduler stalled: the serial order does not fit "
                                   "memory (a bug in the global DAG)")
            t = running[0][0]
            while running and running[0][0] <= t:
                _, i = heapq.heappop(running)
                done += 1
                for g in res[i]:
                    on[g] = -1
                    w = waiting_on.pop(g, None)
                    if w:
                        cand |= w
                for g, _, _ in steps[i]:
                    usage[g] += on_settle[g]
                for s in succ[i]:
                    waiting[s] -= 1
                    if not waiting[s]:
                        cand.add(s)
        self.makespan = max(self.end, default=0.0)
        return self

    def _run_plain(self) -> _Pass:
        """``run`` without reservations, the checks inlined: the probe's pass, the common
        path, does exactly what ``run`` would."""
        self._track()
        n, steps, started, res, succ, waiting = self.n, self.steps, self.started, self.res, \
            self.succ, self.waiting
        on, usage, on_settle, committed, pos_rem = self.on, self.usage, self.on_settle, \
            self.committed, self.pos_rem
        start, end, dur, cap, rank = self.start, self.end, self.dur, self.cap, self.rank
        by_rank = self.by or _rank_of(rank)  # the inverse permutation: by_rank[rank[i]] == i
        guard_ok = self.guard_ok
        push, pop = heapq.heappush, heapq.heappop
        # per resource: the primitives to look at again when it frees, as ranks (sorting
        # ints needs no key), or None
        waiters: list[list[int] | None] = [None] * len(on)
        running: list[tuple[float, int]] = []
        cand = {rank[i] for i in range(n) if not waiting[i]}
        t = 0.0
        done = 0
        while done < n:
            for k in sorted(cand):
                i = by_rank[k]
                if started[i]:
                    continue
                rs = res[i]
                b = -2  # free
                for g in rs:
                    if on[g] >= 0:
                        b = g
                        break
                st = steps[i]
                if b == -2 and st:
                    for g, extra, _ in st:
                        if usage[g] + extra > cap:
                            b = -1
                            break
                    else:
                        if not guard_ok(i):
                            b = -1
                if b == -2:
                    started[i] = True
                    start[i] = t
                    e = end[i] = t + dur[i]
                    push(running, (e, i))
                    for g in rs:
                        on[g] = i
                    for g, extra, net in st:
                        on_settle[g] = net - extra
                        usage[g] += extra
                        committed[g] += net
                        if extra > 0:
                            pos_rem[g] -= extra
                    continue
                for g in (rs if b < 0 else (b,)):
                    w = waiters[g]
                    if w is None:
                        waiters[g] = [k]
                    else:
                        w.append(k)
            cand = set()
            if not running:
                for i in sorted((i for i in range(n) if not started[i] and not waiting[i]),
                                key=rank.__getitem__):
                    if self.blocker(i) is None:
                        self._start(i, t, running)
            if not running:
                raise RuntimeError("transition scheduler stalled: the serial order does not fit "
                                   "memory (a bug in the global DAG)")
            t = running[0][0]
            while running and running[0][0] <= t:
                _, i = pop(running)
                done += 1
                for g in res[i]:
                    on[g] = -1
                    w = waiters[g]
                    if w is not None:
                        cand.update(w)
                        waiters[g] = None
                for g, _, _ in steps[i]:
                    usage[g] += on_settle[g]
                for s in succ[i]:
                    waiting[s] -= 1
                    if not waiting[s]:
                        cand.add(rank[s])
        self.makespan = max(end, default=0.0)
        return self

    def _run_free(self) -> _Pass:
        """``_run_plain`` where memory binds nowhere (no tracked resource): a ready primitive
        starts as soon as its resources are free. One that cannot start now cannot before
        the last of its busy resources frees, so it is looked at again only then (if others
        took its resources meanwhile, again when they free): it starts at the same time as
        in ``_run_plain``, which looks at it whenever the first busy one frees."""
        n, res, succ, waiting = self.n, self.res, self.succ, self.waiting
        start, end, dur, rank = self.start, self.end, self.dur, self.rank
        by_rank = self.by or _rank_of(rank)
        push, pop = heapq.heappush, heapq.heappop
        until = [0.0] * len(self.on)  # per resource: when what started on it last ends
        # (free from then on: no ``on`` to clear when a primitive ends)
        wake: dict[float, list[int]] = {}  # an end time -> what to look at again then (ranks)
        running: list[tuple[float, int]] = []
        cand = [rank[i] for i in range(n) if not waiting[i]]
        t = 0.0
        done = 0
        while done < n:
            cand.sort()
            for k in cand:
                i = by_rank[k]
                rs = res[i]
                free = t
                for g in rs:
                    if until[g] > free:
                        free = until[g]
                if free > t:  # busy: look again when the last of its resources frees
                    w = wake.get(free)
                    if w is None:
                        wake[free] = [k]
                    else:
                        w.append(k)
                    continue
                start[i] = t
                e = end[i] = t + dur[i]
                push(running, (e, i))
                for g in rs:
                    until[g] = e
            if not running:
                raise RuntimeError("transition scheduler stalled (a cycle in the global DAG?)")
            t = running[0][0]
            cand = wake.pop(t, [])
            while running and running[0][0] <= t:
                i = pop(running)[1]
                done += 1
                for s in succ[i]:
                    waiting[s] -= 1
                    if not waiting[s]:
                        cand.append(rank[s])
        self.makespan = max(end, default=0.0)
        return self

    def run_serial(self) -> _Pass:
        """Serial schedule generation, where memory binds nowhere (``prob.free``): the
        primitives one at a time, the highest-priority one whose predecessors are all placed
        first, each at the earliest time after its predecessors end when all its resources are
        free for its whole duration, in a gap before primitives placed earlier if one fits.

        The passes above start whatever can start (non-delay schedules); an optimal schedule
        may need a GPU left idle for a primitive that comes later (random-256-2 of the
        benchmark: CP-SAT's optimal order in a parallel pass ends 22.6 % above the optimum,
        in this one at it). Every active schedule, an optimal one among them, is this pass of
        some order: fed the starts of a schedule, it never ends later."""
        n, dur, succ, res, rank = self.n, self.dur, self.succ, self.res, self.rank
        by_rank = self.by or _rank_of(rank)
        waiting, start, end = self.waiting, self.start, self.end
        ready = [0.0] * n  # the latest end among the predecessors placed so far
        # per resource: the busy intervals placed so far, sorted (starts, and ends to match)
        starts: list[list[float]] = [[] for _ in self.on]
        ends: list[list[float]] = [[] for _ in self.on]
        heap = [rank[i] for i in range(n) if not waiting[i]]
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            i = by_rank[pop(heap)]
            d, rs = dur[i], res[i]
            t = ready[i]
            moved = True
            while moved:  # past every interval in the way, until none is on any resource
                moved = False
                for g in rs:
                    ss, es = starts[g], ends[g]
                    k = bisect_right(ss, t) - 1
                    if k < 0 or es[k] <= t:
                        k += 1
                    while k < len(ss) and ss[k] < t + d:
                        t = es[k]
                        moved = True
                        k += 1
            start[i] = t
            e = end[i] = t + d
            for g in rs:
                k = bisect_right(starts[g], t)
                starts[g].insert(k, t)
                ends[g].insert(k, e)
            for s in succ[i]:
                if e > ready[s]:
                    ready[s] = e
                waiting[s] -= 1
                if not waiting[s]:
                    push(heap, rank[s])
        self.makespan = max(end, default=0.0)
        return self

    def _start(self, i: int, t: float, running: list[tuple[float, int]]) -> None:
        self.started[i] = True
        self.start[i] = t
        e = self.end[i] = t + self.dur[i]
        heapq.heappush(running, (e, i))
        on, on_settle, usage, committed, pos_rem = self.on, self.on_settle, self.usage, \
            self.committed, self.pos_rem
        for g in self.res[i]:
            on[g] = i
        for g, extra, net in self.steps[i]:
            on_settle[g] = net - extra
            usage[g] += extra
            committed[g] += net
            if extra > 0:
                pos_rem[g] -= extra


class _Search:
    """The rules, forward-backward improvement and perturbations, stopping at ``goal``."""

    def __init__(self, fwd: _Problem, goal: float, stages: Sequence[str]):
        self.fwd = fwd
        self.stage_rank = {s: k for k, s in enumerate(stages)}  # generation first
        self.goal = goal
        self.bound = fwd.bound  # raised by ``settled``
        self.tries = REFUTE_TRIES
        self.unrefuted = math.inf  # the least length ``refutes`` found no proof against
        self.checked: _Pass | None = None  # the last schedule ``done`` checked so
        self.n = len(fwd.dur)
        self._pos: list[int] | None = None
        self._tail: list[float] | None = None
        self._bwd: _Problem | None = None
        self._graph: tuple[list[list[int]], list[list[int]]] | None = None  # see ``graph``
        self.passes = 0

    def graph(self) -> tuple[list[list[int]], list[list[int]]]:
        """Per primitive its predecessors, and per resource its primitives: what the critical
        chain (``critical_moves``) and the edge-finding check (``settled``) walk back along."""
        if self._graph is None:
            fwd, n = self.fwd, self.n
            pred: list[list[int]] = [[] for _ in range(n)]
            users: list[list[int]] = [[] for _ in fwd.initial]
            for i in range(n):
                for s in fwd.succ[i]:
                    pred[s].append(i)
                for g in fwd.res[i]:
                    users[g].append(i)
            self._graph = pred, users
        return self._graph

    def pos(self) -> list[int]:
        """Each primitive's place in the serial order: what breaks ties in every order."""
        if self._pos is None:
            self._pos = _rank_of(list(self.fwd.order))
        return self._pos

    def set_tail(self, tail: list[float]) -> None:
        self._tail = tail

    def tail(self) -> list[float]:
        if self._tail is None:
            self._tail = self.fwd.tails()
        return self._tail

    def bwd(self) -> _Problem:
        if self._bwd is None:
            self._bwd = self.fwd.reversed()
        return self._bwd

    def rule(self, name: str) -> list[int]:
        """The primitives in the order a priority rule gives (highest priority first), ties
        broken by the serial order."""
        tail, prims, width = self.tail(), self.fwd.prims, self.fwd.width
        # stable sorts from the last key to the first, starting from the serial order: the
        # same order as one sort by (first key, ..., position in the serial order)
        if name == "wide":
            wide = [t * w for t, w in zip(tail, width)]  # tail x GPUs, largest first
            return sorted(self.fwd.order, key=wide.__getitem__, reverse=True)
        if name == "wide_succ":  # tail x GPUs x (1 + successors): a copy that seeds a node
            succ = self.fwd.succ  # (others copy from it) before one that feeds nothing
            wide = [t * w * (1 + len(s)) for t, w, s in zip(tail, width, succ)]
            return sorted(self.fwd.order, key=wide.__getitem__, reverse=True)
        by = sorted(self.fwd.order, key=tail.__getitem__, reverse=True)  # longest tail first
        if name == "release":  # Destroys first
            by.sort(key=[type(p) is not Destroy for p in prims].__getitem__)
        elif name in ("stage", "stage_rev"):  # one model-stage after another (they compete
            rank = self.stage_rank                # for the same GPUs' links)
            by.sort(key=[rank[p.stage] for p in prims].__getitem__, reverse=name != "stage")
        elif name != "tail":
            raise ValueError(f"unknown priority rule {name!r}")
        return by

    def run(self, prob: _Problem, rank: list[int], reserve: bool,
            by: list[int] | None = None) -> _Pass:
        self.passes += 1
        return _Pass(prob, rank, reserve, by).run()

    def run_rule(self, name: str, reserve: bool) -> _Pass:
        by = self.rule(name)
        return self.run(self.fwd, _rank_of(by), reserve, by)

    def run_any(self, rank: list[int]) -> _Pass:
        """The serial pass where memory binds nowhere (it reaches every active schedule),
        else the parallel one without reservations."""
        if not self.fwd.free:
            return self.run(self.fwd, rank, False)
        return self.run_serial(self.fwd, rank)

    def run_serial(self, prob: _Problem, rank: list[int]) -> _Pass:
        self.passes += 1
        return _Pass(prob, rank, False).run_serial()

    def critical_moves(self, run: _Pass) -> list[list[int]]:
        """Orders that each move one primitive of ``run``'s critical chain just ahead of the
        one it waited for on a shared resource, from the end of the chain back.

        The chain: from the primitive that ends last, back through what made each start when
        it did, a predecessor ending then or else a primitive on one of its resources ending
        then (it stops at one held back by memory). Only a change of order on that chain
        can end the schedule sooner; where its resources bind, the schedule ends at the bound
        only if a primitive with a longer path behind it goes first (random-256-2 of the
        benchmark: a 0.25 s copy that another 0.25 s copy follows waited on GPU 0 for a 0.28 s
        copy with nothing behind it, which it runs ahead of in CP-SAT's optimum: the schedule
        ended that late, 7.3 % above the optimum; 4.9 % with the move)."""
        fwd, n, pos = self.fwd, self.n, self.pos()
        pred, users = self.graph()
        start, end = run.start, run.end
        i = max(range(n), key=end.__getitem__, default=0)
        moves: list[list[int]] = []
        seen = {i}  # a primitive that takes no time ends as it starts: never go round
        while n and start[i] > 0:
            t = start[i]
            j = next((p for p in pred[i] if end[p] == t and p not in seen), -1)
            if j < 0:
                j = next((u for g in fwd.res[i] for u in users[g]
                          if u not in seen and end[u] == t), -1)
                if j < 0:
                    break
                key = list(start)
                key[i] = start[j]
                moves.append(_ranks([(key[k], k != i, pos[k]) for k in range(n)]))
            seen.add(j)
            i = j
        return moves

    def done(self, run: _Pass) -> bool:
        """Whether ``run`` meets the goal, or, once ``REFUTE_AFTER`` passes are spent, is
        ``settled`` (checked once per schedule)."""
        if run.makespan <= self.goal:
            return True
        if self.passes < REFUTE_AFTER or run is self.checked:
            return False
        self.checked = run
        return self.settled(run)

    def settled(self, run: _Pass) -> bool:
        """Whether ``run``, above the goal, is within ``TOLERANCE`` of the optimum after all:
        no schedule ends by its makespan / (1 + TOLERANCE) (``refutes``), which becomes the
        bound and the goal is met. Skipped once ``REFUTE_TRIES`` checks found no proof, and
        where an earlier check found none for a longer length (a shorter one has none
        either)."""
        if self.tries <= 0:
            return False
        limit = run.makespan / (1 + TOLERANCE)
        if limit >= self.unrefuted:
            return False
        fwd = self.fwd
        pred, users = self.graph()
        assert fwd.paths is not None
        if refutes(limit, fwd.dur, fwd.succ, pred, users, fwd.res, fwd.paths):
            self.bound, self.goal = limit, run.makespan
            return True
        self.tries -= 1
        self.unrefuted = limit
        return False

    def best(self) -> _Pass:
        fwd, n = self.fwd, self.n
        probe = self.run_rule(*PROBE)
        if self.done(probe):
            return probe
        rng = random.Random(n)  # deterministic: the same DAG always gets the same schedule
        best: _Pass | None = None
        moves: list[list[int]] = []  # ranks: the critical-chain moves of ``moved`` not yet run
        moved: _Pass | None = None
        k = 0
        for budget in WORK_BUDGETS:
            passes = min(MAX_PASSES, max(MIN_PASSES, budget // max(1, fwd.work)))
            while passes > 0:
                run: _Pass | None = None
                if k < len(STARTS):
                    name, reserve = STARTS[k]
                    if (name, reserve) == PROBE:
                        run = probe
                    else:
                        run = self.run_rule(name, reserve)
                else:  # change the best order found so far (iterated local search)
                    assert best is not None
                    if moved is not best:
                        moves, moved = self.critical_moves(best), best
                    if moves:  # first each move on its critical chain, then at random
                        reserve = False
                        run = self.run_any(moves.pop(0))
                    else:
                        reserve = rng.random() < 0.5
                        span = max(best.makespan, 1e-9) * JITTER
                        start, pos = best.start, self.pos()
                        rank = _ranks([(start[i] + span * rng.random(), pos[i])
                                       for i in range(n)])
                k += 1
                if run is None:
                    run = self.run(fwd, rank, reserve)
                passes -= 1
                if run.makespan > self.goal:
                    run, used = self.improve(run, passes, reserve)
                    passes -= used
                if best is None or run.makespan < best.makespan - 1e-12:
                    best = run
                # the probe's pass comes up among the starts only later
                lead = probe if probe.makespan < best.makespan - 1e-12 else best
                if self.done(lead):
                    return lead
        assert best is not None
        if probe.makespan < best.makespan - 1e-12:
            best = probe
        passes = CHAIN_PASSES
        while passes > 0 and best.makespan > self.goal:
            if moved is not best:
                moves, moved = self.critical_moves(best), best
            if not moves:
                break
            rank = moves.pop(0)
            run = self.run_any(rank)
            passes -= 1
            if run.makespan > self.goal:
                run, used = self.improve(run, passes, False)
                passes -= used
            if run.makespan < best.makespan - 1e-12:
                best = run
            if self.done(best):
                break
        return best

    def improve(self, run: _Pass, passes: int, reserve: bool) -> tuple[_Pass, int]:
        """Forward-backward improvement: right-justify in the order of the latest ends, then
        left-justify in the order of those starts (with and without reservations), while the
        makespan shrinks and stays above the goal; where memory binds nowhere, then the same
        with serial passes (``_Pass.run_serial``: they may leave a GPU idle for what comes
        next, which justifies some schedules the parallel passes cannot: random-256-6 of the
        benchmark ends 3.8 % above CP-SAT's optimum without them, 0.6 % with). Returns the
        best run and the passes spent."""
        n, pos = self.n, self.pos()
        used = 0
        if n < 2:
            return run, used
        # (passes a round costs, its right-justifying pass, its left-justifying passes)
        kinds: list[tuple[int, Callable[[list[int]], _Pass], Callable[[list[int]], _Pass]]] = [
            (3, lambda rank: self.run(self.bwd(), rank, reserve),
             lambda rank: min((self.run(self.fwd, rank, r) for r in (reserve, not reserve)),
                              key=lambda x: x.makespan))]
        if self.fwd.free:
            kinds.append((2, lambda rank: self.run_serial(self.bwd(), rank), self.run_any))
        for cost, right, left in kinds:
            for _ in range(IMPROVE_ROUNDS):
                if passes - used < cost or run.makespan <= self.goal:
                    break
                back = right(_ranks([(-run.end[i], pos[i]) for i in range(n)]))
                again = left(_ranks([(back.makespan - back.end[i], pos[i]) for i in range(n)]))
                used += cost
                if again.makespan >= run.makespan - 1e-12:
                    break
                run = again
        return run, used


def search(dag: TransitionDag, durations: Sequence[float]) -> Times:
    """Start and end times for every primitive of ``dag`` (a feasible one) with the given
    seconds: the first rule's pass when it is within ``TOLERANCE`` of the lower bound,
    otherwise the best the search finds within its budget."""
    dur = list(durations)
    fwd = _Problem.forward(dag, dur)
    bound = fwd.bound
    s = _Search(fwd, bound * (1 + TOLERANCE), dag.changed)
    if not fwd.tracked:  # no memory chains: the priorities' tails are the critical paths
        assert fwd.paths is not None
        s.set_tail(list(map(add, dur, fwd.paths[1])))
    best = s.best()
    return Times(tuple(best.start), tuple(best.end), best.makespan, s.bound, s.passes)
