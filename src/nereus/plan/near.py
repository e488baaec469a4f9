"""A plan placed on the GPUs where the job's state already is.

The search places a plan from scratch: its weight-sync rule puts training on the pool's fullest
nodes, and the groups of a phase take GPUs by best fit. After a replan, the target can then put
a model-stage on GPUs that another stage of its phase holds now, while the GPUs the stage holds
stay free for a third one. The phase had room for every stage where it was, and the transition
copies state that could have stayed; three inference stages that take each other's GPUs can
even deadlock, since each keeps its last copy until the new one exists.

``placed_near`` places the same candidates and groups again, each group taking first the GPUs
its stages hold in the current plan, keeps a replica's GPU order where it holds the same GPUs
as a current replica of the same layout, and prices the result. Its step can differ from the
search's only through the weight sync (its receivers follow the GPU ids); the controller moves
there when it is no slower and its transition is cheaper.

A replica whose layout changes is also offered where an in-place Merge or Split of the current
replicas leaves it. Both give TP rank t to sub-unit ``t % m_tp`` (``plan.nesting``: the shards
nest only so), so two tp=4 units on GPUs 0-3 and 4-7 merge in place into a tp=8 unit on
(0, 4, 1, 5, 2, 6, 3, 7), and a tp=8 unit on 0-7 splits into tp=4 units on (0, 2, 4, 6) and
(1, 3, 5, 7). Laid as runs of ascending ids instead, the same GPUs miss that path and the
transition copies the whole state (an 8B actor's (4, 1) x 2 -> (8, 1) on one H100 node: 2.6 s
against 0.013 s, and at 40 GiB per GPU only the merged order fits).

A kept order need not be ascending, and two rules read more than a replica's set of GPUs: TP
groups are runs of ``tp`` consecutive ids (kept only where they stay inside nodes as the
placement's do), and the weight sync is priced with generation laid over the training GPUs
rank by rank (``cost.model.least_overlap``). A training unit kept as [3, 2, 1, 0] beside
generation laid [0, 1, 2, 3] (both tp=4) would train TP slice 0 on GPU 3 and generate slice 3
there: priced 0 s, the sync would move each GPU's whole shard. Generation then follows the
kept training order (``_synced``).
"""

from __future__ import annotations

from nereus.cost.model import CostModel, placed_overlap
from nereus.errors import InputError
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.nesting import merge_gpus, split_gpus
from nereus.plan.placement import GroupAssignment, place_phase, tp_groups_off_node
from nereus.plan.types import Plan, StagePlan
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, Phase

Replicas = tuple[tuple[int, ...], ...]  # a stage's GPU ids, one ordered tuple per replica


# relative: a placement whose step is within this of the target's is as fast (rounding)
SAME_STEP = 1e-9


def placed_near_no_slower(job: JobSpec, cost: CostModel, plan: Plan, current: Plan
                          ) -> list[Plan]:
    """``placed_near``'s placements whose step is no longer than ``plan``'s: the targets a
    move may take instead of the search's placement at no cost per step."""
    limit = plan.step_latency_s * (1 + SAME_STEP)
    return [p for p in placed_near(job, cost, plan, current) if p.step_latency_s <= limit]


