"""The global transition DAG: local DAGs joined by resource edges (paper §6.1).

The local DAGs say what each model-stage must do; when model-stages share a near-capacity GPU
pool they do not say in which order. We replay the primitives one at a time from the current
state, releases first (Destroy, then Merge, which shrinks), acquisitions after in stage order
generation -> inference -> training. An acquisition that does not fit is blocked: it gets an
edge from Destroys that free the GPUs it needs, never from one that depends on it (so the DAG
stays acyclic), and waits for them. An Extend onto a GPU held by a model-stage that runs
concurrently with its own waits for that stage's Destroys there the same way, and every later
acquisition gets edges from the Destroys that cleared a rival off its GPUs, so no order of the
DAG lets two rivals meet. When nothing can run and something waits, the replay starts again
with the stuck primitives (and what they wait for) right after the Destroys: the order that got
stuck may have spent, on a growth nothing gives back, memory they needed. When that does not
help either, the replays run once more staging through host memory each Split or Merge that
no Destroy makes room for, when staged it fits; failing that, the transition is infeasible
and the reason (the first replay's) names the GPUs and the model-stages.

The replay order ``order`` fits memory one primitive at a time; the list scheduler uses it to
run primitives side by side without ever painting itself into a corner.

Memory follows the cost model's residency rule: between phases, idle model-stages are
offloaded to host memory, so at the boundary a current unit holds GPU memory only when a
primitive reads it (a Split, Merge or Extend): all of them from the start, which keeps the
acquisitions off the memory they take. When the loaded state does not fit at once, or no
replay fits that way, each unit is loaded by the first primitive that reads it and stays until
destroyed. Units of unchanged stages, units a transition only destroys and units it keeps as
they are stay offloaded (destroying one frees no GPU memory), and every unit a primitive makes
is on its GPUs. When neither fits, the transition is infeasible and says so (the controller
then tries moves of fewer model-stages). The runtime holds the state the same way
(``nereus.runtime.residency`` derives it from the schedule) and runs each GPU's primitives in
the schedule's order, so its bytes follow this timeline.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nereus.plan.types import Plan
from nereus.spec.cluster import format_gpus
from nereus.spec.job import JobSpec
from nereus.transition.cost import TransitionCost
from nereus.transition.emu import Emu, phi
from nereus.transition.local_dag import LocalDag, local_dag
from nereus.transition.ownership import Ownership
from nereus.transition.primitives import Destroy, Extend, MemStep, Merge, Primitive, Split
from nereus.transition.sizes import StateSizes, format_bytes

STATE = "state"        # edge kinds: a unit flows from one primitive to the next
RESOURCE = "resource"  # memory or GPU ownership: a Destroy must free GPUs first
# the advice where the moving stages' state does not fit at once (``in_two_moves`` acts on it)
FEWER_STAGES = "try moving fewer model-stages at a time"

_RANK = {Destroy: 0, Merge: 1, Split: 2, Extend: 3}  # release before acquire
MAX_REPLAYS = 4  # the paper's order, then up to three with stuck primitives promoted


@dataclass(frozen=True)
class TransitionDag:
    primitives: tuple[Primitive, ...]
    edges: tuple[tuple[int, int, str], ...]          # (before, after, kind)
    order: tuple[int, ...]                           # a serial order that fits memory
    memory: tuple[dict[int, MemStep], ...]           # per primitive, per GPU (dicts: the
    # compiled scheduler iterates them natively)
    initial_bytes: Mapping[int, int]                 # per GPU, before the first primitive
    capacity_bytes: int
    initial: Mapping[str, tuple[Emu, ...]]
    final: Mapping[str, tuple[Emu, ...]]
    changed: tuple[str, ...]                         # model-stages whose units change
    problem: str | None = None
    locals: Mapping[str, LocalDag] = field(default_factory=dict)
    loads_on_first_read: bool = False  # else every read unit is loaded from the start

    @property
    def feasible(self) -> bool:
        return self.problem is None

    def preds(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.primitives]
        for a, b, _ in self.edges:
            out[b].append(a)
        return out


def build_dag(job: JobSpec, current: Plan, target: Plan, cost: TransitionCost,
              capacity_bytes: int) -> TransitionDag:
    """The global DAG. When no replay fits, it is built once more from the local DAGs of
    ``local_dag(eager=False)``, where those differ: the eager fan-outs end sooner, but a source
    they pick (a unit due for destruction, or one a node-first order reaches) can leave two
    concurrent stages each waiting for the other's Destroy (random-64-2 of the transition
    benchmark; two (2, 1) trainers trading GPUs 8-11 on 16 GPUs), and the rules before them
    avoid it (or meet it instead). The first build is kept unless the second fits."""
    initial = phi(job, current)
    eager = _local_dags(job, current, target, cost, capacity_bytes, initial, eager=True)
    dag = _joined(job, current, target, cost, capacity_bytes, initial, eager)
    if dag.feasible or any(d.problem for d in eager.values()):
        return dag
    careful = _local_dags(job, current, target, cost, capacity_bytes, initial, eager=False)
    if careful == eager:  # the same primitives: the same replays
        return dag
    again = _joined(job, current, target, cost, capacity_bytes, initial, careful)
    return again if again.feasible else dag


def _local_dags(job: JobSpec, current: Plan, target: Plan, cost: TransitionCost,
                capacity_bytes: int, initial: Mapping[str, tuple[Emu, ...]], eager: bool
                ) -> dict[str, LocalDag]:
    """Each current model-stage's local DAG, in workflow stage order."""
    order = {s.name: i for i, s in enumerate(job.workflow.stage_order())}
    return {name: local_dag(initial[name], target.stage(name), job.model, cost, capacity_bytes,
                            eager=eager)
            for name in sorted(current.names, key=lambda n: order[n])}


