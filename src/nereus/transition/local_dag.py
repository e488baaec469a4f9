"""The local DAG of one model-stage: Split -> Destroy -> Extend -> Merge through T_sub (§6.1).

Both layouts split into T_sub = (gcd(tp, tp*), gcd(pp, pp*)). Every target unit is then a Merge
of k* "slots", T_sub units on fixed GPU lists (the nesting mapping). A T_sub piece of a current
unit that already sits on a slot's exact GPUs is kept there, so shards already on their target
ranks are never copied; the other slots are filled by Extend from a kept or newly made unit, or
from a piece to be destroyed on the slot's node (chains make a broadcast tree); the pieces
nobody keeps are destroyed. A current unit is split only if one of its pieces is kept, or, when
nothing is kept anywhere, if one of its pieces is an Extend's source (the sources are chosen
over the pieces of every unit first, then only their units split); the others are destroyed
whole, since a Split whose pieces are all destroyed moves a full all-gather for nothing. The
last copy: when nothing is kept, a source is destroyed only after the Extends that copy it have
ended, and a unit destroyed whole is never the last copy (a split unit's pieces are copies).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nereus.cost.candidate import Layout
from nereus.plan.types import StagePlan
from nereus.spec.cluster import format_gpus
from nereus.spec.model import ModelSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workload import divisors
from nereus.transition.cost import TransitionCost
from nereus.transition.emu import Emu, emu_id
from nereus.transition.nesting import common_layout, merge_gpus, nesting_problem, split_gpus
from nereus.transition.primitives import Destroy, Extend, Merge, Primitive, Split
from nereus.transition.sizes import format_bytes


@dataclass(frozen=True)
class LocalDag:
    """Primitives of one model-stage, edges (before, after) between them (local indices), and
    ``final[i]``: the unit that realizes target replica i. ``problem`` says why none exists."""

    stage: str
    primitives: tuple[Primitive, ...]
    edges: tuple[tuple[int, int], ...]
    final: tuple[Emu, ...]
    problem: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.primitives)


class _Ids:
    """Next free ``"<stage>/<n>"`` ids, after the ones the current units hold."""

    def __init__(self, stage: str, taken: Sequence[str]):
        self.stage = stage
        self.taken = set(taken)
        self.n = 0

    def __call__(self) -> str:
        while emu_id(self.stage, self.n) in self.taken:
            self.n += 1
        i = emu_id(self.stage, self.n)
        self.taken.add(i)
        return i


def sub_layouts(model: ModelSpec, lay: Layout, tlay: Layout) -> list[Layout]:
    """Every T_sub both layouts split into whose shards nest, largest first."""
    top = common_layout(lay, tlay)
    out = [Layout(tp, pp) for tp in range(top.tp, 0, -1) if top.tp % tp == 0
           for pp in range(top.pp, 0, -1) if top.pp % pp == 0]
    out = [s for s in out
           if nesting_problem(model, lay, s) is None and nesting_problem(model, tlay, s) is None]
    return sorted(out, key=lambda s: -s.size)


def _pieces(current: Sequence[Emu], tgt_units: Sequence[tuple[int, ...]], lay: Layout,
            tlay: Layout, sub: Layout) -> tuple[int, int]:
    """(pieces split, slots to fill) with T_sub = ``sub``: a cheap score of the bytes moved."""
    k, kt = lay.size // sub.size, tlay.size // sub.size
    where: dict[tuple[int, ...], int] = {}
    for u, e in enumerate(current):
        for g in (split_gpus(e.gpus, lay, sub) if k > 1 else (e.gpus,)):
            where[g] = u
    units: set[int] = set()
    unmatched = 0
    for g in tgt_units:
        for piece in (split_gpus(g, tlay, sub) if kt > 1 else (g,)):
            if piece in where:
                units.add(where[piece])
            else:
                unmatched += 1
    n_split = len(units) if units else len(current)
    return (n_split * (k - 1) if k > 1 else 0), unmatched


def local_dag(current: Sequence[Emu], target: StagePlan, model: ModelSpec,
              cost: TransitionCost, capacity_bytes: int | None = None,
              reserved: Sequence[str] = (), hops: bool = True, eager: bool = True
              ) -> LocalDag:
    """The local DAG through the T_sub that moves the fewest bytes (full state copies split or
    extended), preferring larger T_sub; the largest common layout comes first on ties, and
    smaller ones serve when its pieces cannot reach the target GPUs or nothing nests there.
    T_sub candidates whose split does not fit a GPU on its own are tried last; when every
    candidate has a Split or Merge that exceeds a GPU's capacity by itself, that is the
    ``problem`` (for the largest such T_sub), since no order of the transition can help.

    Unless even that fails, no unit outgrows a GPU: a Split or Merge that would is staged
    through host memory; and when every T_sub is still too big (a (2, 1) unit to (1, 8) goes
    through whole unsharded copies), the stage moves in two hops through the smallest layout
    both split into (:func:`_two_hops`). ``reserved``: unit ids already taken.

    ``eager`` (the default) picks the Extends' sources for the fastest fan-out: the order of
    slot order and one slot per node in turn (:func:`_node_turns`) whose fan-out ends first,
    and a piece due for destruction on a slot's own node may send to it even while another
    piece is kept. Such a source holds its GPUs until its Extends end, and which copies pass
    the state on changes which GPUs free when, so a concurrent stage waiting for those GPUs
    can wait for a Destroy that itself waits for that stage's. ``eager`` False restores the
    rules before both: slots in slot order, and while a piece is kept only kept and new units
    send (a doomed piece only when none of those can); :func:`build_dag` falls back to it
    when no replay of the eager DAG fits."""
    stage = target.stage
    tgt_units = [tuple(r) for r in target.replicas]
    lay, tlay = current[0].layout, target.layout
    if lay == tlay and sorted(e.gpus for e in current) == sorted(tgt_units):
        by_gpus = {e.gpus: e for e in current}
        return LocalDag(stage, (), (), tuple(by_gpus[g] for g in tgt_units))
    subs = sub_layouts(model, lay, tlay)
    if not subs:
        p = nesting_problem(model, lay, common_layout(lay, tlay)) or \
            nesting_problem(model, tlay, common_layout(lay, tlay))
        return LocalDag(stage, (), (), (), f"{stage}: {lay} -> {tlay}: {p}")
    e0 = current[0]
    # a Split holds the current shard, the sub-shard and its staging buffers, a Merge the
    # sub-shard and the target's
    ends_max = max(max(cost.sizes.of(e0)),
                   max(cost.sizes.of_layout(e0.model, e0.trainable, tlay)))

    def fits(sub: Layout) -> bool:
        if capacity_bytes is None:
            return True
        work = cost.sizes.split_staging(e0.model, e0.trainable, lay, sub) if sub != lay else 0
        return ends_max + max(cost.sizes.of_layout(e0.model, e0.trainable, sub)) + work \
            <= capacity_bytes

    ranked = sorted(subs, key=lambda s: (not fits(s), sum(_pieces(current, tgt_units, lay, tlay,
                                                                   s)), -s.size))
    first: LocalDag | None = None
    too_big: tuple[Layout, str] | None = None  # the largest T_sub whose Split or Merge alone
    for sub in ranked:                          # exceeds a GPU's capacity, and why
        dag = _through(current, target, tgt_units, sub, cost, reserved, eager)
        if (dag.problem is None and capacity_bytes is not None and not fits(sub)
                and _over_capacity(dag, lay, tlay, sub, cost, capacity_bytes) is not None):
            dag = _staged(dag, cost, capacity_bytes)
            over = _over_capacity(dag, lay, tlay, sub, cost, capacity_bytes)
            if over is not None:
                if too_big is None or sub.size > too_big[0].size:
                    too_big = (sub, over)
                continue
        if dag.problem is None:
            return dag
        first = first or dag
    if too_big is not None:  # memory, whatever runs first, stands in the way
        if hops and capacity_bytes is not None:
            two = _two_hops(current, target, model, cost, capacity_bytes, reserved, eager)
            if two is not None:
                return two
        return LocalDag(stage, (), (), (), too_big[1])
    assert first is not None
    return first


def _staged(dag: LocalDag, cost: TransitionCost, capacity_bytes: int) -> LocalDag:
    """``dag`` with every Split and Merge that outgrows a GPU by itself staged through host
    memory (its peak is then the larger of its two shards, not both)."""
    prims = tuple(
        replace(p, staged=True) if isinstance(p, (Split, Merge)) and any(
            m.during > capacity_bytes for m in p.memory(cost.sizes).values()) else p
        for p in dag.primitives)
    return replace(dag, primitives=prims)


def _over_capacity(dag: LocalDag, lay: Layout, tlay: Layout, sub: Layout, cost: TransitionCost,
                   capacity_bytes: int) -> str | None:
    """Why a Split or Merge of ``dag`` cannot run even on GPUs that hold nothing else (None when
    each fits alone): Split keeps the source shard until its all-gather ends, Merge keeps the
    sub-shard until the new shard is cut out of it; staged through host memory, each still
    holds the larger of the two. No order of the transition helps."""
    worst: dict[str, tuple[int, int, int]] = {}  # op -> (peak, before, extra)
    crowded: dict[str, set[int]] = {}             # op -> GPUs it outgrows
    for p in dag.primitives:
        if not isinstance(p, (Split, Merge)):
            continue
        for g, m in p.memory(cost.sizes).items():
            if m.during > capacity_bytes:
                crowded.setdefault(p.op, set()).add(g)
                if m.during > worst.get(p.op, (-1, 0, 0))[0]:
                    worst[p.op] = (m.during, m.before, m.during - m.before)
    if not worst:
        return None
    op = max(worst, key=lambda o: (worst[o][0], o == "Split"))  # ties: the Split runs first
    (peak, before, extra), gpus = worst[op], sorted(crowded[op])
    if any(p.staged for p in dag.primitives if p.op == op):
        what = ("its new shard and staging buffers, even with its source staged through "
                "host memory"
                if op == "Split" else "its sub-shard, even with the new one staged through "
                "host memory")
    else:
        what = (f"{format_bytes(before)} + {format_bytes(extra)}: " + (
            "its source shard stays until the all-gather ends" if op == "Split"
            else "the sub-shard stays until the new shard is cut out of it"))
    return (f"{dag.stage}: {lay} -> {tlay} goes through units of {sub}, and its {op} needs "
            f"up to {format_bytes(peak)} on GPU{'s' if len(gpus) > 1 else ''} "
            f"{format_gpus(gpus)} by itself ({what}), over the {format_bytes(capacity_bytes)} "
            "a GPU may hold, whatever else moves first")


def _two_hops(current: Sequence[Emu], target: StagePlan, model: ModelSpec,
              cost: TransitionCost, capacity_bytes: int, reserved: Sequence[str],
              eager: bool = True) -> LocalDag | None:
    """current -> I -> target through one unit of an intermediate layout I on the target's GPUs,
    when every direct T_sub is too big for a GPU: a (2, 1) unit to (1, 8) would go through
    whole unsharded copies, but through (2, 4) each hop's T_sub is half the state or less.

    I ranges over the layouts whose tp and pp divide lcm(tp, tp*) and lcm(pp, pp*), with at most
    as many GPUs as the target has; the ones whose smaller T_sub (with the current layout, with
    the target) is largest come first. I's GPUs are the target's own pieces of the second hop's
    T_sub, merged, so the second hop splits I straight onto them. None when no I gives two hops
    without a problem."""
    lay, tlay = current[0].layout, target.layout
    top = Layout(math.lcm(lay.tp, tlay.tp), math.lcm(lay.pp, tlay.pp))
    room = sum(len(r) for r in target.replicas)
    mids = [Layout(tp, pp) for tp in divisors(top.tp) for pp in divisors(top.pp)
            if Layout(tp, pp) not in (lay, tlay) and tp * pp <= room]

    def score(mid: Layout) -> tuple[int, int]:
        a, b = common_layout(lay, mid).size, common_layout(mid, tlay).size
        return min(a, b), max(a, b)

    for mid in sorted(mids, key=lambda m: (score(m), -m.size), reverse=True):
        if score(mid)[0] <= common_layout(lay, tlay).size:
            break  # no better than going straight
        sub = common_layout(mid, tlay)
        if (layout_problem(model, mid.tp, mid.pp) or nesting_problem(model, mid, sub)
                or nesting_problem(model, tlay, sub)):
            continue
        pieces = [p for r in target.replicas for p in split_gpus(r, tlay, sub)]
        k = mid.size // sub.size
        gpus = merge_gpus(pieces[:k], sub, mid)
        hop = StagePlan(target.stage, replace(target.candidate, layout=mid, dp=1), (gpus,))
        taken = [*reserved, *(e.id for e in current)]
        first = local_dag(current, hop, model, cost, capacity_bytes, taken, hops=False,
                          eager=eager)
        if first.problem is not None:
            continue
        taken += [e.id for p in first.primitives for e in p.outputs]
        second = local_dag(first.final, target, model, cost, capacity_bytes, taken,
                           hops=False, eager=eager)
        if second.problem is not None:
            continue
        # the second hop's primitives that read a unit the first made wait for its producer
        made = {e.id: i for i, p in enumerate(first.primitives) for e in p.outputs}
        n = len(first.primitives)
        edges = list(first.edges) + [(a + n, b + n) for a, b in second.edges]
        for j, p in enumerate(second.primitives):
            edges += [(made[e.id], j + n) for e in p.inputs if e.id in made]
        return LocalDag(target.stage, first.primitives + second.primitives,
                        tuple(sorted(set(edges))), second.final)
    return None


def _through(current: Sequence[Emu], target: StagePlan, tgt_units: list[tuple[int, ...]],
             sub: Layout, cost: TransitionCost, reserved: Sequence[str] = (),
             eager: bool = True) -> LocalDag:
    """The local DAG through ``sub``. When no piece is kept, the Extends' sources are chosen
    over the pieces of every current unit; then only the units they come from are split (again,
    until each split unit feeds an Extend: fewer sources can pick differently on a tie)."""
    split: Sequence[int] | None = None
    while True:
        dag, sources = _through_split(current, target, tgt_units, sub, cost, reserved, split,
                                      eager)
        if dag.problem is not None or sources is None or len(sources) == len(split or current):
            return dag
        split = sorted(sources)


def _through_split(current: Sequence[Emu], target: StagePlan, tgt_units: list[tuple[int, ...]],
                   sub: Layout, cost: TransitionCost, reserved: Sequence[str],
                   only: Sequence[int] | None, eager: bool = True
                   ) -> tuple[LocalDag, set[int] | None]:
    """The local DAG through ``sub`` that splits the current units ``only`` (None: those with a
    kept piece; when none has, every one) and the current units whose pieces an Extend copies
    (None when a piece is kept or nothing is split: the split units need no choosing)."""
    stage = target.stage
    lay, tlay = current[0].layout, target.layout
    k = lay.size // sub.size
    kt = tlay.size // sub.size
    ids = _Ids(stage, [*reserved, *(e.id for e in current)])
    prims: list[Primitive] = []
    edges: list[tuple[int, int]] = []

    def add(p: Primitive, deps: Sequence[int | None] = ()) -> int:
        prims.append(p)
        i = len(prims) - 1
        for d in deps:
            if d is not None:
                edges.append((d, i))
        return i

    # T_sub pieces of every current unit, and the slots of every target unit
    pieces = [split_gpus(u.gpus, lay, sub) if k > 1 else (u.gpus,) for u in current]
    slots = [split_gpus(g, tlay, sub) if kt > 1 else (g,) for g in tgt_units]
    where = {g: (u, j) for u, ps in enumerate(pieces) for j, g in enumerate(ps)}
    match: dict[tuple[int, int], tuple[int, int]] = {}
    for q, ss in enumerate(slots):
        for j, g in enumerate(ss):
            if g in where:
                match[(q, j)] = where[g]
    kept_pieces = set(match.values())
    choosing = k > 1 and not kept_pieces  # the Extends' sources decide which units split
    if k > 1:
        split_units = sorted({u for u, _ in kept_pieces}) or list(
            range(len(current)) if only is None else only)
    else:
        split_units = list(range(len(current)))
    unit_of: dict[str, int] = {}  # a piece of a split unit -> that unit

    producer: dict[str, int | None] = {}
    piece_emu: dict[tuple[int, int], Emu] = {}
    for u in split_units:
        if k > 1:
            sp = Split.of(current[u], sub, [ids() for _ in range(k)])
            i = add(sp)
            for j, o in enumerate(sp.outputs):
                piece_emu[(u, j)] = o
                producer[o.id] = i
                unit_of[o.id] = u
        else:
            piece_emu[(u, 0)] = current[u]
            producer[current[u].id] = None
    whole_destroy = [current[u] for u in range(len(current)) if u not in set(split_units)]

    slot_emu: dict[tuple[int, int], Emu] = {s: piece_emu[m] for s, m in match.items()}
    kept = {piece_emu[m].id for m in match.values()}
    doomed = [e for key, e in sorted(piece_emu.items()) if e.id not in kept]

    # fill the other slots by Extend, earliest estimated finish first
    sub_bytes = cost.sizes.of_layout(current[0].model, current[0].trainable, sub)
    split_done = 0.0
    if k > 1 and split_units:
        split_done = cost.duration(prims[0]).seconds
    # sources, best first: kept and new units; pieces to be destroyed whose GPUs the target
    # does not use (copying from them delays only their own release); pieces on target GPUs
    # (their Destroy may be what makes room there, so they are the last resort)
    target_gpus = set(target.gpus)
    by_id = {e.id: e for e in piece_emu.values()}

    def offered() -> _Sources:
        src = _Sources(cost, sub_bytes)
        for e in piece_emu.values():
            t = split_done if producer.get(e.id) is not None else 0.0
            src.offer(e.id, e.gpus, t,
                      0 if e.id in kept else 2 if target_gpus.intersection(e.gpus) else 1)
        return src

    pending = [(q, j) for q, ss in enumerate(slots) for j in range(len(ss))
               if (q, j) not in slot_emu]
    # the order the slots are taken in decides which copies pass the state on: slot by slot,
    # a node's second slot takes a free copy from across the network rather than wait for the
    # node's first, and the next node then waits for a busy one. Taking one slot per node in
    # turn seeds every node first; the order whose whole fan-out ends first is kept
    fill, stuck = _fan_out(offered(), slots, pending, bool(kept), eager)
    if stuck is not None:
        q, j = stuck
        return LocalDag(stage, (), (), (), (
            f"{stage}: no copy can be extended onto GPUs {format_gpus(slots[q][j])}: every "
            "unit holding the state shares GPUs with it (Extend needs disjoint GPUs)")), None
    per_node = cost.cluster.devices_per_node
    held = {g // per_node for e in piece_emu.values() for g in e.gpus}
    order = _node_turns(pending, slots, held, per_node) if eager else pending
    if order != pending:  # one node, or one slot per node: the same fan-out again
        turns, stuck = _fan_out(offered(), slots, order, bool(kept), eager)
        # no order sticks where another fills every slot: of the slots one left, the first the
        # other filled took a unit or a copy of a slot filled before it, which both orders had
        assert stuck is None, stuck
        if _fan_out_key(turns) < _fan_out_key(fill):
            fill = turns

    extends_from: dict[str, list[int]] = {}
    for s, sid, _ in fill:
        e = by_id[sid]
        ext = Extend.of(e, slots[s[0]][s[1]], ids())
        i = add(ext, [producer.get(e.id)])
        extends_from.setdefault(e.id, []).append(i)
        producer[ext.output.id] = i
        slot_emu[s] = ext.output
        by_id[_copy_id(s)] = ext.output

    sources = {unit_of[sid] for sid in extends_from if sid in unit_of} if choosing else None
    if sources is not None and len(sources) < len(split_units):
        # some split unit feeds no Extend: the caller builds again without splitting it
        return LocalDag(stage, tuple(prims), tuple(edges), ()), sources
    for e in whole_destroy:  # never the last copy: a split unit's pieces (or a kept one) stay
        add(Destroy(e))
    for e in doomed:
        add(Destroy(e), [producer.get(e.id), *extends_from.get(e.id, [])])

    final: list[Emu] = []
    for q, ss in enumerate(slots):
        units = [slot_emu[(q, j)] for j in range(len(ss))]
        if kt == 1:
            final.append(units[0])
            continue
        deps: list[int | None] = []
        for e in units:
            deps.append(producer.get(e.id))
            deps.extend(extends_from.get(e.id, []))
        m = Merge.of(units, tlay, ids())
        add(m, deps)
        final.append(m.output)
    return LocalDag(stage, tuple(prims), tuple(sorted(set(edges))), tuple(final)), sources


def _copy_id(slot: tuple[int, int]) -> str:
    """The name :func:`_fan_out` gives the copy it makes on ``slot`` (no unit id is like it)."""
    return f"slot {slot[0]}.{slot[1]}"


def _fan_out(src: _Sources, slots: Sequence[Sequence[tuple[int, ...]]],
             pending: Sequence[tuple[int, int]], kept: bool, eager: bool = True
             ) -> tuple[list[tuple[tuple[int, int], str, float]], tuple[int, int] | None]:
    """Each of the ``pending`` slots (taken in this order) filled from the source that fills
    it first, as (slot, source id, estimated finish) in the order made; a new copy is a source
    from its finish on, named :func:`_copy_id`. A slot every source shares GPUs with waits for
    a copy elsewhere; the second value is the first slot none ever reaches (else None).
    ``kept``: a piece is kept; ``eager``: see :func:`local_dag`."""
    # a piece to be destroyed on the slot's own node beats a kept copy across nodes (NVLink
    # against the network); elsewhere it would only add one more sender, and while it sends it
    # holds GPUs other stages may wait for: while a piece is kept, only kept and new units
    # send across nodes (and, not eager, on the slot's node too)
    near = (0, 1) if eager or not kept else (0,)
    far = (0,) if kept else (0, 1)
    out: list[tuple[tuple[int, int], str, float]] = []
    while pending:
        rest: list[tuple[int, int]] = []
        for s in pending:
            slot = slots[s[0]][s[1]]
            best = src.best(slot, near, far)
            if best is None and kept:
                best = src.best(slot, (1,))
            if best is None:
                best = src.best(slot, (2,))
            if best is None:
                rest.append(s)
                continue
            fin, sid = best
            out.append((s, sid, fin))
            src.take(sid, fin)
            src.offer(_copy_id(s), slot, fin, 0)
        if len(rest) == len(pending):
            return out, rest[0]
        pending = rest
    return out, None


def _fan_out_key(fill: Sequence[tuple[tuple[int, int], str, float]]) -> tuple[float, float]:
    """When the last copy ends, then the sum of the ends: the smaller fan-out is better."""
    ends = [fin for _, _, fin in fill]
    return max(ends, default=0.0), sum(ends)


def _node_turns(pending: Sequence[tuple[int, int]], slots: Sequence[Sequence[tuple[int, ...]]],
                held: set[int], per_node: int) -> list[tuple[int, int]]:
    """``pending`` taken one slot per node in turn (a slot is on the node of its lowest GPU),
    the nodes that hold the state first: each turn seeds every node that has none, and adds a
    sender on each that has."""
    by_node: dict[int, list[tuple[int, int]]] = {}
    for s in pending:
        by_node.setdefault(min(slots[s[0]][s[1]]) // per_node, []).append(s)
    nodes = sorted(by_node, key=lambda n: (n not in held, n))
    rounds = max((len(v) for v in by_node.values()), default=0)
    return [by_node[n][r] for r in range(rounds) for n in nodes if r < len(by_node[n])]


class _Sources:
    """Units an Extend may copy from, in tiers, each with the (estimated) time it is free.

    Finding the best source for a slot looks at the few sources that share a node with it
    (NVLink pairs beat the network) and at the earliest free one elsewhere (all its pairs cross
    the network, so all take the same time).
    """

    def __init__(self, cost: TransitionCost, sub_bytes: Sequence[int]):
        self.per_node = cost.cluster.devices_per_node
        self.setup = cost.setup_s()
        self.intra = [cost.pair_s(0, 0, b) for b in sub_bytes]
        self.inter = [cost.pair_s(0, self.per_node, b) for b in sub_bytes]
        self.far = self.setup + max(self.inter)
        self.lists: tuple[list[tuple[float, int, str]], ...] = ([], [], [])
        self.tier: dict[str, int] = {}
        self.avail: dict[str, float] = {}
        self.seq: dict[str, int] = {}
        self.gpus: dict[str, tuple[int, ...]] = {}
        self.occupied: dict[int, set[str]] = {}
        self.on_node: dict[int, set[str]] = {}

    def offer(self, sid: str, gpus: tuple[int, ...], t: float, tier: int) -> None:
        """Unit ``sid`` on ``gpus`` may send from ``t`` on."""
        self.tier[sid] = tier
        self.avail[sid] = t
        self.seq[sid] = len(self.seq)
        self.gpus[sid] = gpus
        bisect.insort(self.lists[tier], (t, self.seq[sid], sid))
        for g in gpus:
            self.occupied.setdefault(g, set()).add(sid)
            self.on_node.setdefault(g // self.per_node, set()).add(sid)

    def take(self, sid: str, free_at: float) -> None:
        """``sid`` sends until ``free_at`` (its GPUs run one primitive at a time)."""
        lst = self.lists[self.tier[sid]]
        lst.remove((self.avail[sid], self.seq[sid], sid))
        self.avail[sid] = free_at
        bisect.insort(lst, (free_at, self.seq[sid], sid))

    def seconds(self, sid: str, slot: Sequence[int]) -> float:
        pn = self.per_node
        return self.setup + max(
            (self.intra[i] if a // pn == b // pn else self.inter[i])
            for i, (a, b) in enumerate(zip(self.gpus[sid], slot)))

    def best(self, slot: Sequence[int], tiers: Sequence[int],
             far_tiers: Sequence[int] | None = None) -> tuple[float, str] | None:
        """(finish, id) of the source in ``tiers`` that fills ``slot`` first, searching only
        ``far_tiers`` (default: ``tiers``) off the slot's node; None when none may."""
        blocked: set[str] = set()
        for g in slot:
            blocked |= self.occupied.get(g, set())
        near: set[str] = set()
        for n in {g // self.per_node for g in slot}:
            near |= self.on_node.get(n, set())
        best: tuple[float, int, str] | None = None
        for sid in near:
            if sid in blocked or self.tier[sid] not in tiers:
                continue
            cand = (self.avail[sid] + self.seconds(sid, slot), self.seq[sid], sid)
            if best is None or cand < best:
                best = cand
        for tier in tiers if far_tiers is None else far_tiers:
            for t, seq, sid in self.lists[tier]:
                if best is not None and t + self.far >= best[0]:
                    break
                if sid in blocked or sid in near:
                    continue
                cand = (t + self.far, seq, sid)
                if best is None or cand < best:
                    best = cand
                break
        return None if best is None else (best[0], best[2])
