"""Place the chosen candidates on concrete GPU ids.

Each phase uses the pool afresh (idle model-stages are offloaded between phases). Inside a phase
every group of model-stages gets a disjoint GPU list; its stages lay their replicas over a prefix
of that list, TP innermost. The list is built from chunks that each sit inside one node and
whose size is a multiple of every TP degree of the group, so no TP group spans nodes when the
pool allows it; where it cannot, the chunk spans nodes and the plan says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nereus.cost.candidate import Candidate
from nereus.spec.cluster import GpuPool


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


def place_phase(pool: GpuPool, groups: Sequence[GroupAssignment]) -> dict[str, list[tuple[int, ...]]]:
    """GPU ids per replica for every stage of one phase; raises if the pool is too small."""
    node_free = {n: list(ids) for n, ids in pool.by_node().items()}
    node_size = max(len(v) for v in node_free.values())
    # place the groups with the largest chunks first so smaller chunks fill the gaps
    order = sorted(groups, key=lambda g: (-_chunk_unit(g, node_size), -g.gpus))
    out: dict[str, list[tuple[int, ...]]] = {}
    for grp in order:
        unit = _chunk_unit(grp, node_size)
        ids: list[int] = []
        for size in _chunk_sizes(grp.gpus, unit):
            fits = [n for n, free in node_free.items() if len(free) >= size]
            if fits:  # best fit: the node with the fewest free GPUs that still holds the chunk
                n = min(fits, key=lambda k: (len(node_free[k]), k))
                ids += node_free[n][:size]
                node_free[n] = node_free[n][size:]
                continue
            for n in sorted(node_free, key=lambda k: -len(node_free[k])):  # span nodes
                take = min(size, len(node_free[n]))
                ids += node_free[n][:take]
                node_free[n] = node_free[n][take:]
                size -= take
                if not size:
                    break
            if size:
                raise ValueError(f"pool of {pool.size} GPUs cannot hold group {grp.stages}")
        for name, cand in zip(grp.stages, grp.candidates):
            size = cand.layout.size
            out[name] = [tuple(ids[r * size:(r + 1) * size]) for r in range(cand.dp)]
    return out