def _joined(job: JobSpec, current: Plan, target: Plan, cost: TransitionCost,
            capacity_bytes: int, initial: Mapping[str, tuple[Emu, ...]],
            locals_: Mapping[str, LocalDag]) -> TransitionDag:
    """The local DAGs (of :func:`_local_dags`) joined by resource edges."""
    wf = job.workflow
    order = {s.name: i for i, s in enumerate(wf.stage_order())}
    names = list(locals_)
    final = {n: d.final for n, d in locals_.items()}
    changed = tuple(n for n in names if locals_[n].changed)

    def infeasible(problem: str) -> TransitionDag:
        return TransitionDag((), (), (), (), {}, capacity_bytes, initial, final, changed,
                             problem, locals_)

    problems = [d.problem for d in locals_.values() if d.problem]
    if problems:
        return infeasible("; ".join(problems))

    prims: list[Primitive] = []
    edges: list[tuple[int, int, str]] = []
    rank: list[tuple[int, int, int]] = []
    for name in changed:
        d = locals_[name]
        base = len(prims)
        for i, p in enumerate(d.primitives):
            prims.append(p)
            rank.append((_RANK[type(p)], order[name], i))
        edges += [(base + a, base + b, STATE) for a, b in d.edges]
    present: dict[int, dict[str, int]] = {}
    for name in names:
        for e in initial[name]:
            for g in e.gpus:
                present.setdefault(g, {})[name] = present.get(g, {}).get(name, 0) + 1
    own = Ownership.between(wf, current, target, names)
    # every current unit a primitive reads loaded from the start (which keeps acquisitions
    # off the memory the loads need); failing that, each loaded by its first reader (the peak
    # is lower, but the order it imposes scheduled random-256-2 of the benchmark 3.6 % longer)
    first: TransitionDag | None = None
    for just_in_time in (False, True):
        got = _replayed(list(prims), list(edges), rank, initial, changed, present, own, cost,
                        capacity_bytes, just_in_time)
        if isinstance(got, str):
            first = first or infeasible(got)
            continue
        mem, res, initial_bytes, prims_now = got
        return TransitionDag(tuple(prims_now), tuple(res.edges), tuple(res.order), tuple(mem),
                             initial_bytes, capacity_bytes, initial, final, changed, None,
                             locals_, just_in_time)
    assert first is not None
    return first


