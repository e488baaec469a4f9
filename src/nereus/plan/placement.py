"""Place the chosen candidates on concrete GPU ids.

Each phase uses the pool afresh (idle model-stages are offloaded between phases). Inside a phase
every group of model-stages gets a disjoint GPU list; its stages lay their replicas over a prefix
of that list, TP innermost. The list is built from chunks that each sit inside one node and
whose size is a multiple of every TP degree of the group, so no TP group spans nodes when the
pool allows it; where it cannot, the chunk spans nodes and the plan says so.

Chunks go to the node with the fewest free GPUs that still holds them (best fit: keeps whole
nodes free for later groups). ``spread`` instead sends each chunk to the node with the most
free GPUs, so the replicas of a stage land on different nodes where the pool allows it and
losing one node leaves a copy of its state (``nereus.plan.exposure`` checks the result).

A stage may prefer GPUs (``nereus.plan.search`` asks for it in synchronous execution): the
training stage that sends weights prefers the pool's fullest nodes, and generation the training
GPUs, then the rest of their nodes, then other nodes (HybridFlow's rank mapping, which
``CostModel.sync_receivers`` prices), so the weight sync a plan was priced with is the one its
placement runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nereus.cost.candidate import Candidate
from nereus.spec.cluster import Cluster, GpuPool


@dataclass(frozen=True)
class GroupAssignment:
    """Stages sharing one GPU set in a phase, with their candidates (same order)."""

    stages: tuple[str, ...]
    candidates: tuple[Candidate, ...]

    @property
    def gpus(self) -> int:
        return max(c.gpus for c in self.candidates)


def _chunk_sizes(total: int, unit: int) -> list[int]:
    """``total`` as chunks of ``unit`` then descending powers of two for the remainder."""
    sizes = [unit] * (total // unit)
    rest = total % unit
    p = 1 << max(0, rest.bit_length() - 1)
    while rest:
        if p <= rest:
            sizes.append(p)
            rest -= p
        p >>= 1
    return sizes


def _chunk_unit(group: GroupAssignment, node_size: int) -> int:
    unit = 1
    for c in group.candidates:
        want = c.layout.size if c.layout.size <= node_size else c.tp
        unit = max(unit, min(want, node_size))
    while unit & (unit - 1):  # a power of two that every TP degree (powers of two) divides
        unit &= unit - 1
    return unit


def _take(node_free: dict[int, list[int]], total: int, unit: int, what: str,
          spread: bool = False, prefer: frozenset[int] = frozenset(), whole: bool = False,
          sizes: Sequence[int] | None = None) -> list[int]:
    """``total`` GPUs as node-contained chunks (best fit, or worst fit to ``spread``); a chunk
    spans nodes only if it must. With ``prefer``, a chunk goes where it takes the most preferred
    GPUs, then to a node that had any, and takes those GPUs first. ``whole``: one chunk of
    ``total`` where a node holds it (a stage's replicas on one node: their DP groups, and
    pipelines, then run on its fabric, as the search's sizes priced them), else chunks of the
    fullest node's free GPUs first. ``sizes``: these
    chunks instead."""
    ids: list[int] = []
    sign = -1 if spread else 1
    near = {n for n, free in node_free.items() if prefer.intersection(free)}
    if sizes is None:
        most = max((len(free) for free in node_free.values()), default=0)
        if whole and most >= total:
            sizes = [total]
        elif whole and most - most % unit > unit:
            # no node holds it all: the fullest nodes whole (in whole units, so no replica
            # straddles two chunks), then the rest, so that a group of a node's size inside
            # the part (a stage's DP group) still finds one node
            sizes = _chunk_sizes(total, most - most % unit)
        else:
            sizes = _chunk_sizes(total, unit)
    for size in sizes:
        if not prefer:  # the common case, the same choice without the preference's terms
            best, best_key = None, None
            for n, free in node_free.items():
                left = len(free)
                if left >= size and (best_key is None or (sign * left, n) < best_key):
                    best, best_key = n, (sign * left, n)
            if best is not None:
                ids += node_free[best][:size]
                node_free[best] = node_free[best][size:]
                continue
        fits = [n for n, free in node_free.items() if len(free) >= size]
        if fits:
            hits = {n: min(size, len(prefer.intersection(node_free[n]))) for n in fits} \
                if prefer else dict.fromkeys(fits, 0)
            n = min(fits, key=lambda k: (-hits[k], k not in near, sign * len(node_free[k]), k))
            # preferred GPUs first, then the others, each in node order
            took = (sorted(node_free[n], key=lambda g: g not in prefer) if prefer
                    else node_free[n])[:size]
            ids += took
            gone = set(took)
            node_free[n] = [g for g in node_free[n] if g not in gone]
            continue
        for n in sorted(node_free, key=lambda k: -len(node_free[k])):  # span nodes
            take = min(size, len(node_free[n]))
            ids += node_free[n][:take]
            node_free[n] = node_free[n][take:]
            size -= take
            if not size:
                break
        if size:
            raise ValueError(f"the pool cannot hold {what}")
    return ids


def _free(pool: GpuPool) -> dict[int, list[int]]:
    return {n: list(ids) for n, ids in pool.by_node().items()}


def unit_of(groups: Sequence[GroupAssignment], pool: GpuPool) -> int:
    node_size = max(len(v) for v in pool.by_node().values())
    return max((_chunk_unit(g, node_size) for g in groups), default=1)


def split_pool(pool: GpuPool, parts: Sequence[tuple[int, int]], spread: bool = False,
               whole: bool = False) -> list[GpuPool]:
    """Disjoint sub-pools of (size, chunk unit), the largest units placed first. ``spread``:
    chunks go to the emptiest node, so each sub-pool spans nodes where the pool allows.
    ``whole``: a part goes to one node where one holds it (the largest parts first)."""
    free = _free(pool)
    out: dict[int, list[int]] = {}
    key = (lambda i: -parts[i][0]) if whole else (lambda i: -parts[i][1])
    for i in sorted(range(len(parts)), key=key):
        size, unit = parts[i]
        out[i] = _take(free, size, unit, f"a part of {size} GPUs", spread,
                       whole=whole) if size else []
    return [GpuPool(pool.cluster, tuple(out[i])) if out[i] else pool for i in range(len(parts))]


def tp_blocks(group: GroupAssignment, node_cap: int) -> list[int]:
    """The blocks (largest first) a group's GPU list must keep inside nodes so that every TP
    group of its stages, laid over a prefix of the list TP innermost, sits inside a node: at
    each position, the largest TP degree among the stages that reach past it (a TP degree
    over ``node_cap`` spans nodes anyway and asks nothing). Sizes are powers of two, each
    starting at a multiple of itself."""
    stages = [(c.tp if c.tp <= node_cap else 1, c.gpus) for c in group.candidates]
    out: list[int] = []
    at = 0
    while at < group.gpus:
        level = max((t for t, g in stages if g > at), default=1)
        out.append(level)
        at += level
    return out


def take_blocks(pool: GpuPool, parts: Sequence[Sequence[int]], what: str = "the plan"
                ) -> list[list[int]]:
    """Disjoint GPU lists, one per part of blocks: every block inside a node where the pool's
    nodes can hold all the parts' blocks together. Blocks go largest first over all parts (with
    sizes powers of two, that never wastes room a later block needs), each to the node with
    the fewest free GPUs that holds it; a part lists its blocks in its own order."""
    free = _free(pool)
    order = sorted(((size, i, k) for i, part in enumerate(parts) for k, size in enumerate(part)),
                   key=lambda x: -x[0])
    got: list[dict[int, list[int]]] = [{} for _ in parts]
    for size, i, k in order:
        got[i][k] = _take(free, size, size, what, sizes=[size])
    return [[g for k in sorted(got[i]) for g in got[i][k]] for i in range(len(parts))]


def lay(groups: Sequence[GroupAssignment], lists: Sequence[Sequence[int]]
        ) -> dict[str, list[tuple[int, ...]]]:
    """Each group's stages over a prefix of its GPU list, replica after replica, TP innermost."""
    out: dict[str, list[tuple[int, ...]]] = {}
    for grp, ids in zip(groups, lists):
        for name, cand in zip(grp.stages, grp.candidates):
            size = cand.layout.size
            out[name] = [tuple(ids[r * size:(r + 1) * size]) for r in range(cand.dp)]
    return out