def placed_near(job: JobSpec, cost: CostModel, plan: Plan, current: Plan) -> list[Plan]:
    """``plan``'s candidates placed on ``job``'s pool near ``current``'s GPUs and priced: the
    distinct placements that differ from ``plan``'s (none where the pool cannot hold them).

    Up to four placements (eight in asynchronous execution), and their twins below, which
    differ in what they let go first: the groups in the search's order (largest chunks first)
    or the groups that hold the most state first; and, in synchronous execution with a weight
    sync, generation near its own current GPUs or on the training stage's new GPUs first (the
    search's rule, which keeps the sync inside nodes); in asynchronous execution, the pool
    split as the plan splits it, or generation first on the GPUs it holds now. Each is
    followed by its twin with the replicas whose layout changes laid as an in-place Merge or
    Split of the current ones leaves them (``_nested_order``), where that differs: the same
    GPUs in another order, or split into other sets inside a current unit. Which one is
    cheaper to reach depends on what moves, so the caller prices their transitions (and their
    steps, which the weight sync may change).
    """
    wf = job.workflow
    out: list[Plan] = []
    # what a stage saves by staying: the bytes its units hold now
    weight = {sp.stage: float(cost.resident_bytes(sp.stage, sp.layout) * len(sp.gpus))
              for sp in current.stages}
    key = (job.cluster, job.pool.ids, wf, _shape(plan), plan.groups, _shape(current),
           tuple(weight.items()))
    found = _PLACEMENTS.get(key)
    if found is None:
        pair = wf.colocated_sync()
        # asynchronous generation runs on GPUs of its own: as the plan split the pool, or on
        # the GPUs generation holds now first (the other phases then share the rest)
        splits = (False, True) if wf.execution is Execution.ASYNC else (False,)
        found = [_placement(job, plan, current, nest, by, resplit, in_place)
                 for nest in ((None, pair) if pair else (None,))
                 for by in (None, weight) for resplit in splits for in_place in (False, True)]
        if len(_PLACEMENTS) >= PLACEMENTS_KEPT:
            del _PLACEMENTS[next(iter(_PLACEMENTS))]
    else:
        del _PLACEMENTS[key]  # most recently used last
    _PLACEMENTS[key] = found
    for specs in found:
        near = None if specs is None else _priced(job, cost, plan, specs)
        if near is not None and all(near.stages != p.stages for p in out):
            out.append(near)
    return out


# ``placed_near``'s placements (layout specs, or None where one does not place) by what they
# read: the cluster, the pool, the workflow, each plan's stages as placed (candidate and GPU
# ids) and the target's groups, and the bytes each current stage holds. Not the lengths or the
# efficiencies: a controller that replans at every step places the same target near the same
# plan again and again, and only the price changes. The most recently used ``PLACEMENTS_KEPT``
# entries are kept (each a few layout specs).
PLACEMENTS_KEPT = 256
_PLACEMENTS: dict[tuple[object, ...], list[dict[str, StageLayoutSpec] | None]] = {}


def _shape(plan: Plan) -> tuple[tuple[str, object, Replicas], ...]:
    """What placement reads of a plan's stages: each one's candidate and replicas."""
    return tuple((sp.stage, sp.candidate, sp.replicas) for sp in plan.stages)


def _placement(job: JobSpec, plan: Plan, current: Plan, nest: tuple[str, str] | None,
               weight: dict[str, float] | None, resplit: bool = False, in_place: bool = False
               ) -> dict[str, StageLayoutSpec] | None:
    """One placement near ``current``, as layout specs (None where it does not place or
    places as ``plan`` does): ``nest`` puts generation on the training GPUs first; ``weight``
    places the groups that hold the most state first (else the largest chunks); ``resplit``
    (asynchronous execution) places generation on the whole pool near its current GPUs and
    the other phases on what it leaves; ``in_place`` lays a replica whose layout changes as an
    in-place Merge or Split of the current replicas leaves it (None where no replica is: the
    placement without it is the same)."""
    wf = job.workflow
    prefer = {sp.stage: sp.gpus for sp in current.stages}
    pools = _phase_pools(job, plan)
    phases = list(wf.phases)
    if resplit:
        gen = [GroupAssignment(g, tuple(plan.stage(n).candidate for n in g)) for g in
               _groups(plan, [s.name for s in wf.phase_stages(Phase.GENERATION)])]
        try:
            placed_gen = place_phase(job.pool, gen, prefer=prefer, weight=weight)
        except ValueError:
            return None
        taken = {g for reps in placed_gen.values() for r in reps for g in r}
        rest = tuple(g for g in job.pool.ids if g not in taken)
        if not rest:
            return None
        pools = {p: GpuPool(job.cluster, tuple(sorted(taken))) if p is Phase.GENERATION
                 else GpuPool(job.cluster, rest) for p in wf.phases}
    if nest is not None:  # training first, then generation on its GPUs
        train_phase = wf.stage(nest[0]).phase
        phases.sort(key=lambda p: p is not train_phase)
    replicas: dict[str, Replicas] = {}
    laid: dict[str, Replicas] = {}  # as placement ordered them
    nested = False  # whether ``in_place`` laid a replica otherwise
    for phase in phases:
        groups = [GroupAssignment(g, tuple(plan.stage(n).candidate for n in g))
                  for g in _groups(plan, [s.name for s in wf.phase_stages(phase)])]
        try:
            placed = place_phase(pools[phase], groups, prefer=prefer, weight=weight)
        except ValueError:
            return None
        for name, reps in placed.items():
            laid[name] = tuple(reps)
            replicas[name] = _kept_order(laid[name], current, plan.stage(name), job.cluster)
            if in_place:
                kept = replicas[name]
                replicas[name] = _nested_order(kept, current, plan.stage(name), job.cluster)
                nested = nested or replicas[name] != kept
        if nest is not None and nest[0] in placed:
            prefer[nest[1]] = tuple(g for r in replicas[nest[0]] for g in r)
    if in_place and not nested:
        return None
    pair = wf.colocated_sync()
    if pair is not None:
        replicas.update(_synced(pair, replicas, laid, plan, job.cluster))
    if all(replicas[sp.stage] == sp.replicas for sp in plan.stages):
        return None
    return {sp.stage: StageLayoutSpec(sp.tp, sp.pp, sp.dp, replicas[sp.stage],
                                      sp.candidate.micro_batch, sp.candidate.grad_accum,
                                      sp.candidate.recompute)
            for sp in plan.stages}