def _replayed(prims: list[Primitive], edges: list[tuple[int, int, str]],
              rank: Sequence[tuple[int, int, int]], initial: Mapping[str, tuple[Emu, ...]],
              changed: Sequence[str], present: Mapping[int, Mapping[str, int]], own: Ownership,
              cost: TransitionCost, capacity_bytes: int, just_in_time: bool
              ) -> tuple[list[dict[int, MemStep]], _Result, dict[int, int],
                         list[Primitive]] | str:
    """Memory per primitive and a replay order that fits it (or why none was found).

    ``just_in_time``: a current unit is loaded by the first primitive that reads it (Split,
    Merge, Extend; the others that read it touch the same GPUs, so they wait for that one at no
    cost) and stays until destroyed. Otherwise every current unit a primitive reads is loaded
    from the start. Either way one that is only destroyed, or kept as it is, stays offloaded,
    and its Destroy frees no GPU memory."""
    current_ids = {e.id for name in changed for e in initial[name]}  # new units: other ids
    readers: dict[str, list[int]] = {}
    for k, p in enumerate(prims):
        if type(p) is not Destroy:
            for e in p.inputs:
                if e.id in current_ids:
                    readers.setdefault(e.id, []).append(k)
    loads: dict[int, dict[int, int]] = {}  # primitive -> GPU -> bytes it loads there
    usage: dict[int, int] = {}
    linked = {(a, b) for a, b, _ in edges}
    for name in changed:
        for e in initial[name]:
            ks = readers.get(e.id)
            if not ks:
                continue
            b = cost.sizes.of(e)
            if not just_in_time:
                for i, g in enumerate(e.gpus):
                    usage[g] = usage.get(g, 0) + b[i]
                continue
            here = loads.setdefault(ks[0], {})
            for i, g in enumerate(e.gpus):
                here[g] = here.get(g, 0) + b[i]
            for k in ks[1:]:
                if (ks[0], k) not in linked:
                    linked.add((ks[0], k))
                    edges.append((ks[0], k, RESOURCE))
    mem = [loaded(p.memory(cost.sizes), loads.get(k)) for k, p in enumerate(prims)]
    for k, p in enumerate(prims):
        if type(p) is Destroy and p.emu.id in current_ids and p.emu.id not in readers:
            mem[k] = {g: MemStep(0, 0, 0) for g in p.emu.gpus}
    initial_bytes = dict(usage)
    crowded = sorted(g for g, b in usage.items() if b > capacity_bytes)
    if crowded:
        g = max(crowded, key=usage.__getitem__)
        here_ = sorted(n for n, k in present.get(g, {}).items() if k and n in changed)
        return (f"the changing model-stages' state does not fit on the GPUs at once: "
                f"{_gpus(crowded)} "
                f"would hold up to {format_bytes(usage[g])} (GPU {g}: {', '.join(here_)}; "
                f"capacity {format_bytes(capacity_bytes)} per GPU); {FEWER_STAGES}")
    # The paper's order first. If it gets stuck, an acquisition it ran early may have taken
    # memory that a stuck one needed and nothing gives back (a Split that grows a unit for
    # good): replay again with the stuck primitives and their ancestors first, a few times.
    # Only when no such order fits, a Split or Merge that nothing makes room for is staged
    # through host memory (slower: its host copies), and the replays run again.
    first: _Result | None = None
    for sizes in (None, cost.sizes):
        promoted: list[int] = []
        for _ in range(MAX_REPLAYS):
            # each replay stages on copies: what a failed order staged stays unstaged
            p_try, m_try = list(prims), list(mem)
            res = _Replay(p_try, m_try, rank, edges, dict(usage),
                          {g: dict(h) for g, h in present.items()}, own, capacity_bytes,
                          promoted, sizes, loads).run()
            if res.problem is None:
                return m_try, res, initial_bytes, p_try
            first = first or res
            new = [i for i in res.stuck if i not in promoted]
            if not new:
                break
            promoted += _with_ancestors(new, edges, promoted)
    assert first is not None and first.problem is not None
    return first.problem


