"""Exact plan search (Eq. 1): one candidate per model-stage, minimal critical path, within the
pool and 90 % of device memory on every GPU.

Structure of the search (all of it exact under the cost model):
1. Per stage, the memory-feasible candidates no other beats on (GPUs, latency, resident bytes,
   transient bytes) (``candidates.stage_options``).
2. Per phase, every partition of its stages into groups. A group shares one GPU set and runs
   its stages one after another: its latency is their sum, its size the largest GPU count, and it
   fits when (sum of resident state) + (largest transient need) <= 90 % of memory. Groups run
   concurrently on disjoint GPUs, so a phase's latency is the largest of its groups' under a
   GPU budget: a min-max knapsack solved over Pareto points (GPUs, latency).
3. Phases of a synchronous step add up; the weight sync couples the actor's training and
   generation stages, so the search conditions on the training layout (a handful) and adds
   each generation candidate's sync cost under it. In synchronous execution the sync also
   depends on how many GPUs training uses (generation GPUs beyond them hold no training shard),
   so for each training GPU count T the generation phase is solved with the sync priced at T;
   the training phase restricted to T is solved only where the unrestricted training optimum
   plus that generation optimum (a lower bound) could still beat the best plan so far. In
   asynchronous execution generation runs on GPUs disjoint from inference and training, and the
   interval is max(gen, inf + train) + sync. The sync cost depends on the two layouts, the two
   GPU counts and the job (execution mode, pool) only, never on placement
   (``CostModel.weight_sync``), which is what keeps this decomposition exact.

Placement then realizes the priced sync: training on the pool's fullest nodes, generation on
the training GPUs first. The plan prices its sync from its GPU ids; that differs from the
search's figure only where placement gave way (a preference that would cost a node-contained
TP group) or with replicas spread over nodes (``spread``), which places by exposure instead.
Where the packed plan's sync crosses nodes, ``Planner.best`` also searches the plans with
replicas spread over nodes and returns the faster: spread training syncs inside the nodes, which
the count model, with training packed, cannot price.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel, Evaluation, Links
from nereus.errors import InfeasibleError, count
from nereus.plan.candidates import StageOptions, pareto_mask, stage_options
from nereus.plan.exposure import spans_nodes
from nereus.plan.overlap import step_and_terms
from nereus.plan.placement import (
    GroupAssignment,
    lay,
    place_phase,
    split_pool,
    take_blocks,
    tp_blocks,
    tp_groups_off_node,
    unit_of,
)
from nereus.plan.types import Plan, StagePlan, idle_bytes, weight_sync_estimate
from nereus.plan.validate import blocks_of, contained_stages, merge_need, need_of
from nereus.spec.cluster import GpuPool
from nereus.spec.device import gib
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, ModelStage, Phase, StageKind

# which candidates of a model-stage a search may use (``Planner``'s ``keep``)
Keep = Callable[[ModelStage, Candidate], bool]


@dataclass(frozen=True)
class GroupChoice:
    """Stages sharing one GPU set, their candidates and their latencies (without sync)."""

    stages: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    latencies: tuple[float, ...]

    @property
    def gpus(self) -> int:
        return max(c.gpus for c in self.candidates)


@dataclass(frozen=True)
class Point:
    """A way to run a phase (or part of one): GPUs used, latency, and the choices behind it."""

    gpus: int
    latency: float
    groups: tuple[GroupChoice, ...]
    extra: float = 0.0  # latency added on top of the estimates (weight sync) inside ``latency``


def pareto(points: Sequence[Point]) -> list[Point]:
    """Points sorted by GPUs with strictly falling latency (a step function of the budget)."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.gpus, p.latency)):
        if not out or p.latency < out[-1].latency - 1e-12:
            out.append(p)
    return out


def set_partitions(items: Sequence[str]) -> Iterator[list[tuple[str, ...]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [(first,), *part]
        for i in range(len(part)):
            yield [*part[:i], (first, *part[i]), *part[i + 1:]]


def group_points(members: Sequence[StageOptions], limit: float, budget: int,
                 extra: Mapping[str, np.ndarray] | None = None) -> list[Point]:
    """Pareto points (GPUs, latency) of one group of stages sharing a GPU set.

    The group is as large as its largest member, its latency is the members' sum, and it fits
    when the members' resident state plus the largest transient need stays within ``limit``.
    For each group size the fastest members are tried first; only when their memory does not
    fit together does the search enumerate the combinations (pruned to Pareto sets).
    """
    extra = extra or {}
    adds = [extra.get(o.stage.name, np.zeros(len(o))) for o in members]
    if len(members) == 1:
        o, add = members[0], adds[0]
        lat = o.latency + add
        # the step function's corners first (sorted by GPUs, strictly falling latency), then
        # only those become points
        order = np.lexsort((lat, o.gpus))
        order = order[o.gpus[order] <= budget]
        ordered = lat[order]
        best_lat = np.minimum.accumulate(ordered)
        corner = np.ones(len(order), dtype=bool)
        corner[1:] = ordered[1:] < best_lat[:-1] - 1e-12
        corners = order[corner]
        # read as Python numbers once (a search makes thousands of these points)
        name, cands = (o.stage.name,), o.candidates
        return pareto([Point(g, t, (GroupChoice(name, (cands[i],), (own,)),), x)
                       for i, g, t, own, x in zip(corners.tolist(), o.gpus[corners].tolist(),
                                                  lat[corners].tolist(),
                                                  o.latency[corners].tolist(),
                                                  add[corners].tolist())])
    if any(o.stage.kind is StageKind.GENERATE for o in members):
        # a generation engine takes the memory it is given for its KV cache (vLLM's
        # gpu_memory_utilization), so it never shares its GPU set inside the phase
        return []
    gpus = np.unique(np.concatenate([o.gpus for o in members]))
    sizes = [int(g) for g in gpus[gpus <= budget]]
    lats = [o.latency + add for o, add in zip(members, adds)]
    tables = [_fastest_within(lat, o.gpus) for o, lat in zip(members, lats)]
    # Python lists: the loop below reads a few entries per size
    lat_l = [lat.tolist() for lat in lats]
    own_l = [o.latency.tolist() for o in members]
    add_l = [add.tolist() for add in adds]
    res_l = [o.resident.tolist() for o in members]
    tra_l = [o.transient.tolist() for o in members]
    gpu_l = [o.gpus.tolist() for o in members]
    names = tuple(o.stage.name for o in members)
    pts: list[Point] = []
    for size in sizes:
        picks: list[int] = []
        for counts, fastest in tables:
            k = bisect_right(counts, size) - 1
            if k < 0:
                break
            picks.append(fastest[k])
        if len(picks) < len(members):
            continue  # a member has no option on this few GPUs
        res = sum(r[i] for r, i in zip(res_l, picks))
        tra = max(t[i] for t, i in zip(tra_l, picks))
        if res + tra <= limit:
            best = picks
        else:
            masks = [o.gpus <= size for o in members]
            found = _exhaustive(members, masks, adds, limit)
            if found is None:
                continue
            best = found
        total = sum(lat[i] for lat, i in zip(lat_l, best))
        used = max(g[i] for g, i in zip(gpu_l, best))
        choice = GroupChoice(names, tuple(o.candidates[i] for o, i in zip(members, best)),
                             tuple(t[i] for t, i in zip(own_l, best)))
        pts.append(Point(used, total, (choice,), sum(a[i] for a, i in zip(add_l, best))))
    return pareto(pts)


def _fastest_within(lat: np.ndarray, gpus: np.ndarray) -> tuple[list[int], list[int]]:
    """For each GPU count among ``gpus`` (ascending), the option ``np.argmin`` would pick of
    those on at most that many GPUs: the lowest ``lat``, of equal ones the first. One sort
    per group, instead of a masked argmin per member and GPU count."""
    order = np.lexsort((lat, gpus))  # by GPUs, then latency; stable, so then by index
    g = gpus[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1]))).tolist()
    counts: list[int] = []
    fastest: list[int] = []
    best_t, best_i = math.inf, -1
    for s in starts:
        i = int(order[s])  # the fastest on exactly this many GPUs
        t = float(lat[i])
        if best_i < 0 or t < best_t or (t == best_t and i < best_i):
            best_t, best_i = t, i
        counts.append(int(g[s]))
        fastest.append(best_i)
    return counts, fastest


