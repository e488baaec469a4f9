"""Brute-force plan search for small instances: the reference the exact search is tested against.

It enumerates every grouping of every phase and every combination of memory-feasible candidates,
checks memory with the per-stage estimates (a member's peak with its group-mates' resident
state beside it), and scores each combination by the critical path of the execution-overlap
graph. Nothing of the search's pruning, Pareto points or conditioning is reused; the candidates
are the search's own space (``enumerate_candidates``, with the uneven DP degrees of stages that
take no gradient), so that the two answer the same question.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import networkx as nx

from nereus.cost.candidate import Candidate
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.overlap import END, SYNC, overlap_graph
from nereus.plan.search import Keep, set_partitions
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, ModelStage, Phase, StageKind


def _fitting(cost: CostModel, job: JobSpec, max_combinations: int,
             keep: Keep | None = None) -> dict[str, list[Candidate]]:
    """Every model-stage's candidates that fit memory (TP across nodes only where none inside
    one fits), of those ``keep`` accepts; ValueError when their combinations exceed
    ``max_combinations``."""
    pool = job.pool.size
    cands: dict[str, list[Candidate]] = {}
    for st in job.workflow.stages:
        def kept(cs: list[Candidate], st: ModelStage = st) -> list[Candidate]:
            return [c for c in cs if cost.estimate(st, c).fits and (keep is None or keep(st, c))]
        ok = kept(enumerate_candidates(cost, st, pool))
        if not ok and cost.node_size < pool:
            ok = kept(enumerate_candidates(cost, st, pool, max_tp=pool))
        cands[st.name] = ok
    total = math.prod(max(1, len(v)) for v in cands.values())
    if total > max_combinations:
        raise ValueError(f"{total} combinations: too many for brute force")
    return cands


def brute_force_latency(job: JobSpec, cost: CostModel | None = None,
                        max_combinations: int = 2_000_000, keep: Keep | None = None,
                        consistent: Callable[[dict[str, Candidate]], bool] | None = None
                        ) -> float:
    """The lowest step latency over all valid plans (math.inf when none fits). ``keep``: the
    candidates a stage may have; ``consistent``: which combinations of them are allowed (a
    framework's plan space, ``nereus.plan.frameworks``)."""
    cost = cost or CostModel(job)
    wf = job.workflow
    limit = HEADROOM * cost.device.memory_bytes
    pool = job.pool.size
    cands = _fitting(cost, job, max_combinations, keep)
    lat = {(n, c): cost.estimate(n, c).latency_s for n, cs in cands.items() for c in cs}
    names = [s.name for s in wf.stages]
    partitions = {p: list(set_partitions([s.name for s in wf.phase_stages(p)])) for p in wf.phases}
    sync = wf.weight_sync()
    combos = list(itertools.product(*(cands[n] for n in names)))
    best = math.inf
    memo: dict = {}
    sync_memo: dict = {}
    for grouping in itertools.product(*(partitions[p] for p in wf.phases)):
        groups = [g for part in grouping for g in part]
        # the graph's shape depends on the grouping only; weights change per combination
        graph = overlap_graph(wf, groups, {n: 0.0 for n in names}, 0.0)
        order = list(nx.topological_sort(graph))
        preds = {v: list(graph.predecessors(v)) for v in order}
        for combo in combos:
            choice = dict(zip(names, combo))
            if consistent is not None and not consistent(choice):
                continue
            if not _feasible(cost, choice, grouping, wf.phases, limit, pool, wf.execution, memo):
                continue
            if sync is not None and not cost.weight_sync_fits(choice[sync[0]].layout,
                                                              choice[sync[1]].layout):
                continue  # the GPUs the sync runs on cannot hold what it needs
            weight = {n: lat[(n, c)] for n, c in choice.items()}
            if sync is not None:
                pair = (choice[sync[0]], choice[sync[1]])
                if pair not in sync_memo:
                    sync_memo[pair] = cost.weight_sync(*pair).latency_s
                weight[SYNC] = sync_memo[pair]
            finish: dict[str, float] = {}
            for v in order:
                start = max((finish[u] for u in preds[v]), default=0.0)
                finish[v] = start + weight.get(v, 0.0)
            best = min(best, finish[END])
    return best


def _feasible(cost: CostModel, choice: dict[str, Candidate], grouping, phases, limit: float,
              pool: int, execution: Execution, memo: dict | None = None) -> bool:
    memo = {} if memo is None else memo
    used: dict[Phase, int] = {}
    for phase, part in zip(phases, grouping):
        size = 0
        for group in part:
            key = (group, tuple(choice[n] for n in group))
            ok = memo.get(key)
            if ok is None:
                ok = _group_fits(cost, group, choice, limit)
                memo[key] = ok
            if not ok:
                return False
            size += max(choice[n].gpus for n in group)
        used[phase] = size
    if execution is Execution.SYNC:
        return all(v <= pool for v in used.values())
    gen = used.get(Phase.GENERATION, 0)
    rest = max(used.get(Phase.INFERENCE, 0), used.get(Phase.TRAINING, 0))
    return gen + rest <= pool


def _group_fits(cost: CostModel, group: tuple[str, ...], choice: dict[str, Candidate],
                limit: float) -> bool:
    if len(group) > 1 and any(cost.job.workflow.stage(n).kind is StageKind.GENERATE
                              for n in group):
        return False  # a generation engine never shares its GPU set (see plan.search)
    for n in group:
        idle = sum(cost.resident_bytes(o, choice[o].layout) for o in group if o != n)
        if cost.estimate(n, choice[n], idle).peak_mem_bytes > limit:
            return False
    return True


# ---- with placements: the reference for plans as placed ----


def brute_force_placed_latency(job: JobSpec, cost: CostModel | None = None,
                               max_combinations: int = 200_000) -> float:
    """The lowest step latency over every valid plan *as placed*, on small pools: each
    combination of groupings and candidates (``brute_force_latency``'s) is placed every way
    in which a group's GPU list takes one run of GPUs per node (any counts per node, the nodes
    in any order; stages laid over a prefix of the list, TP innermost), and priced where its
    groups landed (``CostModel.placed_links``, the weight sync as placed; a synchronous step's
    sync by GPU counts, as ``plan_testlib.searched_latency`` reads a plan). A TP group may
    cross nodes only where the stages running beside it cannot all keep theirs inside
    (``validate.contained_stages``'s rule, counted here on the candidates). Combinations are
    taken cheapest by sizes first and the search stops once sizes alone reach the best placed
    step (inside those runs no placement beats the node-aligned sizes)."""
    from nereus.plan.overlap import step_and_terms
    from nereus.plan.types import StagePlan, weight_sync_estimate
    from nereus.plan.validate import add_need, merge_need, need_fits, stage_need

    cost = cost or CostModel(job)
    wf = job.workflow
    limit = HEADROOM * cost.device.memory_bytes
    npool = job.pool.size
    cands = _fitting(cost, job, max_combinations)
    names = [s.name for s in wf.stages]
    partitions = {p: list(set_partitions([s.name for s in wf.phase_stages(p)])) for p in wf.phases}
    sync = wf.weight_sync()
    by_node = job.pool.by_node()
    nodes = list(by_node)
    caps = tuple(len(by_node[n]) for n in nodes)
    node_cap = max(caps)
    is_async = wf.execution is Execution.ASYNC

    # every feasible (grouping, choice), with its price by sizes (a lower bound)
    sized: list[tuple[float, int, tuple, dict[str, Candidate]]] = []
    memo: dict = {}
    for grouping in itertools.product(*(partitions[p] for p in wf.phases)):
        groups = [g for part in grouping for g in part]
        for combo in itertools.product(*(cands[n] for n in names)):
            choice = dict(zip(names, combo))
            if not _feasible(cost, choice, grouping, wf.phases, limit, npool, wf.execution, memo):
                continue
            if sync is not None and not cost.weight_sync_fits(choice[sync[0]].layout,
                                                              choice[sync[1]].layout):
                continue
            lat: dict[str, float] = {
                n: cost.estimate(n, c, _idle(cost, n, groups, choice)).latency_s
                for n, c in choice.items()}
            s = cost.weight_sync(choice[sync[0]], choice[sync[1]]).latency_s if sync else 0.0
            step, _ = step_and_terms(wf, groups, lat, s)
            sized.append((step, len(sized), grouping, choice))
    sized.sort(key=lambda x: (x[0], x[1]))

    def runs(g: int, room: tuple[int, ...]):
        """Node-label sequences of ``g`` GPUs, one run per node, within ``room``."""
        def counts(i: int, left: int):
            if i == len(room):
                if not left:
                    yield ()
                return
            for k in range(min(left, room[i]) + 1):
                for rest in counts(i + 1, left - k):
                    yield (k, *rest)
        for c in counts(0, g):
            used = [i for i in range(len(room)) if c[i]]
            for order in itertools.permutations(used):
                yield c, tuple(i for i in order for _ in range(c[i]))

    def ids_of(labels: tuple[int, ...], top: bool) -> tuple[int, ...]:
        # representative ids (cost reads nodes only); generation counts from a node's top so
        # that its ids never meet training's in an asynchronous step
        seen: dict[int, int] = {}
        out = []
        for i in labels:
            k = seen.get(i, 0)
            seen[i] = k + 1
            ids = by_node[nodes[i]]
            out.append(ids[len(ids) - 1 - k] if top else ids[k])
        return tuple(out)

    def group_options(grp: tuple[str, ...], choice, room, top: bool):
        """Per way of laying ``grp``: counts per node, per-stage StagePlan, group latency,
        whether every TP group sits inside a node."""
        g = max(choice[n].gpus for n in grp)
        out = []
        for c, labels in runs(g, room):
            ids = ids_of(labels, top)
            sps, lat, inside = {}, 0.0, True
            for n in grp:
                cand = choice[n]
                size = cand.layout.size
                reps = tuple(ids[r * size:(r + 1) * size] for r in range(cand.dp))
                links = cost.placed_links(cand.layout, reps)
                if cand.tp <= node_cap and links.tp:
                    inside = False
                est = cost.estimate(n, cand, _idle(cost, n, [grp], choice), links)
                sps[n] = StagePlan(n, cand, reps, est.latency_s)
                lat += est.latency_s
            out.append((c, sps, lat, inside))
        return out

    def phase_options(part, choice, room, top: bool, must_inside: bool):
        """Every joint placement of a phase's groups within ``room``."""
        opts = [[o for o in group_options(grp, choice, room, top) if o[3] or not must_inside]
                for grp in part]
        for pick in itertools.product(*opts):
            used = tuple(sum(o[0][i] for o in pick) for i in range(len(room)))
            if any(u > r for u, r in zip(used, room)):
                continue
            sps = {n: sp for o in pick for n, sp in o[1].items()}
            yield used, sps, max((o[2] for o in pick), default=0.0)

    def need(part, choice) -> dict[int, int]:
        return add_need(*(merge_need(*(stage_need(choice[n].tp, choice[n].gpus, node_cap)
                                       for n in grp)) for grp in part))

    best = math.inf
    for price, _, grouping, choice in sized:
        if price >= best * (1 - 1e-9):
            break
        parts = dict(zip(wf.phases, grouping))
        groups = [g for part in grouping for g in part]
        if not is_async:
            lat = {}
            ok = True
            for part in parts.values():
                inside = need_fits(need(part, choice), caps)
                got = min(phase_options(part, choice, caps, False, inside), key=lambda x: x[2],
                          default=None)
                if got is None:
                    ok = False
                    break
                lat.update({n: sp.latency_s for n, sp in got[1].items()})
            if ok:
                s = cost.weight_sync(choice[sync[0]], choice[sync[1]]).latency_s if sync else 0.0
                best = min(best, step_and_terms(wf, groups, lat, s)[0])
            continue
        gen_part = parts.get(Phase.GENERATION, [])
        rest = [p for p in wf.phases if p is not Phase.GENERATION]
        inside = need_fits(add_need(need(gen_part, choice),
                                    merge_need(*(need(parts[p], choice) for p in rest))), caps)
        for used, gen_sps, _ in phase_options(gen_part, choice, caps, True, inside):
            room = tuple(c - u for c, u in zip(caps, used))
            per_phase = {p: list(phase_options(parts[p], choice, room, False, inside))
                         for p in rest}
            for p, v in per_phase.items():  # only the phase that trains the synced weights
                if v and not (sync and sync[0] in {n for g in parts[p] for n in g}):
                    per_phase[p] = [min(v, key=lambda x: x[2])]  # ... has more than a latency
            if any(not v for v in per_phase.values()):
                continue
            for pick in itertools.product(*(per_phase[p] for p in rest)):
                sps = dict(gen_sps)
                for o in pick:
                    sps.update(o[1])
                s = 0.0
                if sync:
                    s = weight_sync_estimate(cost, sps[sync[0]], sps[sync[1]]).latency_s
                lat = {n: sp.latency_s for n, sp in sps.items()}
                best = min(best, step_and_terms(wf, groups, lat, s)[0])
    return best


def _idle(cost: CostModel, name: str, groups, choice: dict[str, Candidate]) -> int:
    for g in groups:
        if name in g:
            return int(sum(cost.resident_bytes(o, choice[o].layout) for o in g if o != name))
    return 0