def loaded(mem: dict[int, MemStep], loads: Mapping[int, int] | None
           ) -> dict[int, MemStep]:
    """A primitive's memory when it first loads units from host memory (``loads``: bytes per
    GPU): they are not on the GPU before it, and are from its start."""
    if not loads:
        return mem
    return {g: MemStep(m.before - loads.get(g, 0), m.during, m.after) for g, m in mem.items()}


def _with_ancestors(stuck: Sequence[int], edges: Sequence[tuple[int, int, str]],
                    skip: Sequence[int]) -> list[int]:
    """``stuck`` and everything they wait for along ``edges`` (state edges), minus ``skip``."""
    preds: dict[int, list[int]] = {}
    for a, b, _ in edges:
        preds.setdefault(b, []).append(a)
    seen = set(skip)
    out: list[int] = []
    stack = list(stuck)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        out.append(i)
        stack.extend(preds.get(i, ()))
    return out


@dataclass
class _Result:
    edges: list[tuple[int, int, str]]
    order: list[int]
    problem: str | None
    stuck: list[int] = field(default_factory=list)  # blocked primitives (when ``problem``)


class _Replay:
    """One-at-a-time replay that adds resource edges where an acquisition is blocked."""

    def __init__(self, prims: list[Primitive], mem: list[dict[int, MemStep]],
                 rank: Sequence[tuple[int, int, int]], edges: list[tuple[int, int, str]],
                 usage: dict[int, int], present: dict[int, dict[str, int]], own: Ownership,
                 cap: int, promoted: Sequence[int] = (), sizes: StateSizes | None = None,
                 loads: Mapping[int, Mapping[int, int]] | None = None):
        self.prims, self.mem, self.rank, self.edges = prims, mem, rank, list(edges)
        self.sizes = sizes  # to stage a Split or Merge through host memory (None: never)
        self.loads = loads or {}
        # heap keys: the rank, except that promoted primitives go right after the Destroys
        # (which only ever free memory and GPUs), in the order they were promoted
        self.key: Sequence[tuple[int, ...]] = rank
        if promoted:
            first = {i: k for k, i in enumerate(promoted)}
            self.key = [(0, 0, *r) if isinstance(p, Destroy) else
                        (1, first[i], *r) if i in first else (2, 0, *r)
                        for i, (p, r) in enumerate(zip(prims, rank))]
        self.usage, self.present, self.own, self.cap = usage, present, own, cap
        n = len(prims)
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.preds: list[set[int]] = [set() for _ in range(n)]
        for a, b, _ in self.edges:
            if a not in self.preds[b]:  # one pair may be a state and a resource edge
                self.succ[a].append(b)
                self.preds[b].add(a)
        self.waiting = [len(p) for p in self.preds]
        self.done = [False] * n
        self.destroys_on: dict[int, list[int]] = {}
        for i, p in enumerate(prims):
            if isinstance(p, Destroy):
                for g in p.gpus:
                    self.destroys_on.setdefault(g, []).append(i)
        self.departed: dict[int, dict[str, list[int]]] = {}  # gpu -> stage -> Destroys
        self.why: dict[int, str] = {}

    def run(self) -> _Result:
        key = self.key
        heap = [(key[i], i) for i in range(len(self.prims)) if not self.waiting[i]]
        heapq.heapify(heap)
        parked: list[int] = []
        order: list[int] = []
        while heap:
            _, i = heapq.heappop(heap)
            blocked = self._blocked(i)
            if blocked is None:
                self._execute(i)
                order.append(i)
                for s in self.succ[i]:
                    self.waiting[s] -= 1
                    if not self.waiting[s]:
                        heapq.heappush(heap, (key[s], s))
                if parked and self._releases(i):
                    for j in parked:
                        heapq.heappush(heap, (key[j], j))
                    parked = []
                continue
            deficits, rivals = blocked
            added = self._resource_edges(i, deficits, rivals)
            if added:
                continue  # waits for the new predecessors
            if deficits and not rivals and self._restage(i):
                heapq.heappush(heap, (key[i], i))  # fits now, staged through host memory
                continue
            parked.append(i)
        if len(order) < len(self.prims):
            stuck = parked or [i for i in range(len(self.prims)) if not self.done[i]][:1]
            held_up = parked or [i for i in self.why if not self.done[i]] or stuck
            return _Result(self.edges, order, "; ".join(self._reason(i) for i in stuck[:3]),
                           held_up)
        return _Result(self.edges, order, None)

    def _restage(self, i: int) -> bool:
        """Stage a Split or Merge that no Destroy makes room for through host memory, when
        that fits now (in this replay's lists)."""
        p = self.prims[i]
        if self.sizes is None or not isinstance(p, (Split, Merge)) or p.staged:
            return False
        q = replace(p, staged=True)
        mem = loaded(q.memory(self.sizes), self.loads.get(i))
        if any(self.usage.get(g, 0) + m.extra > self.cap for g, m in mem.items() if m.extra > 0):
            return False
        self.prims[i], self.mem[i] = q, mem
        return True

    def _releases(self, i: int) -> bool:
        return isinstance(self.prims[i], Destroy) or any(m.net < 0 for m in self.mem[i].values())

    def _blocked(self, i: int) -> tuple[dict[int, int], list[tuple[int, str]]] | None:
        deficits = {}
        for g, m in self.mem[i].items():
            if m.extra <= 0:
                continue  # takes no memory here (an Extend's source, a Destroy)
            over = self.usage.get(g, 0) + m.extra - self.cap
            if over > 0:
                deficits[g] = over
        rivals: list[tuple[int, str]] = []
        p = self.prims[i]
        if isinstance(p, Extend):
            mine = self.own.rivals_of(p.stage)
            if mine:
                for g in p.targets:
                    for other, n in self.present.get(g, {}).items():
                        if n and other in mine and g not in mine[other]:
                            rivals.append((g, other))
        if not deficits and not rivals:
            return None
        return deficits, rivals

    def _execute(self, i: int) -> None:
        p = self.prims[i]
        for g, m in self.mem[i].items():
            self.usage[g] = self.usage.get(g, 0) + m.net
        self.done[i] = True
        if isinstance(p, Extend):
            mine = self.own.rivals_of(p.stage)
            for g in p.targets:
                here = self.present.setdefault(g, {})
                here[p.stage] = here.get(p.stage, 0) + 1
                for other, ds in self.departed.get(g, {}).items():
                    if other in mine and g not in mine[other]:
                        for d in ds:
                            self._edge(d, i)
        elif isinstance(p, Destroy):
            for g in p.gpus:
                here = self.present[g]
                here[p.stage] -= 1
                self.departed.setdefault(g, {}).setdefault(p.stage, []).append(i)
        # Split and Merge keep one unit of their stage on each of their GPUs

    def _edge(self, a: int, b: int) -> bool:
        if a in self.preds[b]:
            return False
        self.preds[b].add(a)
        self.succ[a].append(b)
        self.edges.append((a, b, RESOURCE))
        if not self.done[a]:
            self.waiting[b] += 1
        return True

    def _descendants(self, i: int) -> set[int]:
        seen = {i}
        stack = [i]
        while stack:
            for s in self.succ[stack.pop()]:
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen

    def _resource_edges(self, i: int, deficits: Mapping[int, int],
                        rivals: Sequence[tuple[int, str]]) -> bool:
        desc = self._descendants(i)
        chosen: set[int] = set()
        stays: dict[str, list[int]] = {}  # rival stage -> GPUs it keeps
        lacks: dict[int, int] = {}  # GPU -> bytes no Destroy frees
        p = self.prims[i]
        for g, other in rivals:
            ds = [d for d in self.destroys_on.get(g, []) if not self.done[d]
                  and self.prims[d].stage == other]
            if not ds or any(d in desc for d in ds):
                stays.setdefault(other, []).append(g)
                continue
            chosen.update(ds)
        for g, over in sorted(deficits.items()):
            freed = sum(self.mem[d][g].before for d in chosen if g in self.mem[d])
            cands = sorted((d for d in self.destroys_on.get(g, [])
                            if not self.done[d] and d not in desc and d not in chosen
                            and self.mem[d][g].before > 0),  # an offloaded unit frees none
                           key=lambda d: self.rank[d])
            for d in cands:
                if freed >= over:
                    break
                chosen.add(d)
                freed += self.mem[d][g].before
            if freed < over:
                lacks[g] = over - freed
        added = False
        for d in sorted(chosen):
            added |= self._edge(d, i) and not self.done[d]
        reasons = _stay_clauses(stays, p.stage) + _lack_clauses(lacks)
        if reasons:
            self.why[i] = ", and ".join(reasons)
        return added

    def _reason(self, i: int) -> str:
        p = self.prims[i]
        # the GPUs it is blocked on: an Extend's memory steps include its source's GPUs too,
        # which hold the source's stage whether or not anything else is there
        gpus = p.targets if isinstance(p, Extend) else tuple(sorted(self.mem[i]))
        here = {s for g in gpus for s, n in self.present.get(g, {}).items() if n}
        moving = {q.stage for q in self.prims}  # loaded; the others stay offloaded
        held = ", ".join(sorted(here & moving)) or "nothing"
        if here - moving:
            held += f"; offloaded there: {', '.join(sorted(here - moving))}"
        why = self.why.get(i) or "its predecessors never run"
        what = f"{p.op} of {', '.join(e.id for e in p.inputs)}"
        gpus_ = p.targets if isinstance(p, Extend) else p.gpus
        what += f" {'onto' if isinstance(p, Extend) else 'on'} GPU{'s' * (len(gpus_) > 1)} " \
            f"{format_gpus(gpus_)}"
        return (f"{p.stage}: {what} is blocked ({why}; capacity {format_bytes(self.cap)} per "
                f"GPU; held by {held}) and no Destroy that runs before it frees them")