def _priced(job: JobSpec, cost: CostModel, plan: Plan, specs: dict[str, StageLayoutSpec]
            ) -> Plan | None:
    """A placement's specs priced with ``cost``; None where they do not make a plan with
    ``plan``'s groups."""
    try:
        near = evaluate_plan(job, specs, cost)
    except InputError:
        return None
    # placement keeps every group together and apart from the others, so the groups (and with
    # them every stage's co-resident state) are the plan's own
    if sorted(near.groups) != sorted(plan.groups):
        return None
    return near


def _groups(plan: Plan, stages: list[str]) -> list[tuple[str, ...]]:
    """The groups of ``plan`` among ``stages`` (a stage in no group is a group of its own)."""
    out = [g for g in plan.groups if g[0] in stages]
    out += [(n,) for n in stages if not any(n in g for g in plan.groups)]
    return out


def _phase_pools(job: JobSpec, plan: Plan) -> dict[Phase, GpuPool]:
    """The GPUs each phase places on: the pool, or in asynchronous execution generation's GPUs
    for generation and the rest of the pool for the other phases (as the plan splits it)."""
    wf = job.workflow
    pools = {p: job.pool for p in wf.phases}
    if wf.execution is Execution.ASYNC and Phase.GENERATION in wf.phases:
        gen = {g for s in wf.phase_stages(Phase.GENERATION) for g in plan.stage(s.name).gpus}
        gen_pool = GpuPool(job.cluster, tuple(sorted(gen)))
        rest = GpuPool(job.cluster, tuple(g for g in job.pool.ids if g not in gen))
        pools = {p: gen_pool if p is Phase.GENERATION else rest for p in wf.phases}
    return pools


def _kept_order(replicas: Replicas, current: Plan, target: StagePlan,
                cluster: Cluster) -> Replicas:
    """``replicas`` with each one that holds the same GPUs as a current replica of the same
    layout in that replica's order, so the unit stays as it is; not where that order has more
    TP groups across nodes than the placed one (a current plan from a file may: the plan's
    price and its validity take TP inside a node)."""
    if target.stage not in current.names:
        return replicas
    now = current.stage(target.stage)
    if now.layout != target.layout:
        return replicas
    by_set = {frozenset(r): r for r in now.replicas}
    out = []
    for r in replicas:
        kept = by_set.get(frozenset(r), r)
        spans = tp_groups_off_node((kept,), target.tp, cluster) > \
            tp_groups_off_node((r,), target.tp, cluster)
        out.append(r if spans else kept)
    return tuple(out)


