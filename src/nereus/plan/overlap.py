"""The execution-overlap graph of one RL step and its critical path (the step latency).

Nodes are model-stages (weighted by their latency) and the weight sync. Stages sharing a GPU
set run one after another (a chain); groups of one phase run side by side; in synchronous
execution phases follow one another (generation -> inference -> training -> weight sync). In
asynchronous execution the next step's generation overlaps inference and training, and the
interval between weight syncs is the critical path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import networkx as nx

from nereus.spec.workflow import Execution, Phase, Workflow

START, END, SYNC = "<start>", "<end>", "weight_sync"


def overlap_graph(workflow: Workflow, groups: Sequence[Sequence[str]],
                  latency: Mapping[str, float], sync_s: float) -> nx.DiGraph:
    """Build the graph; every stage of ``workflow`` must be in exactly one of ``groups``."""
    g = nx.DiGraph()
    g.add_node(START, weight=0.0)
    g.add_node(END, weight=0.0)
    g.add_node(SYNC, weight=float(sync_s))
    by_phase: dict[Phase, list[Sequence[str]]] = {}
    order = {s.name: i for i, s in enumerate(workflow.stages)}
    for grp in groups:
        phase = workflow.stage(grp[0]).phase
        by_phase.setdefault(phase, []).append(sorted(grp, key=order.__getitem__))

    def chain_from(src: str, phase: Phase) -> str:
        barrier = f"<{phase.value} done>"
        g.add_node(barrier, weight=0.0)
        for grp in by_phase.get(phase, []):
            prev = src
            for name in grp:
                g.add_node(name, weight=float(latency[name]))
                g.add_edge(prev, name)
                prev = name
            g.add_edge(prev, barrier)
        if not by_phase.get(phase):
            g.add_edge(src, barrier)
        return barrier

    if workflow.execution is Execution.SYNC:
        node = START
        for phase in Phase:
            node = chain_from(node, phase)
        g.add_edge(node, SYNC)
    else:
        gen_done = chain_from(START, Phase.GENERATION)
        node = START
        for phase in (Phase.INFERENCE, Phase.TRAINING):
            node = chain_from(node, phase)
        g.add_edge(gen_done, SYNC)
        g.add_edge(node, SYNC)
    g.add_edge(SYNC, END)
    return g


def critical_path(g: nx.DiGraph) -> tuple[float, list[str]]:
    """Length (sum of node weights) and nodes of the longest START -> END path."""
    best: dict[str, tuple[float, str | None]] = {}
    for n in nx.topological_sort(g):
        w = g.nodes[n]["weight"]
        preds = list(g.predecessors(n))
        if not preds:
            best[n] = (w, None)
            continue
        p = max(preds, key=lambda q: best[q][0])
        best[n] = (best[p][0] + w, p)
    path, n = [], END
    while n is not None:
        path.append(n)
        n = best[n][1]
    return best[END][0], [x for x in reversed(path) if not x.startswith("<")]


def step_latency(workflow: Workflow, groups: Sequence[Sequence[str]],
                 latency: Mapping[str, float], sync_s: float) -> float:
    """``critical_path(overlap_graph(...))[0]`` without building the graph: every plan is
    priced so, at every step of a simulated run, and the graph depends on the groups alone.
    Its nodes are visited in the graph's topological order once per (workflow, groups), and
    each step sums the same weights along the same longest path, so the value is the same
    float."""
    value: dict[str, float] = {}
    for node, weight, preds in _sweep(workflow, tuple(tuple(g) for g in groups)):
        w = 0.0 if weight is None else float(sync_s) if weight == SYNC \
            else float(latency[weight])
        value[node] = max(value[p] for p in preds) + w if preds else w
    return value[END]


def step_and_terms(workflow: Workflow, groups: Sequence[Sequence[str]],
                   latency: Mapping[str, float], sync_s: float
                   ) -> tuple[float, dict[str, float]]:
    """A plan's step latency (``step_latency``) and its terms: per phase, its slowest group
    (a group's model-stages run one after another, the groups side by side), and the weight
    sync. ``groups`` holds every model-stage, a stage that shares no GPUs as a group of
    one."""
    terms = {p.value: max((sum(latency[n] for n in g) for g in groups
                           if workflow.stage(g[0]).phase is p), default=0.0)
             for p in workflow.phases}
    terms["weight_sync"] = sync_s
    return step_latency(workflow, groups, latency, sync_s), terms


@lru_cache(maxsize=256)
def _sweep(workflow: Workflow, groups: tuple[tuple[str, ...], ...]
           ) -> tuple[tuple[str, str | None, tuple[str, ...]], ...]:
    """The overlap graph's nodes in topological order, each with what weighs it (a stage's
    name, ``SYNC``, or None for a weightless node) and its predecessors."""
    stages = {n for grp in groups for n in grp}
    g = overlap_graph(workflow, groups, dict.fromkeys(stages, 0.0), 0.0)
    return tuple((n, n if n in stages else SYNC if n == SYNC else None,
                  tuple(g.predecessors(n))) for n in nx.topological_sort(g))
