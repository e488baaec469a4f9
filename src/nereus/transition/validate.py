"""An independent check of a transition schedule: replay it step by step and list what breaks.

It shares no code path with the planner or the scheduler: it rebuilds the units of the current
plan itself, re-derives what every primitive must produce from the layout contract, counts
bytes from the cost layer's per-position state sizes, checks that every unit it counts as a
copy covers every logical tensor (from the sharding format) and holds its stage's whole state
(θ and ω when the stage trains), and works out which model-stages run concurrently from the
workflow and the plans. It checks that the DAG is acyclic and respected, no GPU runs two
primitives at once, no GPU is held by two concurrent model-stages, per-GPU memory stays within
capacity (counting, as the cost model's offload between phases has it, the units primitives
make and the current units a Split, Merge or Extend reads, and a running Split's staging
buffers by the runtime's formula, ``nereus.transition.workspace``), every model-stage keeps a
complete copy of its state at every moment (every stage the plans change or the schedule
touches), each primitive lasts its estimate (priced again by the transition cost model, under
the efficiencies the schedule names), the schedule's own memory timeline and L_tran agree with
the replay, and the end state realizes the target plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from nereus.cost.candidate import Layout
from nereus.cost.estimate import HEADROOM
from nereus.cost.state import emu_state_bytes
from nereus.plan.types import Plan
from nereus.spec.job import JobSpec
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import layout_problem, logical_params, shard_plan
from nereus.spec.workflow import Execution, Phase, StageKind
from nereus.transition.cost import TransitionCost
from nereus.transition.emu import Emu, Holds
from nereus.transition.primitives import Destroy, Extend, Merge, Split
from nereus.transition.schedule import Schedule, ScheduledPrimitive
from nereus.transition.sizes import StateSizes
from nereus.transition.workspace import split_staging_bytes, state_element_bytes

EPS = 1e-9


@dataclass(frozen=True)
class _Unit:
    id: str
    stage: str
    layout: Layout
    gpus: tuple[int, ...]


def _mapping_split(gpus: tuple[int, ...], lay: Layout, sub: Layout) -> list[tuple[int, ...]]:
    """Sub-unit GPU lists written straight from the contract's formula."""
    m_tp, m_pp = lay.tp // sub.tp, lay.pp // sub.pp
    units: dict[int, dict[int, int]] = {}
    for r in range(lay.pp):
        for t in range(lay.tp):
            j = (t % m_tp) + m_tp * (r % m_pp)
            t2, r2 = t // m_tp, r // m_pp
            units.setdefault(j, {})[r2 * sub.tp + t2] = gpus[r * lay.tp + t]
    return [tuple(units[j][s] for s in range(sub.size)) for j in range(m_tp * m_pp)]


def _mapping_merge(units: list[tuple[int, ...]], sub: Layout, lay: Layout) -> tuple[int, ...]:
    m_tp, m_pp = lay.tp // sub.tp, lay.pp // sub.pp
    out: dict[int, int] = {}
    for j, u in enumerate(units):
        for r2 in range(sub.pp):
            for t2 in range(sub.tp):
                t, r = t2 * m_tp + j % m_tp, r2 * m_pp + j // m_tp
                out[r * lay.tp + t] = u[r2 * sub.tp + t2]
    return tuple(out[i] for i in range(lay.size))


@lru_cache(maxsize=256)
def _complete(model: ModelSpec, head: Head, tp: int, pp: int) -> bool:
    """Whether the positions of a (tp, pp) unit together hold every row of every tensor."""
    if layout_problem(model, tp, pp):
        return False
    cover: dict[str, list[tuple[int, int]]] = {}
    for r in range(pp):
        for t in range(tp):
            for s in shard_plan(model, head, tp, pp, t, r):
                cover.setdefault(s.logical, []).append(
                    (s.start, min(s.stop, s.valid_stop)) if s.split_dim is not None else (0, -1))
    for p in logical_params(model, head):
        spans = cover.get(p.name)
        if not spans:
            return False
        if p.split_dim is None:
            continue
        reach = 0
        for a, b in sorted(spans):
            if a > reach:
                return False
            reach = max(reach, b)
        if reach < p.shape[p.split_dim]:
            return False
    return True


