"""The schedule of a transition: list scheduling of the global DAG, and its result type.

Ready primitives run side by side on disjoint GPUs; one starts when its predecessors are done,
none of its GPUs is busy, and every GPU it touches has the memory its buffers need. Destroys go
first (release before acquire), then the primitive with the longest path to the end. A
primitive may jump ahead of the DAG's memory-safe serial order (``TransitionDag.order``) only
if, on every GPU where it keeps memory, the rest of that order still fits afterwards: so the
scheduler never takes memory that a later primitive needs and nothing releases. The makespan is
``L_tran``; the schedule records every GPU's bytes over time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass
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


def list_schedule(dag: TransitionDag, cost: TransitionCost) -> Schedule:
    prims = dag.primitives
    n = len(prims)
    cap = dag.capacity_bytes
    durs = [cost.duration(p) for p in prims]
    dur = [d.seconds for d in durs]
    succ: list[list[int]] = [[] for _ in range(n)]
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b, _ in dag.edges:
        succ[a].append(b)
        preds[b].append(a)
    pos = [0] * n
    for k, i in enumerate(dag.order):
        pos[i] = k
    tail = [0.0] * n
    for i in reversed(dag.order):
        tail[i] = dur[i] + max((tail[s] for s in succ[i]), default=0.0)
    prio = [(0 if isinstance(prims[i], Destroy) else 1, -tail[i], pos[i]) for i in range(n)]

    gpus = [tuple(dag.memory[i]) for i in range(n)]
    steps = [tuple((g, m.extra, m.net) for g, m in dag.memory[i].items()) for i in range(n)]
    usage: dict[int, int] = dict(dag.initial_bytes)
    committed: dict[int, int] = dict(dag.initial_bytes)
    rem: dict[int, list[tuple[int, int, int]]] = {}  # per GPU: (primitive, extra, net), serial order
    pos_rem: dict[int, int] = {}     # per GPU, sum of positive extras not yet started
    for i in dag.order:
        for g, extra, net in steps[i]:
            rem.setdefault(g, []).append((i, extra, net))
            pos_rem[g] = pos_rem.get(g, 0) + max(0, extra)
            usage.setdefault(g, 0)
            committed.setdefault(g, 0)
    started = [False] * n
    busy: set[int] = set()
    waiting = [len(p) for p in preds]
    ready_on: dict[int, set[int]] = {}
    timeline: dict[int, list[tuple[float, int]]] = {g: [(0.0, b)] for g, b in usage.items()}

    def guard_ok(i: int) -> bool:
        for g, extra, net in steps[i]:
            if net <= 0:
                continue
            cur = committed[g] + net
            if cur + pos_rem[g] - max(0, extra) <= cap:
                continue
            for r, e2, n2 in rem[g]:
                if started[r] or r == i:
                    continue
                if cur + e2 > cap:
                    return False
                cur += n2
        return True

    def can_start(i: int) -> bool:
        for g in gpus[i]:
            if g in busy:
                return False
        for g, extra, _ in steps[i]:
            if usage[g] + extra > cap:
                return False
        return guard_ok(i)

    start = [0.0] * n
    end = [0.0] * n
    running: list[tuple[float, int]] = []
    cand = {i for i in range(n) if not waiting[i]}
    for i in cand:
        for g in gpus[i]:
            ready_on.setdefault(g, set()).add(i)
    t = 0.0
    done = 0
    while done < n:
        for i in sorted(cand, key=prio.__getitem__):
            if started[i] or not can_start(i):
                continue
            started[i] = True
            start[i] = t
            end[i] = t + dur[i]
            heapq.heappush(running, (end[i], i))
            for g, extra, net in steps[i]:
                busy.add(g)
                usage[g] += extra
                committed[g] += net
                pos_rem[g] -= max(0, extra)
                ready_on[g].discard(i)
                if extra:
                    timeline[g].append((t, usage[g]))
        cand = set()
        if not running:
            raise RuntimeError("transition scheduler stalled: the serial order does not fit "
                               "memory (a bug in the global DAG)")
        t = running[0][0]
        while running and running[0][0] <= t:
            _, i = heapq.heappop(running)
            done += 1
            for g, extra, net in steps[i]:
                busy.discard(g)
                usage[g] += net - extra
                if net - extra:
                    timeline[g].append((t, usage[g]))
                cand |= ready_on.get(g, set())
            for s in succ[i]:
                waiting[s] -= 1
                if not waiting[s]:
                    cand.add(s)
                    for g in gpus[s]:
                        ready_on.setdefault(g, set()).add(s)
        cand = {i for i in cand if not started[i]}

    order = sorted(range(n), key=lambda i: (start[i], pos[i]))
    new = {old: k for k, old in enumerate(order)}
    resource = {(a, b) for a, b, kind in dag.edges if kind == RESOURCE}
    out = tuple(
        ScheduledPrimitive(k, prims[i], start[i], end[i],
                           tuple(sorted(new[a] for a in preds[i])),
                           tuple(sorted(new[a] for a in preds[i] if (a, i) in resource)),
                           durs[i], dag.memory[i])
        for k, i in enumerate(order))
    mem = {g: tuple(_compact(v)) for g, v in timeline.items()}
    return Schedule(True, max(end, default=0.0), out, mem, cap, dag.initial, dag.final,
                    cost.eff, "", dag.changed)


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