def _exhaustive(members: Sequence[StageOptions], masks: Sequence[np.ndarray],
                adds: Sequence[np.ndarray], limit: float) -> list[int] | None:
    """Fastest feasible combination among members restricted by ``masks``."""
    idxs = []
    for o, m, add in zip(members, masks, adds):
        sub = np.flatnonzero(m)
        keep = pareto_mask([o.latency[sub] + add[sub], o.resident[sub], o.transient[sub]])
        idxs.append(sub[keep])
    k = len(members)
    lat = np.zeros([len(i) for i in idxs])
    res = np.zeros_like(lat)
    tra = np.zeros_like(lat)
    for axis, (o, ix, add) in enumerate(zip(members, idxs, adds)):
        view = [1] * k
        view[axis] = len(ix)
        lat = lat + (o.latency[ix] + add[ix]).reshape(view)
        res = res + o.resident[ix].reshape(view)
        tra = np.maximum(tra, o.transient[ix].reshape(view))
    lat = np.where(res + tra <= limit, lat, np.inf)
    flat = int(np.argmin(lat))
    if not np.isfinite(lat.flat[flat]):
        return None
    pos = np.unravel_index(flat, lat.shape)
    return [int(ix[p]) for ix, p in zip(idxs, pos)]


def combine(a: Sequence[Point], b: Sequence[Point], budget: int) -> list[Point]:
    """Two parts running side by side on disjoint GPUs: the Pareto points of every pair, as
    ``pareto`` would pick them from all pairs in order, but only the survivors are built."""
    if not a or not b:
        return []
    ga = np.array([p.gpus for p in a])
    gb = np.array([q.gpus for q in b])
    gpus = ga[:, None] + gb[None, :]
    lat = np.maximum(np.array([p.latency for p in a])[:, None],
                     np.array([q.latency for q in b])[None, :])
    i, j = np.nonzero(gpus <= budget)  # pairs in the order a nested loop visits them
    g, lt = gpus[i, j], lat[i, j]
    out: list[Point] = []
    last = math.inf
    for k in np.lexsort((lt, g)).tolist():  # stable: ties keep the visiting order
        if not out or lt[k] < last - 1e-12:
            p, q = a[i[k]], b[j[k]]
            out.append(Point(p.gpus + q.gpus, max(p.latency, q.latency), p.groups + q.groups,
                             max(p.extra, q.extra)))
            last = lt[k]
    return out


def phase_points(options: Mapping[str, StageOptions], stages: Sequence[ModelStage], limit: float,
                 budget: int, extra: Mapping[str, np.ndarray] | None = None,
                 cache: dict[object, list[Point]] | None = None,
                 shared: dict[object, list[Point]] | None = None,
                 varying: frozenset[str] = frozenset()) -> list[Point]:
    """Pareto points (GPUs, latency) of one phase over every grouping of its stages.

    Group points are kept in ``cache``; with ``shared``, those of groups without a ``varying``
    stage (whose options and extras never change between calls) go there instead."""
    names = [s.name for s in stages]
    cache = {} if cache is None else cache
    found: list[Point] = []
    for part in set_partitions(names):
        acc: list[Point] | None = None
        for grp in part:
            key = (grp, budget)
            store = cache if shared is None or varying.intersection(grp) else shared
            pts = store.get(key)
            if pts is None:
                pts = group_points([options[n] for n in grp], limit, budget, extra)
                store[key] = pts
            acc = pts if acc is None else combine(acc, pts, budget)
            if not acc:
                break
        if acc:
            found += acc
    return pareto(found)


def _fits_nowhere(cost: CostModel, stage: ModelStage, ev: Evaluation | None) -> InfeasibleError:
    limit = HEADROOM * cost.device.memory_bytes
    if ev is None or not len(ev.candidates):
        return InfeasibleError(
            f"model-stage {stage.name} has no valid layout on {count(cost.job.pool.size, 'GPU')} "
            f"(batch {cost.stage_batch(stage)} sequences, model {cost.job.model.name})")
    small = cost.estimate(stage, ev.candidates[int(np.argmin(ev.peak))])
    # no ZeRO: a replica's GPUs share its state, so they are at least its bytes over the limit;
    # said only where that is the reason: more than the widest layout the pool allows spans
    # (70B on 24 GPUs needs 17, and tp x pp reaches 16 there, not 24)
    state = cost.resident_bytes(stage, Layout(1, 1))  # one replica's state, unsharded
    need = math.ceil(state / limit)
    widest = max(c.layout.tp * c.layout.pp for c in ev.candidates)
    why = (f"; its state alone, {gib(state)}, needs at least {count(need, 'GPU')} per "
           f"replica, and the widest layout on {count(cost.job.pool.size, 'GPU')} spans {widest}"
           if need > widest else "")
    return InfeasibleError(
        f"model-stage {stage.name} fits nowhere: its smallest footprint is "
        f"{gib(small.peak_mem_bytes)} per GPU ({small.candidate}) vs "
        f"{gib(limit)} allowed (90 % of {gib(cost.device.memory_bytes)} "
        f"on {cost.device.name}){why} (estimated)")