class _Job:
    """What the replay needs to know about the job, derived here from the spec."""

    def __init__(self, job: JobSpec, current: Plan, target: Plan):
        self.job = job
        wf = job.workflow
        self.head = {m.name: m.head for m in wf.models}
        self.model_of = {s.name: s.model for s in wf.stages}
        self.trains = {s.name: s.kind is StageKind.TRAIN and wf.model(s.model).trainable
                       for s in wf.stages}
        self.phase = {s.name: s.phase for s in wf.stages}
        self.async_ = wf.execution is Execution.ASYNC
        self.cap = int(HEADROOM * job.cluster.device.memory_bytes)
        self.changed = {sp.stage for sp in current.stages
                        if sorted((sp.tp, sp.pp, tuple(r)) for r in sp.replicas)
                        != sorted((target.stage(sp.stage).tp, target.stage(sp.stage).pp,
                                   tuple(r)) for r in target.stage(sp.stage).replicas)}
        self.loaded_at: dict[str, float] = {}  # current unit -> when it is loaded
        self.initial_ids = set(_units_of(current))
        self.rivals: dict[tuple[str, str], set[int]] = {}
        names = list(current.names)
        for a in names:
            for b in names:
                if a < b and (self._concurrent(current, a, b) or self._concurrent(target, a, b)):
                    shared: set[int] = set()
                    for plan in (current, target):
                        shared |= set(plan.stage(a).gpus) & set(plan.stage(b).gpus)
                    self.rivals[(a, b)] = shared

    def _concurrent(self, plan: Plan, a: str, b: str) -> bool:
        pa, pb = self.phase[a], self.phase[b]
        if pa == pb:
            grouped = any(a in g and b in g for g in plan.groups)
            return not grouped and not (set(plan.stage(a).gpus) & set(plan.stage(b).gpus))
        if self.async_ and (pa == Phase.GENERATION or pb == Phase.GENERATION):
            return not (set(plan.stage(a).gpus) & set(plan.stage(b).gpus))
        return False

    def bytes_at(self, u: _Unit, i: int) -> int:
        m = self.model_of[u.stage]
        return emu_state_bytes(self.job.model, self.head[m], u.layout, self.trains[u.stage],
                               self.job.workload, i % u.layout.tp, i // u.layout.tp)

    def staging_bytes(self, split: Split) -> int:
        """Bytes of the staging buffers each GPU of a running Split holds, by the runtime's
        formula (at the smallest all-gather chunk, the least it runs with)."""
        stage, lay = split.emu.stage, split.emu.layout
        return split_staging_bytes(self.job.model, self.head[self.model_of[stage]],
                                   (lay.tp, lay.pp), (split.sub.tp, split.sub.pp),
                                   state_element_bytes(self.job.workload, self.trains[stage]))

    def complete(self, u: _Unit) -> bool:
        return len(u.gpus) == u.layout.size and _complete(
            self.job.model, self.head[self.model_of[u.stage]], u.layout.tp, u.layout.pp)


def _units_of(plan: Plan) -> dict[str, _Unit]:
    return {f"{sp.stage}/{i}": _Unit(f"{sp.stage}/{i}", sp.stage, Layout(sp.tp, sp.pp), tuple(r))
            for sp in plan.stages for i, r in enumerate(sp.replicas)}


def _as_unit(e: Emu) -> _Unit:
    return _Unit(e.id, e.stage, Layout(e.layout.tp, e.layout.pp), tuple(e.gpus))


PRIMITIVES = (Split, Merge, Extend, Destroy)  # what the transition cost model prices


def validate(job: JobSpec, current: Plan, target: Plan, schedule: Schedule) -> list[str]:
    """Every rule the schedule breaks, as one line each; an empty list means it is valid."""
    if not schedule.feasible:
        return [f"schedule is infeasible: {schedule.reason}"]
    # a unit the model cannot be sharded into has no bytes for a copy to be priced by: say so
    # (a Destroy only tears one down; the copy rule then says it was never a copy)
    unshardable = [f"primitive {p.index} ({p.op} {p.stage}): unit {e.id} has layout {e.layout}, "
                   f"which the model cannot take: {why}"
                   for p in schedule.primitives
                   if type(p.primitive) in PRIMITIVES and p.op != "Destroy"
                   for e in (*p.primitive.inputs, *p.primitive.outputs)
                   for why in [layout_problem(job.model, e.layout.tp, e.layout.pp)] if why]
    if unshardable:
        return unshardable
    J = _Job(job, current, target)
    errs: list[str] = []
    prims = schedule.primitives
    n = len(prims)
    # a stage the schedule touches counts as changed, whatever the plans say of it: it must
    # keep a copy and its units' bytes count (else moving an unchanged stage escaped both)
    J.changed |= {p.stage for p in prims}
    # a current unit is on its GPUs if a Split, Merge or Extend reads it (else it is offloaded,
    # as between phases): from the start, or, as the schedule says, from the start of the
    # first that reads it; units the schedule makes are on their GPUs
    for p in prims:
        if p.op != "Destroy":
            for e in p.primitive.inputs:
                at = p.start_s if schedule.loads_on_first_read else -math.inf
                J.loaded_at[e.id] = min(J.loaded_at.get(e.id, math.inf), at)

    # the DAG: acyclic, deps respected
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for p in prims:
        for d in p.deps:
            if not 0 <= d < n:
                errs.append(f"primitive {p.index}: dependency {d} does not exist")
                continue
            g.add_edge(d, p.index)
            if prims[d].end_s > p.start_s + EPS:
                errs.append(f"primitive {p.index} ({p.op} {p.stage}) starts at {p.start_s:.6f} "
                            f"before its dependency {d} ends at {prims[d].end_s:.6f}")
    if not nx.is_directed_acyclic_graph(g):
        errs.append("the transition DAG has a cycle")
    if any(p.end_s < p.start_s - EPS or p.start_s < -EPS for p in prims):
        errs.append("a primitive has a negative duration or start")
    # its time in the schedule is its estimate (an exact solver's ticks: 1 us), priced here
    # again under the efficiencies the schedule names: a schedule that shortened a primitive
    # and its recorded duration together is caught
    cost = TransitionCost(job.cluster, StateSizes(job), schedule.efficiencies)
    for p in prims:
        if type(p.primitive) not in PRIMITIVES:  # the semantic checks say what is wrong
            continue
        est = cost.seconds(p.primitive)
        if abs(p.seconds - est) > 1e-6 + 1e-9 * est:
            errs.append(f"primitive {p.index} ({p.op} {p.stage}) lasts {p.seconds:.6f} s in the "
                        f"schedule, its estimate is {est:.6f} s")

    # what each primitive must produce, from the contract
    for p in prims:
        errs += _check_semantics(J, p)

    # replay
    alive = _units_of(current)
    for stage, units in schedule.initial.items():
        for e in units:
            u = alive.get(e.id)
            if u is None or u != _as_unit(e):
                errs.append(f"initial unit {e.id} is not replica {e.id} of the current plan")
    used_ids = set(alive)
    events: list[tuple[float, int, int]] = []  # (time, 0 = end / 1 = start, primitive)
    for p in prims:
        events.append((p.start_s, 1, p.index))
        events.append((p.end_s, 0, p.index))
    events.sort()
    running: dict[int, ScheduledPrimitive] = {}
    gpu_busy: dict[int, int] = {}
    peak: dict[int, int] = {}
    i = 0
    while i < len(events):
        t = events[i][0]
        batch = []
        while i < len(events) and events[i][0] <= t + EPS:
            batch.append(events[i])
            i += 1
        for _, kind, k in batch:
            if kind:
                continue
            p = prims[k]
            running.pop(k, None)
            for gpu in _gpus(p):
                if gpu_busy.get(gpu) == k:
                    del gpu_busy[gpu]
            for e in p.primitive.consumed:
                alive.pop(e.id, None)
            for e in p.primitive.outputs:
                alive[e.id] = _as_unit(e)
        for _, kind, k in batch:
            if not kind:
                continue
            p = prims[k]
            for e in p.primitive.inputs:
                if e.id not in alive or alive[e.id] != _as_unit(e):
                    errs.append(f"t={t:.6f}: {p.op} ({p.stage}) uses unit {e.id}, which is not "
                                "alive")
                for other in running.values():
                    if other is not p and e.id in {x.id for x in other.primitive.inputs}:
                        errs.append(f"t={t:.6f}: unit {e.id} is used by two running primitives")
            for e in p.primitive.outputs:
                if e.id in used_ids:
                    errs.append(f"t={t:.6f}: {p.op} creates id {e.id}, which was already used")
                used_ids.add(e.id)
            for gpu in _gpus(p):
                if gpu in gpu_busy:
                    errs.append(f"t={t:.6f}: GPU {gpu} runs primitives {gpu_busy[gpu]} and {k} "
                                "at once")
                gpu_busy[gpu] = k
            running[k] = p
        errs += _check_moment(J, t, alive, running, peak)
    # end state
    end: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}
    for u in alive.values():
        end.setdefault(u.stage, []).append((u.layout.tp, u.layout.pp, u.gpus))
    for sp in target.stages:
        want = sorted((sp.tp, sp.pp, tuple(r)) for r in sp.replicas)
        if sorted(end.get(sp.stage, [])) != want:
            errs.append(f"end state of {sp.stage} does not realize the target plan")
    for stage, units in schedule.final.items():
        for idx, e in enumerate(units):
            want_r = tuple(target.stage(stage).replicas[idx])
            if e.id not in alive or tuple(e.gpus) != want_r:
                errs.append(f"final[{stage}][{idx}] ({e.id}) is not the unit on replica {idx}")
    # the schedule's own figures
    makespan = max((p.end_s for p in prims), default=0.0)
    if abs(makespan - schedule.estimated_s) > 1e-6 * max(1.0, makespan):
        errs.append(f"estimated_s {schedule.estimated_s} differs from the last end {makespan}")
    reported = schedule.peak_bytes()
    for gpu, b in peak.items():
        if reported.get(gpu, 0) != b:
            errs.append(f"GPU {gpu}: the schedule reports a peak of {reported.get(gpu, 0)} bytes, "
                        f"the replay finds {b}")
    return errs


