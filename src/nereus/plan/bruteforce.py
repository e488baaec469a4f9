"""Brute-force plan search for small instances: the reference the exact search is tested against.

It enumerates every grouping of every phase and every combination of memory-feasible candidates,
checks memory with the per-stage estimates (a member's peak with its group-mates' resident
state beside it), and scores each combination by the critical path of the execution-overlap
graph. Nothing of the search's pruning, Pareto points or conditioning is reused.
"""

from __future__ import annotations

import itertools
import math

import networkx as nx

from nereus.cost.candidate import Candidate
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.overlap import END, SYNC, overlap_graph
from nereus.plan.search import set_partitions
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, Phase, StageKind


def brute_force_latency(job: JobSpec, cost: CostModel | None = None,
                        max_combinations: int = 2_000_000) -> float:
    """The lowest step latency over all valid plans (math.inf when none fits)."""
    cost = cost or CostModel(job)
    wf = job.workflow
    limit = HEADROOM * cost.device.memory_bytes
    pool = job.pool.size
    cands: dict[str, list[Candidate]] = {}
    lat: dict[tuple[str, Candidate], float] = {}
    for st in wf.stages:
        cs = enumerate_candidates(cost, st, pool)
        ok = [c for c in cs if cost.estimate(st, c).fits]
        if not ok and cost.node_size < pool:
            cs = enumerate_candidates(cost, st, pool, max_tp=pool)
            ok = [c for c in cs if cost.estimate(st, c).fits]
        cands[st.name] = ok
        for c in ok:
            lat[(st.name, c)] = cost.estimate(st, c).latency_s
    total = math.prod(max(1, len(v)) for v in cands.values())
    if total > max_combinations:
        raise ValueError(f"{total} combinations: too many for brute force")
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