def _gpus(ids: Sequence[int]) -> str:
    """'GPU 3' or 'GPUs 0-63,72': a set of GPUs, as runs in increasing order."""
    ids = sorted(set(ids))
    return ("GPU " if len(ids) == 1 else "GPUs ") + format_gpus(ids)


def _stay_clauses(stays: Mapping[str, Sequence[int]], stage: str) -> list[str]:
    """One clause per rival model-stage that keeps GPUs ``stage`` needs, GPUs grouped:
    'GPUs 0-63 stay with actor_train, which runs concurrently with critic_train'."""
    out = []
    for other, gs in sorted(stays.items(), key=lambda kv: (min(kv[1]), kv[0])):
        verb = "stays" if len(set(gs)) == 1 else "stay"
        out.append(f"{_gpus(gs)} {verb} with {other}, which runs concurrently with {stage}")
    return out


def _lack_clauses(lacks: Mapping[int, int]) -> list[str]:
    """The memory the GPUs lack, one clause for all of them: 'GPU 3 lacks 1.2 GiB', 'GPUs 8-15
    each lack 1.2 GiB' or, when the amounts differ, 'GPUs 8-15 each lack up to 12.3 GiB'
    (the largest; what each GPU lacks is at most that)."""
    if not lacks:
        return []
    if len(lacks) == 1:
        (g, b), = lacks.items()
        return [f"GPU {g} lacks {format_bytes(b)}"]
    amounts = {format_bytes(b) for b in lacks.values()}
    most = format_bytes(max(lacks.values()))
    return [f"{_gpus(list(lacks))} each lack {'' if len(amounts) == 1 else 'up to '}{most}"]