def _gpus(sp: ScheduledPrimitive) -> set[int]:
    """Every GPU a primitive occupies: those of its input and output units."""
    return {g for e in sp.primitive.inputs + sp.primitive.outputs for g in e.gpus}


def _check_semantics(J: _Job, sp: ScheduledPrimitive) -> list[str]:
    prim = sp.primitive
    op = prim.op
    ins = [_as_unit(e) for e in prim.inputs]
    outs = [_as_unit(e) for e in prim.outputs]
    where = f"primitive {sp.index} ({op})"
    errs = []
    if any(u.stage != prim.stage for u in ins + outs):
        errs.append(f"{where}: units of another model-stage")
    elif prim.stage not in J.model_of:
        errs.append(f"{where}: {prim.stage} is no model-stage of the job")
    else:  # every unit holds its stage's whole state: θ and ω when the stage trains
        want = Holds.THETA_OMEGA if J.trains[prim.stage] else Holds.THETA
        for e in prim.inputs + prim.outputs:
            if e.model != J.model_of[prim.stage] or e.holds is not want:
                errs.append(f"{where}: unit {e.id} holds {e.holds.value} of {e.model}; "
                            f"{prim.stage} needs {want.value} of {J.model_of[prim.stage]}")
    if op == "Split":
        (src,) = ins
        sub = outs[0].layout
        if src.layout.tp % sub.tp or src.layout.pp % sub.pp or len(outs) != \
                (src.layout.tp // sub.tp) * (src.layout.pp // sub.pp) or len(outs) < 2 or \
                any(o.layout != sub for o in outs):
            errs.append(f"{where}: {len(outs)} outputs of layouts "
                        f"{sorted({str(o.layout) for o in outs})} from {src.layout}: a split "
                        "makes k >= 2 units of one sub-layout, k = (tp/tp_sub)(pp/pp_sub)")
        elif [o.gpus for o in outs] != _mapping_split(src.gpus, src.layout, sub):
            errs.append(f"{where}: outputs do not follow the nesting mapping")
    elif op == "Merge":
        (dst,) = outs
        sub = ins[0].layout
        if any(u.layout != sub for u in ins) or dst.layout.tp % sub.tp or dst.layout.pp % sub.pp \
                or len(ins) != (dst.layout.tp // sub.tp) * (dst.layout.pp // sub.pp):
            errs.append(f"{where}: {len(ins)} inputs cannot merge into {dst.layout}")
        elif dst.gpus != _mapping_merge([u.gpus for u in ins], sub, dst.layout):
            errs.append(f"{where}: output does not follow the nesting mapping")
    elif op == "Extend":
        (src,) = ins
        (dst,) = outs
        if dst.layout != src.layout or set(dst.gpus) & set(src.gpus) or \
                len(dst.gpus) != len(src.gpus):
            errs.append(f"{where}: the copy must keep the layout on disjoint GPUs")
    elif op == "Destroy":
        if outs or len(ins) != 1:
            errs.append(f"{where}: destroys exactly one unit")
    else:
        errs.append(f"{where}: unknown primitive")
    return errs


def _check_moment(J: _Job, t: float, alive: dict[str, _Unit],
                  running: dict[int, ScheduledPrimitive],
                  peak: dict[int, int]) -> list[str]:
    errs: list[str] = []
    held: dict[str, _Unit] = dict(alive)
    dying: set[str] = set()
    on_host: set[str] = set()  # staged: the source position waits in host memory
    mem: dict[int, int] = {}
    for p in running.values():
        prim = p.primitive
        if isinstance(prim, Split) and prim.stage in J.changed:  # its all-gather's buffers
            work = J.staging_bytes(prim)
            for gpu in prim.emu.gpus:
                mem[gpu] = mem.get(gpu, 0) + work
        if prim.staged and prim.op == "Merge":  # the new shard comes once the old one is gone
            continue
        if prim.staged:
            on_host.update(e.id for e in prim.inputs)
        for e in prim.outputs:  # allocated when the primitive starts
            held[e.id] = _as_unit(e)
        if prim.op == "Destroy":
            dying.add(prim.inputs[0].id)
    owners: dict[int, set[str]] = {}
    for u in held.values():
        for i, gpu in enumerate(u.gpus):
            owners.setdefault(gpu, set()).add(u.stage)
            if u.stage in J.changed and u.id not in on_host and (
                    J.loaded_at.get(u.id, math.inf) <= t + EPS or u.id not in J.initial_ids):
                mem[gpu] = mem.get(gpu, 0) + J.bytes_at(u, i)
    for gpu, used in mem.items():
        peak[gpu] = max(peak.get(gpu, 0), used)
        if used > J.cap:
            errs.append(f"t={t:.6f}: GPU {gpu} holds {used} bytes, over the capacity {J.cap}")
    for gpu, stages in owners.items():
        for (a, b), shared in J.rivals.items():
            if a in stages and b in stages and gpu not in shared:
                errs.append(f"t={t:.6f}: GPU {gpu} is held by {a} and {b}, which run "
                            "concurrently")
    copies: dict[str, int] = {}
    for u in alive.values():
        if u.id not in dying and J.complete(u):
            copies[u.stage] = copies.get(u.stage, 0) + 1
    for stage in J.changed:
        if not copies.get(stage):
            errs.append(f"t={t:.6f}: no complete copy of {stage}'s state survives")
    return errs