def place_phase(pool: GpuPool, groups: Sequence[GroupAssignment], spread: bool = False,
                prefer: Mapping[str, Iterable[int]] | None = None,
                weight: Mapping[str, float] | None = None, whole: bool = False
                ) -> dict[str, list[tuple[int, ...]]]:
    """GPU ids per replica for every stage of one phase; raises if the pool is too small.
    ``spread``: chunks go to the emptiest node (replicas over nodes) instead of best fit.
    ``prefer``: GPUs a stage's group takes first (that group is placed first). ``weight``:
    among the groups that prefer GPUs, the one whose stages weigh most goes first (what
    staying where it is saves), before the largest chunks. ``whole``: a group goes to one
    node where one holds it, the largest groups first."""
    free = _free(pool)
    node_size = max(len(v) for v in free.values())
    prefer = prefer or {}
    weight = weight or {}

    def wanted(g: GroupAssignment) -> frozenset[int]:
        return frozenset(i for s in g.stages for i in prefer.get(s, ()))

    # place the groups with the largest chunks first so smaller chunks fill the gaps (a group
    # that prefers GPUs goes before all: it is placed to match how it was priced)
    def size_first(g: GroupAssignment) -> tuple[int, int]:
        big = (-g.gpus, -_chunk_unit(g, node_size))
        return big if whole else (big[1], big[0])

    order = sorted(groups, key=lambda g: (not wanted(g), -sum(weight.get(s, 0.0) for s in g.stages),
                                          *size_first(g)))
    lists = {grp: _take(free, grp.gpus, _chunk_unit(grp, node_size), f"group {grp.stages}",
                        spread, wanted(grp), whole and grp.gpus <= node_size)
             for grp in order}
    return lay(groups, [lists[g] for g in groups])


def tp_groups_off_node(replicas: Sequence[Sequence[int]], tp: int, cluster: Cluster) -> int:
    """How many TP groups of ``replicas`` (TP innermost) span nodes."""
    return sum(not cluster.same_node(r[i:i + tp]) for r in replicas for i in range(0, len(r), tp))