class ReplicaExceedsNode(InfeasibleError):
    """No plan keeps replicas of ``stage`` on different nodes, on a pool of any size: no
    replica of at most ``node_gpus`` (a node) fits memory. A replica's memory does not depend
    on the pool, and a layout within a node is a candidate on every pool that holds it, so more
    GPUs do not help. ``replica_gpus``: the smallest replica that fits on the pool searched (on
    another pool TP across nodes may be allowed or not, so another size). A class of its own,
    apart from the spread searches that more GPUs can fix, so that a caller does not offer a
    larger pool."""

    def __init__(self, stage: str, replica_gpus: int, node_gpus: int):
        self.stage, self.replica_gpus, self.node_gpus = stage, replica_gpus, node_gpus
        super().__init__(f"a replica of model-stage {stage} needs more than a node's "
                         f"{count(node_gpus, 'GPU')} to fit memory (the smallest that fits "
                         f"here spans {replica_gpus}), so no two of its replicas sit on "
                         f"different nodes (estimated)")


@dataclass(frozen=True)
class SearchResult:
    latency: float
    phases: Mapping[Phase, Point]
    sync_s: float
    train_layout: Layout | None


class _SyncPrices:
    """Weight-sync seconds of every generation candidate under a training layout and GPU count
    (``CostModel.weight_sync`` of the two candidates, computed per generation layout and per
    GPU count, once per search), for the candidates ``held(lt)`` keeps."""

    def __init__(self, cost: CostModel, gen: StageOptions):
        self.cost = cost
        self.layouts = gen.layouts()
        idx = {lg: i for i, lg in enumerate(self.layouts)}
        self.which = np.array([idx[c.layout] for c in gen.candidates], dtype=int)
        self.counts, self.inverse = np.unique(gen.gpus, return_inverse=True)
        self._price: dict[Layout, np.ndarray] = {}
        self._kinds: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._extra: dict[tuple[Layout, int], np.ndarray] = {}
        self._held: dict[Layout, np.ndarray | None] = {}

    def held(self, lt: Layout) -> np.ndarray | None:
        """Which generation candidates a GPU can hold the sync from ``lt`` into
        (``CostModel.weight_sync_fits``, per generation layout); None: every one."""
        if lt not in self._held:
            ok = np.array([self.cost.weight_sync_fits(lt, lg) for lg in self.layouts],
                          dtype=bool)
            self._held[lt] = None if ok.all() else ok[self.which]
        return self._held[lt]

    def extra(self, lt: Layout, t: int) -> np.ndarray:
        key = (lt, t)
        hit = self._extra.get(key)
        if hit is not None:
            return hit
        price = self._price.get(lt)
        if price is None:  # per candidate: colocated, on a training node, off them
            price = self._price[lt] = self.cost.weight_sync_table(lt, self.layouts)[self.which]
        kinds = self._kinds.get(t)
        if kinds is None:
            rec = np.array([self.cost.sync_receivers(t, int(g)) for g in self.counts],
                           dtype=int).reshape(len(self.counts), 3)[self.inverse]
            kinds = self._kinds[t] = (rec[:, 1] > 0, rec[:, 2] > 0)
        on, off = kinds
        sync = np.where(on, np.maximum(price[:, 0], price[:, 1]), price[:, 0])
        hit = np.where(off, np.maximum(sync, price[:, 2]), sync)
        held = self.held(lt)
        hit = self._extra[key] = hit if held is None else hit[held]
        return hit