def _nested_order(replicas: Replicas, current: Plan, target: StagePlan,
                  cluster: Cluster) -> Replicas:
    """``replicas`` laid where an in-place Merge or Split of the current replicas leaves them,
    so the transition moves nothing for them (a Split only all-gathers inside its groups): where
    the current layout divides the target's, a replica on exactly the GPUs of current replicas
    as their Merge (in the current plan's order); where the target's divides the current one,
    the replicas that lie inside one current replica as the Split pieces of it that cover them
    (pieces in their order). Not where that puts more TP groups across nodes than the placed
    order (the plan's price takes TP inside a node where it fits)."""
    if target.stage not in current.names:
        return replicas
    now = current.stage(target.stage)
    lay, tlay = now.layout, target.layout
    out = list(replicas)

    def take(at: list[int], nested: Replicas) -> None:
        placed = tuple(out[i] for i in at)
        if tp_groups_off_node(nested, tlay.tp, cluster) <= \
                tp_groups_off_node(placed, tlay.tp, cluster):
            for i, r in zip(at, nested):
                out[i] = r

    if lay != tlay and tlay.tp % lay.tp == 0 and tlay.pp % lay.pp == 0:  # Merge
        for i, r in enumerate(replicas):
            units = [c for c in now.replicas if set(c) <= set(r)]
            if len(units) * lay.size == len(r):
                take([i], (merge_gpus(units, lay, tlay),))
    elif lay != tlay and lay.tp % tlay.tp == 0 and lay.pp % tlay.pp == 0:  # Split
        for c in now.replicas:
            inside = [i for i, r in enumerate(replicas) if set(r) <= set(c)]
            held = {g for i in inside for g in replicas[i]}
            pieces = tuple(p for p in split_gpus(c, lay, tlay) if set(p) <= held)
            if inside and len(pieces) == len(inside):
                take(inside, pieces)
    return tuple(out)


def _synced(pair: tuple[str, str], replicas: dict[str, Replicas], laid: dict[str, Replicas],
            plan: Plan, cluster: Cluster) -> dict[str, Replicas]:
    """The colocated weight sync's (training, generation) replicas, each generation GPU holding
    as much of its training shard as placement's order gives, since the sync is priced so.

    Where a kept order breaks that, the other stage is relabelled as the kept one was: the GPU
    that held a position in placement's order hands it to the GPU that holds it now, so each
    GPU pairs the same training and generation positions as placed. Generation follows a kept
    training order first (training's unit holds θ and ω, generation's θ only, refreshed by the
    sync every step), else training follows generation's; a relabelling that changes a stage's
    GPUs or puts a TP group across nodes is not taken, and both stages go as placed."""
    t, g = pair
    lt, lg = plan.stage(t).layout, plan.stage(g).layout
    want = placed_overlap(lt, laid[t], lg, laid[g])
    if placed_overlap(lt, replicas[t], lg, replicas[g]) >= want:
        return {}
    for keep, move in ((t, g), (g, t)):
        moved = _relabelled(laid[move], laid[keep], replicas[keep])
        if sorted(x for r in moved for x in r) != sorted(x for r in laid[move] for x in r):
            continue
        tp = plan.stage(move).tp
        if tp_groups_off_node(moved, tp, cluster) > tp_groups_off_node(laid[move], tp, cluster):
            continue
        both = {keep: replicas[keep], move: moved}
        if placed_overlap(lt, both[t], lg, both[g]) >= want:
            return both
    return {t: laid[t], g: laid[g]}


def _relabelled(reps: Replicas, before: Replicas, after: Replicas) -> Replicas:
    """``reps`` with each GPU that held a position of ``before`` swapped for the GPU that holds
    that position in ``after`` (the same stage, its replicas reordered)."""
    to = {a: b for ra, rb in zip(before, after) for a, b in zip(ra, rb)}
    return tuple(tuple(to.get(x, x) for x in r) for r in reps)
