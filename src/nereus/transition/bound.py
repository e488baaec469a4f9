"""A lower bound on the makespan of a transition DAG: when to stop improving a schedule.

Two relaxations, each valid for every schedule the rules allow:

- the critical path: every primitive starts after its predecessors end;
- per GPU: the primitives that touch a GPU run one at a time, the first cannot start before
  the earliest head (critical path into it) among them, and after the last one ends its tail
  (critical path out of it) still has to run, so the GPU needs at least
  ``min head + sum of durations + min tail``.

Memory is relaxed away, so the bound can sit below the optimum when memory forces
serialization; on the benchmark instances it meets the CP-SAT optimum almost everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from operator import add

from nereus.transition.global_dag import TransitionDag


def critical_paths(dur: Sequence[float], succ: Sequence[Sequence[int]], order: Sequence[int]
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
                            critical_paths(dur, succ, order), dense, len(ids))


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


def makespan_lower_bound(dag: TransitionDag, durations: Sequence[float]) -> float:
    """The bound for ``dag`` with the given per-primitive seconds (estimated)."""
    succ: list[list[int]] = [[] for _ in dag.primitives]
    for a, b, _ in dag.edges:
        succ[a].append(b)
    return lower_bound(durations, succ, dag.order, [tuple(m) for m in dag.memory])