class Planner:
    """Builds stage options once and answers plan queries for one job and cost model."""

    def __init__(self, job: JobSpec, efficiencies: Efficiencies | None = None,
                 cost: CostModel | None = None, spread: bool = False,
                 evaluated: Mapping[str, Evaluation | None] | None = None,
                 keep: Keep | None = None, exhaustive: bool = False):
        """``spread``: on a pool of several nodes, every model-stage keeps at least two
        replicas that each fit in a node and are placed on different nodes where the layouts
        allow, so losing one node leaves a copy of every stage's state (the controller asks
        for it when the pool churns; ``nereus.plan.exposure`` checks the placed plan). On a
        single node it changes nothing. ``evaluated``: every stage's candidates already priced
        under ``cost`` by a planner of the same job (``best`` passes its own to the spread
        planner it asks). ``keep``: the candidates of each stage the search may use (a
        framework's plan space, say; the search is exact within them), as well as
        ``spread``'s. ``exhaustive``: no cap on plans placed dearer than priced
        (``MAX_REPRICED``); on a pool of partly filled nodes the search then goes on until its
        bound proves the plan the fastest (or ``MAX_REPLACEMENTS`` combinations did not place
        at all), which may take minutes."""
        self.job = job
        self.keep = keep
        self.exhaustive = exhaustive
        self.cost = cost or CostModel(job, efficiencies)
        self.limit = HEADROOM * self.cost.device.memory_bytes
        # what a ``spread`` planner's ``best`` gives, where ``best`` searched it on the way
        # (an InfeasibleError where it found none); None where it did not
        self.spread_plan: Plan | InfeasibleError | None = None
        self.spread = spread and spans_nodes(job.pool)
        self.options: dict[str, StageOptions] = {}
        self.evaluated: dict[str, Evaluation | None] = {}
        apart = self._apart()
        for st in job.workflow.stages:
            # spread training replicas sit on different nodes: their gradient all-reduce runs
            # on the network, which sizes would put inside a node (priced anew, not filtered
            # from a packed planner's evaluation)
            links = apart if st.kind is StageKind.TRAIN else None
            opts, ev = stage_options(self.cost, st, job.pool.size, keep=self._keep(st),
                                     evaluated=None if links else (evaluated or {}).get(st.name),
                                     links=links)
            self.evaluated[st.name] = ev
            if not len(opts):
                if self.spread:
                    raise self._no_spread_layout(st, links, (evaluated or {}).get(st.name))
                raise _fits_nowhere(self.cost, st, ev)
            self.options[st.name] = opts

    def _no_spread_layout(self, st: ModelStage, links: Links | None,
                          evaluated: Evaluation | None) -> InfeasibleError:
        """Why ``spread`` leaves ``st`` no candidate, found from its candidates without the
        spread filter: none fits memory at all (``_fits_nowhere``); the smallest replica that
        fits spans more GPUs than a node holds (:class:`ReplicaExceedsNode`: no pool spreads
        it); or two such replicas do not fit this pool's nodes (more GPUs may). Only which
        candidates fit memory is read, which the links do not change, so the packed planner's
        evaluation (``evaluated``) serves where given: a replan whose spread search fails
        prices nothing again."""
        opts, ev = stage_options(self.cost, st, self.job.pool.size, prune=False,
                                 evaluated=evaluated, links=links)
        if not len(opts):
            return _fits_nowhere(self.cost, st, ev)
        least = min(c.layout.size for c in opts.candidates)
        node = self.job.cluster.devices_per_node
        if least > node:
            return ReplicaExceedsNode(st.name, least, node)
        return InfeasibleError(
            f"model-stage {st.name} has no layout with two replicas inside nodes that fits on "
            f"{count(self.job.pool.size, 'GPU')} (estimated)")

    def _apart(self) -> Links | None:
        """Under ``spread``: a DP group across two nodes (the first GPUs of the pool's first
        two), for the search to price spread replicas' gradient all-reduce on the network;
        TP groups and pipelines stay inside a replica's node, as sizes say."""
        if not self.spread:
            return None
        nodes = list(self.job.pool.by_node().values())
        return Links(dp=(nodes[0][0], nodes[1][0]))

    def _keep(self, st: ModelStage) -> Callable[[Candidate], bool] | None:
        """The candidates of ``st`` that ``keep`` accepts; under ``spread``, of those only
        the ones of two or more replicas that each fit in a node."""
        keep = self.keep
        if not self.spread:
            return None if keep is None else lambda c: keep(st, c)
        node = self.job.pool.largest_node_share()
        return lambda c: (c.dp >= 2 and c.layout.size <= node
                          and (keep is None or keep(st, c)))

    # ---- search ----
    def search(self) -> SearchResult:
        wf = self.job.workflow
        budget = self.job.pool.size
        sync = wf.weight_sync()
        phases = {p: wf.phase_stages(p) for p in wf.phases}
        varying = frozenset(sync) if sync else frozenset()
        stable: dict[object, list[Point]] = {}  # groups whose options never change
        # phases without a varying stage: their points are the same under every training
        # layout (the inference phase of a synchronous step), so they are combined once
        settled: dict[Phase, list[Point]] = {}

        def points(phase: Phase, opts: Mapping[str, StageOptions], local: dict[object, list[Point]],
                   extra: Mapping[str, np.ndarray] | None = None) -> list[Point]:
            fixed = extra is None and not varying.intersection(s.name for s in phases[phase])
            if fixed and phase in settled:
                return settled[phase]
            got = phase_points(opts, phases[phase], self.limit, budget, extra, local, stable,
                               varying)
            if fixed:
                settled[phase] = got
            return got

        best: SearchResult | None = None
        pricer: _SyncPrices | None = None
        # the training stage's options one layout at a time, split in one pass
        by_layout: dict[Layout | None, StageOptions | None] = (
            dict(self.options[sync[0]].by_layout().items()) if sync else {None: None})
        for lt, train in by_layout.items():
            opts = dict(self.options)
            if sync and train is not None:
                opts[sync[0]] = train
            local: dict[object, list[Point]] = {}
            if wf.execution is Execution.SYNC and sync and lt is not None:
                pricer = pricer or _SyncPrices(self.cost, self.options[sync[1]])
                held = pricer.held(lt)
                if held is not None:  # the sync into the others would not fit their GPUs
                    opts[sync[1]] = opts[sync[1]].subset(held)
                res = self._search_sync(opts, points, local, lt, best, pricer)
            elif wf.execution is Execution.SYNC:
                pts = {p: points(p, opts, local) for p in phases}
                if any(not v for v in pts.values()):
                    continue
                chosen = {p: v[-1] for p, v in pts.items()}  # fastest within the whole pool
                res = SearchResult(sum(c.latency for c in chosen.values()), chosen,
                                   sum(c.extra for c in chosen.values()), lt)
            else:
                res = self._search_async(opts, points, local, lt)
            if res is not None and (best is None or res.latency < best.latency - 1e-12):
                best = res
        if best is None:
            raise InfeasibleError(
                f"no plan fits {count(budget, 'GPU')} of {self.cost.device.name}: every grouping "
                f"of the model-stages exceeds the pool or 90 % of device memory (estimated)")
        return best

    def _search_sync(self, opts: dict[str, StageOptions], points, local: dict[object, list[Point]],
                     lt: Layout, bound: SearchResult | None, pricer: _SyncPrices
                     ) -> SearchResult | None:
        """Synchronous step with the training layout fixed to ``lt``: the phases add up, and the
        sync depends on the generation candidate and on the training stage's GPU count T.
        ``opts`` keeps the generation candidates whose sync from ``lt`` fits memory
        (``pricer.held``), and ``pricer`` prices those.

        The training phase over all T gives a lower bound on the training term, and the fastest
        generation candidate with its sync priced at T one on the generation term; the training
        phase restricted to T is solved only where their sum can still beat the best plan
        (``bound`` or one found here).
        """
        wf = self.job.workflow
        pair = wf.weight_sync()
        assert pair is not None  # search() calls this only for a job with a weight sync
        train_name, gen_name = pair
        others = [p for p in wf.phases if p not in (Phase.GENERATION, Phase.TRAINING)]
        fixed: dict[Phase, Point] = {}
        for p in others:
            v = points(p, opts, local)
            if not v:
                return None
            fixed[p] = v[-1]
        base = sum(pt.latency for pt in fixed.values())
        train_all = points(Phase.TRAINING, opts, local) if Phase.TRAINING in wf.phases else []
        if not train_all:
            return None
        t_opts, g_opts = opts[train_name], opts[gen_name]
        counts = sorted({int(x) for x in t_opts.gpus})
        gen_memo: dict[bytes, list[Point]] = {}
        fits = g_opts.gpus <= self.job.pool.size

        def gen_best(t: int) -> Point | None:
            if Phase.GENERATION not in wf.phases:
                return Point(0, 0.0, ())
            extra = pricer.extra(lt, t)
            key = extra.tobytes()
            v = gen_memo.get(key)
            if v is None:
                v = gen_memo[key] = points(Phase.GENERATION, opts, {}, {gen_name: extra})
            return v[-1] if v else None

        def result(train: Point, t: int) -> SearchResult | None:
            gen = gen_best(t)
            if gen is None:
                return None
            chosen = {**fixed, Phase.TRAINING: train, Phase.GENERATION: gen}
            chosen = {p: chosen[p] for p in wf.phases}
            return SearchResult(base + train.latency + gen.latency, chosen,
                                sum(c.extra for c in chosen.values()), lt)

        def better(res: SearchResult | None, than: SearchResult | None) -> bool:
            return res is not None and (than is None or res.latency < than.latency - 1e-12)

        top = train_all[-1]
        t0 = _stage_gpus(top, train_name)
        best = result(top, t0)
        floor = base + top.latency  # no training restricted to some T is faster than this
        lower = {}
        for t in counts:
            if t != t0:
                # the generation stage's own latency bounds its phase's
                gen = np.where(fits, g_opts.latency + pricer.extra(lt, t), math.inf)
                lower[t] = floor + (float(gen.min()) if len(gen) else math.inf)
        for t in sorted(lower, key=lambda t: (lower[t], t)):
            limit = min((r.latency for r in (bound, best) if r is not None), default=math.inf)
            if lower[t] >= limit - 1e-12:
                break
            sub = dict(opts)
            sub[train_name] = t_opts.subset(t_opts.gpus == t)
            v = points(Phase.TRAINING, sub, {})
            if v:
                res = result(v[-1], t)
                if better(res, best):
                    best = res
        return best

    def _search_async(self, opts: dict[str, StageOptions], points, local: dict[object, list[Point]],
                      lt: Layout | None) -> SearchResult | None:
        """Generation on GPUs of its own; interval = max(gen, inference + training) + sync.

        The sync cost moves with the generation layout, so the generation stage is solved one
        layout at a time (its points then share one sync cost and a 2-D Pareto set is exact).
        """
        wf = self.job.workflow
        budget = self.job.pool.size
        sync = wf.weight_sync()
        empty = [Point(0, 0.0, ())]
        inf = points(Phase.INFERENCE, opts, local) if Phase.INFERENCE in wf.phases else empty
        trn = points(Phase.TRAINING, opts, local) if Phase.TRAINING in wf.phases else empty
        if not inf or not trn:
            return None
        gen_layouts: dict[Layout | None, StageOptions | None] = {None: None}
        gen_name = ""  # read below only with a generation layout: only with a weight sync
        if sync and Phase.GENERATION in wf.phases:
            gen_name = sync[1]
            gen_layouts = dict(opts[gen_name].by_layout().items())
        # Pareto points: GPUs strictly rising, so the fastest within a budget is the last one
        # at or under it
        inf_gpus, trn_gpus = [p.gpus for p in inf], [p.gpus for p in trn]
        best: SearchResult | None = None
        for lg, g in gen_layouts.items():
            gopts = dict(opts)
            sync_s = 0.0
            if lg is not None and g is not None and lt is not None:
                gopts[gen_name] = g
                sync_s = self.cost.weight_sync(lt, lg).latency_s
            gen = points(Phase.GENERATION, gopts, {}) if Phase.GENERATION in wf.phases else empty
            for gp in gen:
                rest = budget - gp.gpus
                ki, kt = bisect_right(inf_gpus, rest), bisect_right(trn_gpus, rest)
                if not ki or not kt:
                    continue
                i, t = inf[ki - 1], trn[kt - 1]
                interval = max(gp.latency, i.latency + t.latency) + sync_s
                if best is None or interval < best.latency - 1e-12:
                    chosen = {Phase.GENERATION: gp, Phase.INFERENCE: i, Phase.TRAINING: t}
                    best = SearchResult(interval, {p: v for p, v in chosen.items()
                                                   if p in wf.phases}, sync_s, lt)
        return best

    # ---- plan assembly ----
    def best(self) -> Plan:
        """The fastest plan whose TP groups all stay inside nodes where the pool allows.

        The search counts GPUs, not how they sit in nodes; on a pool of partly filled nodes
        stages that run side by side may not all find node-contained TP groups. Then the search
        goes on best first over the remaining combinations: the combination that could not be
        placed (the candidates of the stages whose placement it decides) is excluded by
        splitting the options into disjoint parts -- the first stage without its candidate, or
        it fixed and the second without its candidate, and so on -- and each part is searched
        again; the fastest part is expanded next. The first placeable plan placed at the
        price the search gave it is the fastest placeable one; one placed dearer is split off
        the same way and the search goes on (``MAX_REPRICED``); before each split, other
        shapes of one stage are placed (``_repair``), which often finds the plan the split
        would reach only hundreds of searches later. Where the options were
        dominance-pruned across layouts they are first rebuilt pruned within each layout
        (placement depends on the layout, so a candidate beaten by one of another layout may
        be the one that places). Raises :class:`InfeasibleError` when no combination places
        (or after ``MAX_REPLACEMENTS`` searches).

        Without ``spread``, where the weight sync of that plan crosses nodes, the best plan
        with replicas spread over nodes is returned where its step is shorter: the search
        prices the sync with training packed on the pool's fullest nodes, and training spread
        over the nodes generation uses keeps the sync inside them. Spread training replicas
        all-reduce their gradients across nodes, though: on the 8B PPO example's 16 GPUs the
        spread plan's sync takes 0.015 s against 0.161 s, and its step is 2.2 % longer."""
        plan = self.best_placed()
        if self.spread or not self._sync_crosses_nodes(plan):
            return plan
        try:
            other = Planner(self.job, cost=self.cost, spread=True, evaluated=self.evaluated,
                            keep=self.keep, exhaustive=self.exhaustive).best_placed()
        except InfeasibleError as e:
            self.spread_plan = e
            return plan
        self.spread_plan = other
        chosen = other if other.step_latency_s < plan.step_latency_s * (1 - 1e-9) else plan
        # the faster of two searches is proven the fastest only where both searches were
        return chosen if plan.proven and other.proven else replace(chosen, proven=False)

    def _sync_crosses_nodes(self, plan: Plan) -> bool:
        """Whether ``plan``'s synchronous weight sync sends to generation GPUs on nodes without
        training GPUs: only then can replicas spread over nodes make it cheaper (they put
        training on every node generation uses), so only then is the spread plan searched."""
        wf = self.job.workflow
        pair = wf.colocated_sync()
        if pair is None or not plan.terms.get("weight_sync") or not spans_nodes(self.job.pool):
            return False
        got = self.cost.placed_sync_receivers(plan.stage(pair[0]).replicas,
                                              plan.stage(pair[1]).replicas)
        return got is not None and got.off_node > 0

    def best_placed(self) -> Plan:
        """The best plan under this planner's own placement rule: packed (the search's sync
        pricing) or, with ``spread``, replicas over nodes; ``best`` weighs both."""
        res = self.search()
        plan, bad, _ = self._placed(res)
        if plan is not None and not bad \
                and plan.step_latency_s <= res.latency * (1 + PRICE_TOLERANCE):
            return plan
        saved = self.options
        try:
            return self._best_placeable()
        finally:
            self.options = saved

    def _place(self, pool: GpuPool, groups: list[GroupAssignment],
               prefer: dict[str, tuple[int, ...]], mode: str = "packed"
               ) -> dict[str, list[tuple[int, ...]]]:
        """``place_phase`` with the preferred GPUs, unless honouring them costs the placement
        (it fails, or more TP groups span nodes): then without (the plan's weight sync then
        runs slower than the search priced it, and the plan says so in its sync term).
        ``mode`` (see ``PLACEMENTS``): "whole" puts a group on one node where one holds it;
        "contained" lays the blocks every TP group needs, largest first over the phase, and
        takes no preferred GPUs (``_placed`` keeps it only where it is the cheapest)."""
        if mode == "contained":
            cap = self.job.pool.largest_node_share()
            return lay(groups, take_blocks(pool, [tp_blocks(g, cap) for g in groups]))
        whole = mode == "whole"
        if not any(s in prefer for g in groups for s in g.stages):
            return place_phase(pool, groups, self.spread, whole=whole)
        tps = {s: c.tp for g in groups for s, c in zip(g.stages, g.candidates)}

        def off_node(placed: dict[str, list[tuple[int, ...]]]) -> int:
            return sum(tp_groups_off_node(r, tps[s], self.job.cluster)
                       for s, r in placed.items())

        try:
            placed = place_phase(pool, groups, self.spread, prefer, whole=whole)
        except ValueError:
            return place_phase(pool, groups, self.spread, whole=whole)
        if not off_node(placed):
            return placed
        plain = place_phase(pool, groups, self.spread, whole=whole)
        return plain if off_node(plain) < off_node(placed) else placed

    def _placed(self, res: SearchResult) -> tuple[Plan | None, list[str], Plan | None]:
        """The cheapest of the placements ``PLACEMENTS`` makes of ``res`` (the first that
        costs what the search priced ends the tries: none costs less), with the stages whose
        TP groups span nodes needlessly (``validate.contained_stages``; empty where one
        placement keeps them inside, which "contained" does whenever the nodes allow), and
        the first valid placement tried (the one whose dearer stages a re-pricing splits
        off first: the search then visits combinations as it did with that placement alone,
        and keeps the cheapest placement of each)."""
        best: tuple[Plan | None, list[str]] = (None, [s.name for s in self.job.workflow.stages])
        first: Plan | None = None
        for mode in PLACEMENTS:
            try:
                plan = self.assemble(res, mode)
            except ValueError:  # the placement ran out of GPUs
                continue
            bad = spanning_stages(self.job, plan)
            if not bad and first is None:
                first = plan
            if best[0] is None or (not bad and (best[1] or plan.step_latency_s
                                                < best[0].step_latency_s * (1 - 1e-12))):
                best = (plan, bad)
            if not bad and plan.step_latency_s <= res.latency * (1 + PRICE_TOLERANCE):
                break
        return best[0], best[1], first

    def _best_placeable(self) -> Plan:
        wf = self.job.workflow
        base: dict[str, StageOptions] = {}
        for st in wf.stages:
            st_opts, _ = stage_options(
                self.cost, st, self.job.pool.size, keep=self._keep(st), by_layout=True,
                links=self._apart() if st.kind is StageKind.TRAIN else None)
            base[st.name] = st_opts
        heap: list[tuple[float, int, dict[str, StageOptions], SearchResult]] = []
        pushed = 0

        def push(opts: dict[str, StageOptions]) -> None:
            nonlocal pushed
            if any(not len(o) for o in opts.values()):
                return
            self.options = opts
            try:
                res = self.search()
            except InfeasibleError:
                return
            pushed += 1
            heapq.heappush(heap, (res.latency, pushed, opts, res))

        push(base)
        repriced = unplaced = repairs = 0
        best: Plan | None = None  # the fastest placeable plan as placed, so far
        tried: set[object] = set()  # combinations ``_repair`` placed
        cap = math.inf if self.exhaustive else MAX_REPRICED
        proven = True  # False once the search stops before the bound proves ``best``
        while heap:
            bound, _, opts, res = heapq.heappop(heap)
            if best is not None and bound >= best.step_latency_s * (1 - PRICE_TOLERANCE):
                break  # every combination left is searched at least as slow as it
            self.options = opts
            plan, bad, first = self._placed(res)
            if plan is not None and not bad:  # no plan comes with every stage bad
                if best is None or plan.step_latency_s < best.step_latency_s:
                    best = plan
                if plan.step_latency_s <= res.latency * (1 + PRICE_TOLERANCE):
                    break
            if repairs < MAX_REPAIRED:
                repairs += 1
                fixed_up = self._repair(res, opts, best, tried)
                if fixed_up is not None:
                    best = fixed_up
                    if best.step_latency_s <= bound * (1 + PRICE_TOLERANCE):
                        break  # placed at the least any combination left can cost
            if plan is not None and not bad:
                # placed dearer than searched (a DP group or a pipeline of a node's size
                # across two nodes): a combination searched slower may place faster, so this
                # one is split off like one that did not place, the stages placed dearer
                # first (every stage where none is, the sync having risen)
                if repriced >= cap:
                    proven = False
                    break
                repriced += 1
                bad = self._dearer(first or plan) or [st.name for st in wf.stages]
            else:
                unplaced += 1
                if unplaced > MAX_REPLACEMENTS:
                    if best is not None:
                        proven = False
                        break
                    raise InfeasibleError(
                        f"no placeable plan found in {MAX_REPLACEMENTS} combinations: the "
                        f"fastest plans need TP groups across nodes of the pool (estimated)")
            chosen = {n: c for p in res.phases.values() for g in p.groups
                      for n, c in zip(g.stages, g.candidates)}
            # the stages whose candidates decide the failed placement: in synchronous execution
            # each phase is placed on the whole pool by itself; asynchronous generation and the
            # rest split the pool, so there every stage takes part
            if wf.execution is Execution.SYNC:
                failed = {wf.stage(n).phase for n in bad}
                involved = [s.name for s in wf.stages if s.phase in failed]
            else:
                involved = [s.name for s in wf.stages]
            involved.sort(key=lambda n: n not in bad)  # the culprits first
            # placement sees a candidate's layout and replica count only (not its micro-batch
            # or recomputation), so every candidate sharing them fails alike
            fixed = dict(opts)
            for name in involved:
                shape = _shape(chosen[name])
                o = opts[name]
                same = np.array([_shape(c) == shape for c in o.candidates])
                child = dict(fixed)
                child[name] = o.subset(~same)
                push(child)
                fixed[name] = o.subset(same)
        if best is not None:
            return best if proven else replace(best, proven=False)
        raise InfeasibleError(
            f"no plan fits {count(self.job.pool.size, 'GPU')} of {self.cost.device.name} with "
            f"every TP group inside a node of the pool (estimated)")

    def _repair(self, res: SearchResult, opts: Mapping[str, StageOptions],
                best: Plan | None, tried: set[object]) -> Plan | None:
        """The fastest placeable plan found one model-stage away from ``res`` that beats
        ``best``, or None.

        ``res`` is the cheapest combination left and did not place at its price. Another shape
        of one stage often costs as little, or little more, and places where ``res`` did not:
        in asynchronous execution generation may set the interval while training, on GPUs of
        its own, takes any layout as fast (a layout without TP leaves the nodes' blocks to
        generation). The combinations the search splits off instead differ in every stage, one
        shape at a time, and may all fail alike for hundreds of re-pricings. A plan found here
        at ``res``'s price ends the search (nothing left costs less); one above it is only a
        better incumbent, which ends the search sooner. The bound is untouched, so the search
        stays exact. Tried: for each stage that shares no GPUs inside its phase, the fastest
        candidate of every other (layout, replicas) shape, cheapest first as the search prices
        them, each placed as ``_placed`` places it; up to ``REPAIR_TRIES`` at ``res``'s price
        and as many above it, none twice in a search (``tried``)."""
        bound = res.latency * (1 + PRICE_TOLERANCE)
        own = {p: max((sum(g.latencies) for g in pt.groups), default=0.0)
               for p, pt in res.phases.items()}
        layouts = {n: c.layout for pt in res.phases.values() for g in pt.groups
                   for n, c in zip(g.stages, g.candidates)}
        trials = []
        for phase, point in res.phases.items():
            for k, gc in enumerate(point.groups):
                if len(gc.stages) == 1:
                    trials += self._substitutes(res, opts, own, layouts, phase, k)
        trials.sort(key=lambda t: t[0])  # stable: ties in the order of the stages
        worth = best.step_latency_s * (1 - PRICE_TOLERANCE) if best is not None else math.inf
        found: Plan | None = None
        tries = [0, 0]  # placed at the bound, above it
        for priced, trial in trials:
            if priced >= worth:
                break
            key = tuple((g.stages, g.candidates) for pt in trial.phases.values()
                        for g in pt.groups)
            above = priced > bound
            if key in tried or tries[above] >= REPAIR_TRIES:
                continue  # placed before (from another combination), or enough of its kind
            tried.add(key)
            tries[above] += 1
            plan, bad, _ = self._placed(trial)
            if plan is not None and not bad and plan.step_latency_s < worth:
                if plan.step_latency_s <= bound:
                    return plan
                found, worth = plan, plan.step_latency_s * (1 - PRICE_TOLERANCE)
        return found

    def _substitutes(self, res: SearchResult, opts: Mapping[str, StageOptions],
                     own: Mapping[Phase, float], layouts: Mapping[str, Layout], phase: Phase,
                     k: int) -> list[tuple[float, SearchResult]]:
        """``res`` with the single stage of ``phase``'s group ``k`` on the fastest candidate of
        each of its other shapes that keeps the pool and the weight sync's memory, with its
        price as the search prices it (``_priced``). ``layouts``: every stage's in ``res``."""
        wf = self.job.workflow
        point = res.phases[phase]
        name, cur = point.groups[k].stages[0], point.groups[k].candidates[0]
        o = opts[name]
        fastest: dict[tuple[Layout, int], int] = {}
        for i, c in enumerate(o.candidates):
            sh = _shape(c)
            if sh != _shape(cur) and (sh not in fastest or o.latency[i] < o.latency[fastest[sh]]):
                fastest[sh] = i
        sync = wf.weight_sync()
        out = []
        for i in fastest.values():
            c, t = o.candidates[i], float(o.latency[i])
            groups = (*point.groups[:k], GroupChoice((name,), (c,), (t,)), *point.groups[k + 1:])
            gpus = sum(g.gpus for g in groups)
            if not self._fits(res, phase, gpus):
                continue
            sync_s, train_layout = res.sync_s, res.train_layout
            if sync is not None and name in sync:
                lt = c.layout if name == sync[0] else layouts.get(sync[0])
                lg = c.layout if name == sync[1] else layouts.get(sync[1])
                if lt is None or lg is None or not self.cost.weight_sync_fits(lt, lg):
                    continue
                if wf.execution is Execution.ASYNC:
                    sync_s = self.cost.weight_sync(lt, lg).latency_s
                train_layout = lt
            lat = max(sum(g.latencies) for g in groups)
            phases = dict(res.phases)
            phases[phase] = Point(gpus, point.latency - own[phase] + lat, groups, point.extra)
            out.append((self._priced(own, phase, lat, res, sync_s),
                        SearchResult(res.latency, phases, sync_s, train_layout)))
        return out

    def _fits(self, res: SearchResult, phase: Phase, gpus: int) -> bool:
        """Whether ``res`` with ``phase`` on ``gpus`` GPUs stays within the pool: each phase in
        synchronous execution; asynchronous generation beside the larger of the rest."""
        used = {p: pt.gpus for p, pt in res.phases.items()}
        used[phase] = gpus
        if self.job.workflow.execution is Execution.ASYNC and Phase.GENERATION in used:
            rest = max((g for p, g in used.items() if p is not Phase.GENERATION), default=0)
            return used[Phase.GENERATION] + rest <= self.job.pool.size
        return max(used.values(), default=0) <= self.job.pool.size

    def _priced(self, own: Mapping[Phase, float], phase: Phase, lat: float,
                res: SearchResult, sync_s: float) -> float:
        """The step of ``res`` with ``phase``'s own latency (without the sync) at ``lat``, as
        the search prices it: phases add up in synchronous execution; in asynchronous,
        generation runs beside inference and training. One difference: in synchronous
        execution the sync keeps ``res``'s price where the substitute is one of its two
        stages (placement prices it anew), so such a trial's price only orders the trials."""
        own_before = own[phase]
        own = {**own, phase: lat}
        if self.job.workflow.execution is Execution.ASYNC:
            gen = own.get(Phase.GENERATION, 0.0)
            rest = sum(v for p, v in own.items() if p is not Phase.GENERATION)
            return max(gen, rest) + sync_s
        return res.latency - own_before + lat

    def _dearer(self, plan: Plan) -> list[str]:
        """The model-stages ``plan`` prices above their search price: on the links their GPU
        ids give them, where sizes said a node's fabric."""
        return [sp.stage for sp in plan.stages
                if sp.latency_s > self.cost.estimate(
                    sp.stage, sp.candidate, idle_bytes(self.cost, plan, sp.stage)).latency_s
                * (1 + PRICE_TOLERANCE)]

    def assemble(self, res: SearchResult, mode: str = "packed") -> Plan:
        """``res`` placed (``mode``: one of ``PLACEMENTS``) and priced where it landed."""
        wf = self.job.workflow
        stage_plans: dict[str, StagePlan] = {}
        groups: list[tuple[str, ...]] = []
        assigns = {p: [GroupAssignment(gc.stages, gc.candidates) for gc in res.phases[p].groups]
                   for p in wf.phases}
        pools = {p: self.job.pool for p in wf.phases}
        if wf.execution is Execution.ASYNC and Phase.GENERATION in wf.phases:
            # generation gets GPUs of its own; inference and training share the rest
            rest = [p for p in wf.phases if p is not Phase.GENERATION]
            gen_part = (res.phases[Phase.GENERATION].gpus,
                        unit_of(assigns[Phase.GENERATION], self.job.pool))
            rest_part = (max((res.phases[p].gpus for p in rest), default=0),
                         unit_of([g for p in rest for g in assigns[p]], self.job.pool))
            if mode == "contained":
                # generation's blocks beside what inference and training each need of the GPUs
                # they take turns on (the larger count per size: ``validate.merge_need``)
                cap = self.job.pool.largest_node_share()
                gen_blocks = [b for g in assigns[Phase.GENERATION] for b in tp_blocks(g, cap)]
                rest_need = merge_need(*(need_of([b for g in assigns[p] for b in tp_blocks(g, cap)])
                                         for p in rest))
                ids = take_blocks(self.job.pool, [gen_blocks, blocks_of(rest_need)])
                gen_pool, rest_pool = (GpuPool(self.job.pool.cluster, tuple(i)) if i
                                       else self.job.pool for i in ids)
            else:
                gen_pool, rest_pool = split_pool(self.job.pool, [gen_part, rest_part],
                                                 self.spread, whole=mode == "whole")
            pools = {p: gen_pool if p is Phase.GENERATION else rest_pool for p in wf.phases}
        # a synchronous weight sync is priced with training on the pool's fullest nodes and
        # generation on the training GPUs first (``CostModel.sync_receivers``): training's
        # phase is placed first, preferring those nodes, and generation prefers training's
        # GPUs. Spread replicas go over nodes instead (their sync is priced as placed).
        pair = wf.colocated_sync()
        nest = None if self.spread else pair
        prefer: dict[str, tuple[int, ...]] = {}
        phases = list(wf.phases)
        if nest is not None:
            train_phase = wf.stage(nest[0]).phase
            phases.sort(key=lambda p: p is not train_phase)
            prefer[nest[0]] = self.cost.training_nodes(
                _stage_gpus(res.phases[train_phase], nest[0]))
        for phase in phases:
            point = res.phases[phase]
            placed = self._place(pools[phase], assigns[phase], prefer, mode)
            if nest is not None and nest[0] in placed:
                prefer[nest[1]] = tuple(i for r in placed[nest[0]] for i in r)
            for gc in point.groups:
                if len(gc.stages) > 1:
                    groups.append(gc.stages)
                others = {n: self.cost.resident_bytes(n, c.layout)
                          for n, c in zip(gc.stages, gc.candidates)}
                for name, cand in zip(gc.stages, gc.candidates):
                    co = sum(v for n, v in others.items() if n != name)
                    # priced where it was placed: the search's sizes assume every group of a
                    # node's size inside one, which placement keeps for TP groups and
                    # pipelines but not always for DP groups
                    replicas = tuple(placed[name])
                    est = self.cost.estimate(name, cand, co,
                                             self.cost.placed_links(cand.layout, replicas))
                    stage_plans[name] = StagePlan(name, cand, replicas, est.latency_s,
                                                  est.peak_mem_bytes)
        ordered = tuple(stage_plans[s.name] for s in wf.stages)
        # groups in phase order, as the plan lists them, whatever order the phases were placed
        groups.sort(key=lambda g: wf.phases.index(wf.stage(g[0]).phase))
        # the sync as placed: where the pool (or spreading replicas) kept generation off the
        # training GPUs, it differs from what the search's count model said
        sync_s = res.sync_s if pair is None else weight_sync_estimate(
            self.cost, stage_plans[pair[0]], stage_plans[pair[1]]).latency_s
        # each phase as placed: its groups run side by side, a group's stages one after another
        lat = {name: sp.latency_s for name, sp in stage_plans.items()}
        singles = [(s.stage,) for s in ordered if not any(s.stage in g for g in groups)]
        step, terms = step_and_terms(wf, [*groups, *singles], lat, sync_s)
        return Plan(ordered, step, "estimated", terms, tuple(groups))


