"""The plans a replan weighs besides the planner's best: what survives a loss, cheaper hybrids,
and the current layout re-batched.

- ``survive``: the current plan without the replicas that lost a GPU (the units a transition
  can start from), and for each model-stage with no replica left, whether its last copy is
  lost (a restart) or it is made again without one (``Workflow.after_loss``: a frozen model's
  weights read again, a copy of θ given by its training stage; ``fill``, ``rebuild_s``).
- ``hybrids``: the best target S* with some of the current plan kept -- whole phases (each phase
  uses the pool afresh, so mixing phases keeps every phase valid) or single model-stages. They
  are the "slightly slower targets with cheaper transitions" of §4.3.
- ``rebatched``: the surviving replicas re-batched -- training's DP cut to a divisor of its
  batch, every replica of a stage without a gradient kept with a larger, uneven share -- and
  the fastest micro-batch / recomputation that fits: the urgent path's "smaller per-replica
  batches and recomputation", which moves no state (only Destroys).
Each comes back as layout specs that ``price`` turns into a placed, priced plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nereus.control.restart import RestartParams
from nereus.cost.candidate import Candidate
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.errors import InputError
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.overlap import step_and_terms
from nereus.plan.types import Plan, StagePlan, stage_estimate, weight_sync_estimate
from nereus.plan.validate import batch_problems
from nereus.spec.device import gib
from nereus.spec.job import JobSpec
from nereus.spec.workflow import Execution, Phase, StageKind, Workflow

Specs = dict[str, StageLayoutSpec]


def spec_of(sp: StagePlan, rechoose: bool = False) -> StageLayoutSpec:
    """A placed stage as a layout spec; ``rechoose`` leaves (b, a, recompute) to the pricer."""
    c = sp.candidate
    if rechoose:
        return StageLayoutSpec(c.tp, c.pp, c.dp, sp.replicas)
    return StageLayoutSpec(c.tp, c.pp, c.dp, sp.replicas, c.micro_batch, c.grad_accum,
                           c.recompute)


def _surviving(plan: Plan, pool: Iterable[int]) -> tuple[Plan, tuple[str, ...]]:
    """(``plan`` with the replicas whose GPUs are all in ``pool``, the stages left with
    none, which it lacks). The plan describes state, not a runnable plan: a stage that lost
    replicas keeps its (b, a), so dp x b x a may fall short of the batch until a target
    re-batches it."""
    alive = set(pool)
    stages: list[StagePlan] = []
    lost: list[str] = []
    for sp in plan.stages:
        reps = tuple(r for r in sp.replicas if set(r) <= alive)
        if not reps:
            lost.append(sp.stage)
            continue
        if len(reps) == len(sp.replicas):
            stages.append(sp)
            continue
        c = sp.candidate
        stages.append(StagePlan(sp.stage, Candidate(c.layout, len(reps), c.micro_batch,
                                                    c.grad_accum, c.recompute), reps))
    return Plan(tuple(stages), plan.step_latency_s, plan.source, dict(plan.terms),
                plan.groups), tuple(lost)


def survive(plan: Plan, pool: Iterable[int], workflow: Workflow
            ) -> tuple[Plan | None, tuple[str, ...], tuple[str, ...]]:
    """(the surviving replicas, the model-stages whose state is gone, those to rebuild).

    A model-stage left with no replica is rebuilt where its state can be made again without
    a restart (``Workflow.after_loss``): a frozen model's weights are read again from storage
    (they never change), and a copy of a trained model's θ (generation, value inference) is
    given the newest θ again by the model's training stage, where that keeps a replica (the
    runtime's ``recover`` writes a training unit and reads it back into the copy's layout).
    A training stage left with no replica is lost, with every copy of its model's θ left with
    none: its optimizer state exists nowhere else, so that loss is a restart from the
    checkpoint. The plan returned lacks the stages to rebuild (``fill`` completes it with a
    target's entries); None when some state is gone.
    """
    survivors, empty = _surviving(plan, pool)
    lost, rebuilt = workflow.after_loss(empty)
    return (None, lost, tuple(rebuilt)) if lost else (survivors, (), tuple(rebuilt))


def fill(survivors: Plan, target: Plan) -> Plan:
    """``survivors`` with each model-stage it lacks taken from ``target`` as placed there (the
    copy is rebuilt in place, so no transition moves it; ``rebuild_s`` prices it)."""
    have = {sp.stage for sp in survivors.stages}
    if all(sp.stage in have for sp in target.stages):
        return survivors
    mine = {sp.stage: sp for sp in survivors.stages}
    stages = tuple(mine.get(sp.stage, sp) for sp in target.stages)
    return Plan(stages, survivors.step_latency_s, survivors.source, dict(survivors.terms),
                survivors.groups)


def rebuild_s(job: JobSpec, target: Plan, rebuilt: Iterable[str], params: RestartParams
              ) -> float:
    """Seconds to make the model-stages ``rebuilt`` (``survive``'s) again, one after the other,
    on their GPUs in ``target``: every replica reads its model's θ (each position its shard),
    at the storage read bandwidth of each node the stage uses; a copy of a trained model's θ
    reads what its training stage writes first, θ and ω of one of its replicas at the write
    bandwidth of that replica's nodes (``runtime.Checkpointer.rebuild``)."""
    wf = job.workflow
    w = job.workload

    def nodes(gpus: Iterable[int]) -> int:
        return max(1, len({job.cluster.node_of(g) for g in gpus}))

    total = 0.0
    for name in rebuilt:
        role = wf.model(wf.stage(name).model)
        params_n = job.model.param_count(role.head)
        trainer = wf.trained_by(role.name) if role.trainable else None
        if trainer is not None:
            written = params_n * (w.param_bytes + w.optimizer_state_bytes_per_param())
            total += written / (params.storage_write_bw_per_node
                                * nodes(target.stage(trainer).replicas[0]))
        sp = target.stage(name)
        total += len(sp.replicas) * params_n * w.param_bytes / (
            params.storage_read_bw_per_node * nodes(sp.gpus))
    return total


def rebatched(cost: CostModel, survivors: Plan, every_stage: bool = True) -> Specs:
    """Survivors re-batched, (b, a, recompute) re-chosen by the pricer (the fastest that fits).
    A training stage has DP cut to the largest divisor of its batch (its gradient
    accumulation covers the batch exactly); a stage without a gradient keeps every surviving
    replica (at most one per sequence), whose shares grow to ceil(batch / dp). With
    ``every_stage`` False, stages whose replicas still cover their batch keep their exact
    (b, a, recompute): training's dp x b x a = batch; another stage's b x a the least share
    that covers it, ceil(batch / dp) (so dp x b x a >= batch, and no replica is priced for
    more sequences than it runs)."""
    out: Specs = {}
    wf = cost.job.workflow
    for sp in survivors.stages:
        batch = cost.stage_batch(sp.stage)
        c = sp.candidate
        kind = wf.stage(sp.stage).kind
        if not every_stage and not batch_problems(sp.stage, kind, c, batch):
            out[sp.stage] = spec_of(sp)
            continue
        if kind is StageKind.TRAIN:
            dp = max(d for d in range(1, len(sp.replicas) + 1) if batch % d == 0)
        else:
            dp = min(len(sp.replicas), batch)
        out[sp.stage] = StageLayoutSpec(c.tp, c.pp, dp, sp.replicas[:dp])
    return out


def _changed(a: StagePlan, b: StagePlan) -> bool:
    return a.candidate != b.candidate or a.replicas != b.replicas


def hybrids(job: JobSpec, source: Plan, source_specs: Mapping[str, StageLayoutSpec],
            target: Plan) -> list[tuple[str, Specs]]:
    """Mixes of ``target`` and ``source``: by phase, then by single model-stage.

    ``source_specs`` say how a stage kept from ``source`` runs (after a loss: its survivors
    re-batched, see :func:`rebatched`).
    """
    wf = job.workflow
    changed = [s.name for s in wf.stages if _changed(source.stage(s.name), target.stage(s.name))]
    if len(changed) < 2:
        return []
    phases = [p for p in wf.phases if any(wf.stage(n).phase is p for n in changed)]
    out: list[tuple[str, Specs]] = []
    seen: set[tuple[str, ...]] = set()

    def add(label: str, moved: Iterable[str]) -> None:
        moved = tuple(sorted(set(moved)))
        if not moved or len(moved) == len(changed) or moved in seen:
            return
        seen.add(moved)
        specs: Specs = {}
        for s in wf.stages:
            if s.name in moved:
                specs[s.name] = spec_of(target.stage(s.name))
            else:
                specs[s.name] = source_specs[s.name]
        out.append((label, specs))

    if len(phases) > 1:
        for i in range(1, 2 ** len(phases) - 1):
            sub = [p for k, p in enumerate(phases) if i >> k & 1]
            add("move " + "+".join(p.value for p in sub) + ", keep the rest",
                [n for n in changed if wf.stage(n).phase in sub])
    for n in changed:
        add(f"move all but {n}", [m for m in changed if m != n])
        add(f"move only {n}", [n])
    return out


@dataclass(frozen=True)
class Priced:
    """A placed plan priced at the current telemetry, with what keeps it from running."""

    plan: Plan | None
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.plan is not None and not self.problems

    @property
    def step_s(self) -> float:
        return self.plan.step_latency_s if self.plan is not None else float("inf")


def price(job: JobSpec, cost: CostModel, specs: Mapping[str, StageLayoutSpec]) -> Priced:
    """Place and price ``specs`` with ``cost``; list pool, memory and concurrency problems."""
    try:
        plan = evaluate_plan(job, specs, cost)
    except InputError as e:
        return Priced(None, (str(e),))
    return Priced(plan, tuple(problems(job, cost, plan)))


def reprice(job: JobSpec, cost: CostModel, plan: Plan) -> Priced:
    """The same placed candidates and groups priced again with ``cost`` (new lengths, pool or
    efficiencies): the fast path for a plan that already runs or a planner's plan."""
    wf = job.workflow
    stages: list[StagePlan] = []
    lat: dict[str, float] = {}
    for sp in plan.stages:
        est = stage_estimate(cost, plan, sp.stage)
        lat[sp.stage] = est.latency_s
        stages.append(StagePlan(sp.stage, sp.candidate, sp.replicas, est.latency_s,
                                est.peak_mem_bytes))
    sync = wf.weight_sync()
    # as placed: the generation GPUs that hold no training shard receive their whole shard
    sync_s = weight_sync_estimate(cost, plan.stage(sync[0]), plan.stage(sync[1])).latency_s \
        if sync else 0.0
    groups = plan.all_groups()
    step, terms = step_and_terms(wf, groups, lat, sync_s)
    new = Plan(tuple(stages), step, "estimated", terms, plan.groups)
    return Priced(new, tuple(problems(job, cost, new)))


def problems(job: JobSpec, cost: CostModel, plan: Plan) -> list[str]:
    """What keeps a plan priced with ``cost`` from running: GPUs off the pool, memory (each
    stage's peak, the weight sync's), asynchronous generation sharing GPUs."""
    problems: list[str] = []
    pool = set(job.pool.ids)
    limit = HEADROOM * job.cluster.device.memory_bytes
    for sp in plan.stages:
        off = sorted(set(sp.gpus) - pool)
        if off:
            problems.append(f"{sp.stage}: GPUs {off[:8]} are not in the pool")
        if sp.peak_mem_bytes > limit:
            problems.append(f"{sp.stage}: {gib(sp.peak_mem_bytes)} > "
                            f"{gib(limit)} per GPU (estimated)")
    wf = job.workflow
    pair = wf.colocated_sync()
    if pair is not None:
        t, g = plan.stage(pair[0]).layout, plan.stage(pair[1]).layout
        held = cost.weight_sync_peak_bytes(t, g)
        if held > limit:
            problems.append(f"weight sync {pair[0]} -> {pair[1]}: {gib(held)} > "
                            f"{gib(limit)} per GPU (estimated)")
    if wf.execution is Execution.ASYNC:
        gen = {g for sp in plan.stages if wf.stage(sp.stage).phase is Phase.GENERATION
               for g in sp.gpus}
        rest = {g for sp in plan.stages if wf.stage(sp.stage).phase is not Phase.GENERATION
                for g in sp.gpus}
        if gen & rest:
            problems.append("asynchronous generation shares GPUs with inference or training")
    return problems
