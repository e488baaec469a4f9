"""A lower bound on the makespan of a transition DAG: when to stop improving a schedule.

Two relaxations, each valid for every schedule the rules allow:

- the critical path: every primitive starts after its predecessors end;
- per GPU: the primitives that touch a GPU run one at a time, the first cannot start before
  the earliest head (critical path into it) among them, and after the last one ends its tail
  (critical path out of it) still has to run, so the GPU needs at least
  ``min head + sum of durations + min tail``.

Memory is relaxed away, so the bound can sit below the optimum when memory forces
serialization; on the benchmark instances it meets the CP-SAT optimum almost everywhere.

Where it does not, ``refutes`` proves for a given length that no schedule ends by then
(edge-finding on the GPUs, destructive lower bounding): the search asks it whether a schedule
it found is within tolerance of the optimum after all, before it spends its budget.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from operator import add

from nereus.transition.global_dag import TransitionDag


def critical_paths(dur: list[float], succ: list[list[int]], order: list[int]
                   ) -> tuple[list[float], list[float]]:
    """(head, tail) per primitive: the longest path into it and out of it after it ends,
    ``order`` being topological."""
    n = len(dur)
    head = [0.0] * n
    for i in order:
        h = head[i] + dur[i]
        for s in succ[i]:
            if h > head[s]:
                head[s] = h
    tail = [0.0] * n
    for i in reversed(order):
        t = 0.0
        for s in succ[i]:
            v = dur[s] + tail[s]
            if v > t:
                t = v
        tail[i] = t
    return head, tail


def lower_bound(dur: Sequence[float], succ: Sequence[Sequence[int]], order: Sequence[int],
                gpus: Sequence[Iterable[Hashable]],
                paths: tuple[Sequence[float], Sequence[float]] | None = None) -> float:
    """The bound for primitives with durations ``dur``, successors ``succ``, a topological
    ``order`` and the GPUs each touches (any hashable ids, or groups of GPUs always touched
    together); ``paths``: their ``critical_paths`` if already known."""
    ids: dict[Hashable, int] = {}
    dense = [[ids.setdefault(g, len(ids)) for g in touched] for touched in gpus]
    return bound_from_paths(dur, paths if paths is not None else
                            critical_paths(list(dur), [list(s) for s in succ], list(order)),
                            dense, len(ids))


def bound_from_paths(dur: Sequence[float], paths: tuple[Sequence[float], Sequence[float]],
                     gpus: Sequence[Sequence[int]], count: int) -> float:
    """``lower_bound`` from the ``critical_paths``, with the GPUs (or groups of GPUs) numbered
    0..count-1, each touched by some primitive."""
    head, tail = paths
    best = 0.0
    for v in map(add, map(add, head, dur), tail):
        if v > best:
            best = v
    # per GPU: the earliest head among its primitives, their durations, the least tail
    first = [math.inf] * count
    load = [0.0] * count
    last = [math.inf] * count
    for i, touched in enumerate(gpus):
        d, h, t = dur[i], head[i], tail[i]
        for g in touched:
            load[g] += d
            if h < first[g]:
                first[g] = h
            if t < last[g]:
                last[g] = t
    for h, w, t in zip(first, load, last):
        v = h + w + t
        if v > best:
            best = v
    return best


REFUTE_EPS = 1e-9  # seconds: a conclusion needs this much excess, so rounding never proves one
REFUTE_LOOKS = 8   # ``refutes`` looks at each GPU this many times on average at most


def _edge_find(tasks: Sequence[int], head: list[float], tail: Sequence[float],
               dur: Sequence[float], limit: float) -> list[tuple[int, float]] | None:
    """Edge-finding on one GPU (its primitives ``tasks`` run one at a time) for schedules that
    end by ``limit``: None if some of them cannot all fit between their earliest start
    (``head``) and latest end (``limit - tail``), else the raised heads [(primitive, head)].

    Why valid: for a set S of primitives on the GPU with latest end D(S) (the largest among
    them), the first of S starts no earlier than min head(S), and they run one after another,
    so the last ends no earlier than min head(S) + dur(S); if that exceeds D(S), no schedule
    ends by ``limit`` (the overload rule). For a primitive i outside S: if
    min head(S + i) + dur(S + i) > D(S), then S + i cannot end with a primitive of S, so i
    ends after all of S and starts no earlier than the time S needs,
    max over S' in S of min head(S') + dur(S') (the edge-finding rule). The sets looked at
    are the task intervals {j: head(j) >= h, latest end(j) <= d}; the two loops per d are the
    O(n^2) algorithm of Baptiste, Le Pape and Nuijten (Constraint-Based Scheduling, 2001, 3.1).
    Heads stay as given while looking (the rules use only what holds in every schedule ending
    by ``limit``), and the raises are returned, not applied.

    """
    by = sorted(tasks, key=head.__getitem__)
    m = len(by)
    hs = [head[j] for j in by]
    ds = [limit - tail[j] for j in by]
    ps = [dur[j] for j in by]
    raised = hs[:]
    ect = [0.0] * m  # per position: the time {task interval from that head on} needs
    inf = math.inf
    for d in set(ds):
        total = 0.0
        need = -inf
        for x in range(m - 1, -1, -1):  # heads from the latest: S grows to the left
            if ds[x] <= d:
                total += ps[x]
                v = hs[x] + total
                if v > need:
                    need = v
            ect[x] = need
        over = d + REFUTE_EPS
        if need > over:
            return None
        # heads from the earliest: ``total`` is the load of S's members not yet passed, and
        # ``lead`` the most that S's intervals starting at or before the head need
        lead = -inf
        for x in range(m):
            if ds[x] <= d:
                v = hs[x] + total
                if v > lead:
                    lead = v
                total -= ps[x]
            else:
                p = ps[x]
                if hs[x] + total + p > over and ect[x] > raised[x]:
                    raised[x] = ect[x]  # i after S = the interval of members behind it
                if lead + p > over and need > raised[x]:
                    raised[x] = need    # i after an interval that starts before it
    return [(by[x], raised[x]) for x in range(m) if raised[x] > hs[x]]


def refutes(limit: float, dur: Sequence[float], succ: Sequence[Sequence[int]],
            pred: Sequence[Sequence[int]], users: Sequence[Sequence[int]],
            gpus: Sequence[Sequence[int]], paths: tuple[Sequence[float], Sequence[float]]
            ) -> bool:
    """True if no schedule ends by ``limit``: then ``limit`` is a lower bound on the makespan
    (destructive lower bounding). ``users``: per GPU (or group of GPUs busy together) its
    primitives; ``gpus``: per primitive its GPUs by those numbers; ``paths``:
    ``critical_paths``.

    Why valid: in a schedule ending by ``limit``, every primitive starts no earlier than its
    head and leaves at least its tail after it ends; each deduction below holds in every such
    schedule, so one that contradicts itself (a primitive that does not fit between its head
    and ``limit`` minus its tail, or a GPU overloaded) shows there is none. The deductions:
    ``_edge_find`` on each GPU, forward (heads) and on the reversed problem (tails: a schedule
    read backwards from ``limit`` is one of the reversed DAG), and along the edges (a
    successor's head is at least the end of its predecessor's earliest run, a predecessor's
    tail at least its successor's duration and tail), until nothing changes. Memory is
    relaxed away, as in ``lower_bound``. False means only that these rules find nothing (or
that they kept finding for longer than ``REFUTE_LOOKS`` allows).
    """
    head, tail = list(paths[0]), list(paths[1])
    over = limit + REFUTE_EPS
    for h, d, t in zip(head, dur, tail):
        if h + d + t > over:
            return True
    load = [sum(dur[j] for j in tasks) for tasks in users]
    dirty = set(range(len(users)))
    looks = REFUTE_LOOKS * len(users)  # at most this many GPUs looked at: then give up
    while dirty and looks > 0:
        looks -= 1
        k = dirty.pop()
        tasks, room = users[k], limit - load[k]
        # a GPU whose every primitive has a window (latest end - head) at least its load gets
        # nothing from the rules: S's latest end belongs to some j in S with head(j) >=
        # min head(S), so they need dur(S) > j's window
        for j in tasks:
            if head[j] + tail[j] > room:
                break
        else:
            continue
        for near, far, nxt in ((head, tail, succ), (tail, head, pred)):
            raised = _edge_find(tasks, near, far, dur, limit)
            if raised is None:
                return True
            stack = []
            for j, v in raised:
                if v > near[j]:
                    near[j] = v
                    stack.append(j)
            while stack:  # along the edges, marking the GPUs of what changed
                j = stack.pop()
                if near[j] + dur[j] + far[j] > over:
                    return True
                dirty.update(gpus[j])
                v = near[j] + dur[j]
                for s in nxt[j]:
                    if v > near[s]:
                        near[s] = v
                        stack.append(s)
    return False


def makespan_lower_bound(dag: TransitionDag, durations: Sequence[float]) -> float:
    """The bound for ``dag`` with the given per-primitive seconds (estimated)."""
    succ: list[list[int]] = [[] for _ in dag.primitives]
    for a, b, _ in dag.edges:
        succ[a].append(b)
    return lower_bound(durations, succ, dag.order, [tuple(m) for m in dag.memory])