MAX_REPLACEMENTS = 2000  # combinations that did not place before the search gives up
# A placed plan may cost more than the search priced it (its groups as placed cross nodes where
# sizes said they would not): the search then goes on for a combination that places faster,
# up to this many such plans, and keeps the fastest as placed. The search's price bounds
# what is left (placement adds cost, except a spread plan's sync, which the count model may
# over-price), so it stops as soon as nothing left can beat the best.
MAX_REPRICED = 50
PRICE_TOLERANCE = 1e-9  # relative: a placed plan "at" its searched price
# Substitutes ``Planner._repair`` places per combination that placed dearer: this many at the
# combination's price and this many above it, cheapest first, none placed twice in a search
# (each costs one to three placements, 2-5 ms apiece). On ``benchmarks/plan_holes.py``'s 120
# pools 8 finds what 16 does; unlimited, one pool more (14B GRPO, 23.5 %) for 2x its time.
REPAIR_TRIES = 8
# Combinations ``_repair`` runs for per search: it finds its plans among the first (on the
# benchmark's pools, in the capped search's first 50); past them an exhaustive search only
# pays for it
MAX_REPAIRED = 50
# How ``Planner`` places a combination, tried in this order until one costs what the search
# priced: "packed" (chunks of a replica's size, best fit: keeps whole nodes free), "whole" (a
# group on one node where one holds it, so its DP groups and pipelines run on the node's
# fabric, as sizes priced them), "contained" (the blocks every TP group needs, largest first
# over all that runs at once: inside nodes whenever the nodes can hold them all).
PLACEMENTS = ("packed", "whole", "contained")


def _stage_gpus(point: Point, stage: str) -> int:
    """GPUs of ``stage``'s candidate in a phase point."""
    for g in point.groups:
        if stage in g.stages:
            return g.candidates[g.stages.index(stage)].gpus
    raise KeyError(stage)


def _shape(c: Candidate) -> tuple[Layout, int]:
    """What the placement of a candidate depends on."""
    return c.layout, c.dp


def spanning_stages(job: JobSpec, plan: Plan) -> list[str]:
    """Model-stages with a TP group across nodes although the pool's nodes could hold every TP
    group of the stages running beside it (``validate.contained_stages``)."""
    held = contained_stages(job, plan)
    cap = job.pool.largest_node_share()
    return [sp.stage for sp in plan.stages if sp.stage in held and sp.candidate.tp <= cap
            and tp_groups_off_node(sp.replicas, sp.candidate.tp, job.cluster)]


def best_plan(job: JobSpec, efficiencies: Efficiencies | None = None,
              cost: CostModel | None = None, spread: bool = False) -> Plan:
    """The fastest plan for ``job`` that fits its pool and device memory (``spread``: see
    :class:`Planner`)."""
    return Planner(job, efficiencies, cost, spread).best()
