"""The exact comparator: the same scheduling problem as a CP-SAT model (benchmarks and tests only).

Same DAG (state and resource edges), same durations, same rules as the list scheduler: one
interval per primitive, precedence along every edge, no two primitives on one GPU at once
(NoOverlap per GPU), and per-GPU memory as a reservoir: a primitive adds its buffers when it
starts and settles to its after-state when it ends, starting from the bytes resident before the
transition, never above capacity. Minimizes the makespan. Never on the controller's path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

from nereus.transition.cost import TransitionCost
from nereus.transition.global_dag import TransitionDag
from nereus.transition.primitives import Primitive
from nereus.transition.schedule import Schedule, fixed_schedule

TICKS_PER_S = 1_000_000  # durations in microseconds
# Memory in KiB. With raw bytes (1e10-1e11 per event on 80 GB GPUs) CP-SAT 9.x declared a
# transition INFEASIBLE whose list schedule the validator accepts (verl's colocated layout of
# Llama-3.1-8B to its best plan); in KiB it proves the same makespan optimal. What a primitive
# adds or keeps is rounded up and the room above what a GPU holds down, so a schedule the model
# accepts fits in bytes (each error under 1 KiB per event). The model is that much tighter than
# the bytes: a schedule within a few KiB of capacity fits the bytes and not the model.
BYTES_PER_UNIT = 1024


@dataclass(frozen=True)
class CpSatResult:
    status: str                   # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID
    makespan_s: float | None      # from the solution's starts and the float durations
    starts_s: tuple[float, ...]   # per DAG primitive (empty without a solution)
    wall_s: float
    bound_s: float                # the solver's lower bound on the makespan

    @property
    def optimal(self) -> bool:
        return self.status == "OPTIMAL"


def solve(dag: TransitionDag, cost: TransitionCost, *, time_limit_s: float = 10.0,
          workers: int = 8, hint: Schedule | None = None) -> CpSatResult:
    t0 = time.perf_counter()
    n = len(dag.primitives)
    dur_s = [cost.seconds(p) for p in dag.primitives]
    dur = [max(1, round(d * TICKS_PER_S)) for d in dur_s]
    horizon = sum(dur) + 1
    m = cp_model.CpModel()
    start = [m.new_int_var(0, horizon, f"s{i}") for i in range(n)]
    end = [m.new_int_var(0, horizon, f"e{i}") for i in range(n)]
    iv = [m.new_interval_var(start[i], dur[i], end[i], f"p{i}") for i in range(n)]
    for a, b, _ in dag.edges:
        m.add(start[b] >= end[a])
    on_gpu: dict[int, list[int]] = {}
    for i in range(n):
        for g in dag.memory[i]:
            on_gpu.setdefault(g, []).append(i)
    cap = dag.capacity_bytes
    for g, idx in on_gpu.items():
        if len(idx) > 1:
            m.add_no_overlap([iv[i] for i in idx])
        base = dag.initial_bytes.get(g, 0)
        worst = base + sum(max(0, dag.memory[i][g].extra) for i in idx)
        if worst <= cap:
            continue  # memory cannot bind on this GPU
        times, changes = [], []
        for i in idx:
            st = dag.memory[i][g]
            extra, net = _units_up(st.extra), _units_up(st.net)
            times += [start[i], end[i]]
            changes += [extra, net - extra]
        # the level counts from the bytes held before: it may rise to the room left, rounded
        # down (never negative while what is held fits), and every change is rounded up
        m.add_reservoir_constraint(times, changes, -(base // BYTES_PER_UNIT),
                                   (cap - base) // BYTES_PER_UNIT)
    makespan = m.new_int_var(0, horizon, "makespan")
    m.add_max_equality(makespan, end) if n else m.add(makespan == 0)
    m.minimize(makespan)
    if hint is not None and hint.feasible:
        by_key = {_key(p.primitive): p.start_s for p in hint.primitives}
        for i, p in enumerate(dag.primitives):
            if _key(p) in by_key:
                m.add_hint(start[i], round(by_key[_key(p)] * TICKS_PER_S))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = 0
    status = solver.solve(m)
    name = solver.status_name(status)
    wall = time.perf_counter() - t0
    bound = solver.best_objective_bound / TICKS_PER_S if n else 0.0
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatResult(name, None, (), wall, bound)
    starts = tuple(solver.value(start[i]) / TICKS_PER_S for i in range(n))
    mk = max((s + d for s, d in zip(starts, dur_s)), default=0.0)
    return CpSatResult(name, mk, starts, wall, bound)


def _units_up(nbytes: int) -> int:
    """Bytes in ``BYTES_PER_UNIT``, rounded up (toward more memory held)."""
    return -(-nbytes // BYTES_PER_UNIT)


def _key(p: Primitive) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    return (p.op, tuple(e.id for e in p.inputs), tuple(e.id for e in p.outputs))


def as_schedule(dag: TransitionDag, cost: TransitionCost, result: CpSatResult) -> Schedule:
    """The solver's solution as a :class:`Schedule` (times on the solver's microsecond grid),
    so the independent validator can check it like any other."""
    if not result.starts_s:
        raise ValueError(f"no solution to turn into a schedule (status {result.status})")
    ends = [s + max(1, round(cost.seconds(p) * TICKS_PER_S)) / TICKS_PER_S
            for s, p in zip(result.starts_s, dag.primitives)]
    return fixed_schedule(dag, cost, result.starts_s, ends)
