"""The schedule of a transition and its result type: the global DAG's primitives placed in time.

The times come from list scheduling (``nereus.transition.search``: ready primitives side by side
on disjoint GPUs, memory-safe, one pass when it meets the lower bound). The makespan is
``L_tran``; the schedule records every GPU's bytes over time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nereus.cost.efficiency import Efficiencies
from nereus.transition.cost import Duration, TransitionCost
from nereus.transition.emu import Emu, renames
from nereus.transition.global_dag import RESOURCE, TransitionDag
from nereus.transition.primitives import MemStep, Primitive
from nereus.transition.search import search


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
    # how current units come onto their GPUs (``global_dag``): False, every unit a primitive
    # reads is loaded at the start; True, each by the first primitive that reads it
    loads_on_first_read: bool = False

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
                            "start_s": p.start_s, "end_s": p.end_s,
                            "staged": bool(p.primitive.staged)} for p in self.primitives],
            # how the peaks were counted: read units loaded at the start, or on first read
            "loads_on_first_read": self.loads_on_first_read,
        }


def infeasible_schedule(dag: TransitionDag, efficiencies: Efficiencies) -> Schedule:
    return Schedule(False, math.inf, (), {}, dag.capacity_bytes, dag.initial, dag.final,
                    efficiencies, dag.problem or "infeasible", dag.changed)


def list_schedule(dag: TransitionDag, cost: TransitionCost) -> Schedule:
    """The list schedule of a feasible ``dag`` (``nereus.transition.search``): one pass when
    it is within 1 % of the makespan's lower bound, more only when it is not."""
    durs = [cost.duration(p) for p in dag.primitives]
    times = search(dag, [d.seconds for d in durs])
    return _assemble(dag, cost, durs, times.start, times.end,
                     _timeline(dag, times.start, times.end))


def _timeline(dag: TransitionDag, start: Sequence[float], end: Sequence[float]
              ) -> dict[int, tuple[tuple[float, int], ...]]:
    """Every GPU's bytes over time, replayed from start and end times: (t, bytes from t on)
    steps, one per time at which the bytes change. Primitives on one GPU never overlap, so
    each GPU's changes in order of start are its changes in time (an end before a start at
    the same time)."""
    per: dict[int, list[tuple[float, float, int, int]]] = {}
    for i, m in enumerate(dag.memory):
        s, e = start[i], end[i]
        for g, st in m.items():
            up, down = st.during - st.before, st.after - st.during
            if up or down:
                lst = per.get(g)
                if lst is None:
                    per[g] = lst = []
                lst.append((s, e, up, down))
    init = dag.initial_bytes
    out: dict[int, tuple[tuple[float, int], ...]] = {g: ((0.0, b),) for g, b in init.items()}
    for g, lst in per.items():
        lst.sort()
        u = init.get(g, 0)
        steps: list[tuple[float, int]] = [(0.0, u)]
        for s, e, up, down in lst:
            if up:
                u += up
                _push(steps, s, u)
            if down:
                u += down
                _push(steps, e, u)
        out[g] = tuple(steps)
    return out


def _push(steps: list[tuple[float, int]], t: float, b: int) -> None:
    """Append (t, b): the last entry per time wins, and an entry that changes nothing goes."""
    if steps[-1][0] == t:
        steps[-1] = (t, b)
        if len(steps) > 1 and steps[-2][1] == b:
            steps.pop()
    elif steps[-1][1] != b:
        steps.append((t, b))


def _assemble(dag: TransitionDag, cost: TransitionCost, durs: Sequence[Duration],
              start: Sequence[float], end: Sequence[float],
              mem: Mapping[int, tuple[tuple[float, int], ...]]) -> Schedule:
    """Primitives ordered by start time (the serial order at ties), dependencies renumbered to
    that order."""
    n = len(dag.primitives)
    pos = [0] * n
    for k, i in enumerate(dag.order):
        pos[i] = k
    order = sorted(range(n), key=lambda i: (start[i], pos[i]))
    new = [0] * n
    for k, i in enumerate(order):
        new[i] = k
    deps: list[list[int]] = [[] for _ in range(n)]
    res: list[list[int]] = [[] for _ in range(n)]
    for a, b, kind in dag.edges:
        deps[b].append(new[a])
        if kind == RESOURCE:
            res[b].append(new[a])
    prims, memory = dag.primitives, dag.memory
    out = tuple(
        ScheduledPrimitive(k, prims[i], start[i], end[i], tuple(sorted(deps[i])),
                           tuple(sorted(res[i])), durs[i], memory[i])
        for k, i in enumerate(order))
    return Schedule(True, max(end, default=0.0), out, mem, dag.capacity_bytes, dag.initial,
                    dag.final, cost.eff, "", dag.changed,
                    loads_on_first_read=dag.loads_on_first_read)


def fixed_schedule(dag: TransitionDag, cost: TransitionCost, start: Sequence[float],
                   end: Sequence[float]) -> Schedule:
    """A schedule with given start and end times (e.g. an exact solver's), its memory timeline
    replayed from them. Nothing is checked here: that is the validator's job."""
    durs = [cost.duration(p) for p in dag.primitives]
    return _assemble(dag, cost, durs, start, end, _timeline(dag, start, end))
