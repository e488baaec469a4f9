"""An independent check of a plan: pool, batch, disjointness, memory per GPU, TP inside nodes.

It shares nothing with the search but the cost model's per-stage estimates: memory is checked
GPU by GPU from the placed replicas, not from the search's group bookkeeping. Whether a TP
group may cross nodes is decided here (``contained_stages``), and the search asks the same.
The batch rule follows what a stage's replicas can split: training exactly (dp x b x a =
batch), a stage without a gradient unevenly (b x a = ceil(batch / dp), ``batch_problems``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nereus.cost.candidate import Candidate
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.types import Plan
from nereus.spec.device import gib
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import Execution, Phase, StageKind
from nereus.spec.workload import largest_share

# ---- TP groups inside nodes: where the pool can keep them there ----
# A TP group needs its GPUs inside one node where that is possible for the plan as a whole, not
# one stage at a time: stages that run side by side compete for the nodes, and a pool of partly
# filled nodes may hold each stage's TP groups alone but not all of them together. TP degrees
# are powers of two, so whether a set of TP groups fits inside nodes is a count: blocks of sizes
# 2^k fit nodes of free GPUs c_n iff, for every s = 2^j, the blocks of size >= s take at most
# sum_n floor(c_n / s) aligned slots of s GPUs (placing the largest blocks first never wastes a
# slot of a smaller size). ``need`` maps s to that slot count.


def stage_need(tp: int, gpus: int, node_cap: int) -> dict[int, int]:
    """Slots of each size a stage of ``gpus`` GPUs in TP groups of ``tp`` takes; a TP degree
    above ``node_cap`` (the pool's fullest node) spans nodes whatever the placement, and so
    needs single GPUs only."""
    tp = tp if tp <= node_cap else 1
    out, s = {}, 1
    while s <= tp:
        out[s] = gpus // s
        s *= 2
    return out


def merge_need(*needs: dict[int, int]) -> dict[int, int]:
    """What both of several placements on one GPU set need: per size, the larger count (a set
    of GPUs whose nodes give every size that many slots holds each of them)."""
    out: dict[int, int] = {}
    for n in needs:
        for s, k in n.items():
            out[s] = max(out.get(s, 0), k)
    return out


def add_need(*needs: dict[int, int]) -> dict[int, int]:
    """What several placements on disjoint GPUs need together."""
    out: dict[int, int] = {}
    for n in needs:
        for s, k in n.items():
            out[s] = out.get(s, 0) + k
    return out


def need_of(blocks: Iterable[int]) -> dict[int, int]:
    """The slot counts of ``blocks`` (sizes, powers of two) placed on disjoint GPUs."""
    return add_need(*(stage_need(b, b, b) for b in blocks))


def blocks_of(need: Mapping[int, int]) -> list[int]:
    """Blocks (largest first) whose slot counts are ``need`` (``need_of`` reversed)."""
    out: list[int] = []
    for s in sorted(need, reverse=True):
        out += [s] * (need[s] - 2 * need.get(2 * s, 0))
    return out


def need_fits(need: dict[int, int], node_free: list[int] | tuple[int, ...]) -> bool:
    """Whether nodes with ``node_free`` free GPUs hold blocks needing ``need`` slots."""
    return all(sum(c // s for c in node_free) >= k for s, k in need.items())


def concurrent_sets(job: JobSpec, plan: Plan) -> list[tuple[str, ...]]:
    """The model-stages of ``plan`` that hold GPUs at the same time, as sets placement must
    fit into the pool together: each phase of a synchronous step; asynchronous generation
    with inference and training (which take turns on the GPUs generation leaves)."""
    wf = job.workflow
    have = set(plan.names)
    phases = [[s.name for s in wf.phase_stages(p) if s.name in have] for p in wf.phases]
    if wf.execution is Execution.ASYNC:
        return [tuple(n for p in phases for n in p)]
    return [tuple(p) for p in phases]


def _phase_need(job: JobSpec, plan: Plan, names: list[str], node_cap: int) -> dict[int, int]:
    """Slots one phase's groups take: a group's stages share its GPU list (each laid over a
    prefix of it), so the group needs the larger count per size; groups add up."""
    seen: set[str] = set()
    total: dict[int, int] = {}
    for n in names:
        if n in seen:
            continue
        grp = [m for m in (plan.group_of(n) or (n,)) if m in names] or [n]
        seen.update(grp)
        total = add_need(total, merge_need(*(stage_need(plan.stage(m).candidate.tp,
                                                        plan.stage(m).candidate.gpus, node_cap)
                                             for m in grp)))
    return total


def plan_need(job: JobSpec, plan: Plan, names: tuple[str, ...]) -> dict[int, int]:
    """Slots the stages ``names`` (one of ``concurrent_sets``) take together."""
    wf = job.workflow
    cap = job.pool.largest_node_share()
    if wf.execution is Execution.ASYNC:
        gen = [n for n in names if wf.stage(n).phase is Phase.GENERATION]
        rest = [[n for n in names if wf.stage(n).phase is p] for p in wf.phases
                if p is not Phase.GENERATION]
        return add_need(_phase_need(job, plan, gen, cap),
                        merge_need(*(_phase_need(job, plan, r, cap) for r in rest)))
    return _phase_need(job, plan, list(names), cap)


def contained_stages(job: JobSpec, plan: Plan) -> set[str]:
    """Model-stages whose TP groups must all sit inside nodes: those of every concurrent set
    (``concurrent_sets``) whose TP groups the pool's nodes can hold all together. A set they
    cannot hold (a stage of 4-GPU TP groups beside another on nodes of 4, 3 and 2 GPUs) may
    cross nodes; the plan is then priced where its groups landed."""
    free = [len(v) for v in job.pool.by_node().values()]
    out: set[str] = set()
    for names in concurrent_sets(job, plan):
        if need_fits(plan_need(job, plan, names), free):
            out.update(names)
    return out


def batch_problems(stage: str, kind: StageKind, c: Candidate, batch: int) -> list[str]:
    """How ``c`` fails to cover ``stage``'s batch. Training splits it exactly, dp x b x a =
    batch: its gradient accumulation must. A stage that takes no gradient may split it
    unevenly: its largest replica runs ceil(batch / dp) sequences as b x a, the others one
    fewer, and every replica gets at least one (dp <= batch)."""
    b, a = c.micro_batch, c.grad_accum
    if kind is StageKind.TRAIN:
        if c.dp * b * a != batch:
            return [f"{stage}: dp x b x a = {c.dp}x{b}x{a} != batch {batch}"]
        return []
    if c.dp > batch:
        return [f"{stage}: dp = {c.dp} > batch {batch} (a replica without a sequence)"]
    per = largest_share(batch, c.dp)
    if b * a != per:
        return [(f"{stage}: b x a = {b}x{a} != {per}, the largest replica's share "
                 f"ceil(batch {batch} / dp {c.dp})")]
    return []


@dataclass(frozen=True)
class OverMemory:
    """A GPU on which a stage's estimated peak (``peak``, bytes), with the ``idle`` bytes of
    the stages of its phase that share the GPU and wait for their turn, is over the limit."""

    gpu: int
    stage: str
    peak: int
    idle: int


def over_memory(job: JobSpec, plan: Plan, cost: CostModel | None = None) -> list[OverMemory]:
    """Memory, GPU by GPU: a running stage's peak plus the resident state of the stages of its
    phase that share the GPU and wait for their turn, against ``HEADROOM`` of the device's
    memory; the first stage over it on each GPU, GPUs in the plan's order. Stages the job's
    workflow lacks are skipped (``validate_plan`` names them)."""
    cost = cost or CostModel(job)
    wf = job.workflow
    known = {s.name for s in wf.stages}
    by_phase: dict[Phase, list[str]] = defaultdict(list)
    for sp in plan.stages:
        if sp.stage in known:
            by_phase[wf.stage(sp.stage).phase].append(sp.stage)
    limit = HEADROOM * job.cluster.device.memory_bytes
    out: list[OverMemory] = []
    peaks: dict[tuple[str, int], int] = {}  # many GPUs hold the same stages: price each once
    for stages in by_phase.values():
        on_gpu: dict[int, list[str]] = defaultdict(list)
        for s in stages:
            for g in plan.stage(s).gpus:
                on_gpu[g].append(s)
        for g, here in on_gpu.items():
            for s in here:
                idle = sum(cost.resident_bytes(o, plan.stage(o).layout) for o in here if o != s)
                if (s, idle) not in peaks:
                    peaks[s, idle] = cost.estimate(s, plan.stage(s).candidate,
                                                   idle).peak_mem_bytes
                if peaks[s, idle] > limit:
                    out.append(OverMemory(g, s, peaks[s, idle], idle))
                    break
    return out


def validate_plan(job: JobSpec, plan: Plan, cost: CostModel | None = None) -> list[str]:
    """Every way ``plan`` breaks the rules of a valid plan for ``job`` (empty when valid)."""
    cost = cost or CostModel(job)
    wf = job.workflow
    problems: list[str] = []
    names = set(plan.names)
    held = contained_stages(job, plan)
    for st in wf.stages:
        if st.name not in names:
            problems.append(f"{st.name}: missing from the plan")
    pool = set(job.pool.ids)
    for sp in plan.stages:
        c = sp.candidate
        if sp.stage not in {s.name for s in wf.stages}:
            problems.append(f"{sp.stage}: not a model-stage of {wf.algo}"
                            f"{wf.absence(sp.stage)}")
            continue
        bad = sorted(set(sp.gpus) - pool)
        if bad:
            problems.append(f"{sp.stage}: GPUs {bad} are not in the pool")
        why = layout_problem(job.model, c.tp, c.pp)
        if why:
            problems.append(f"{sp.stage}: {why}")
        problems += batch_problems(sp.stage, wf.stage(sp.stage).kind, c,
                                   cost.stage_batch(sp.stage))
        if sp.stage not in held or c.tp > job.pool.largest_node_share():
            continue  # its TP groups may cross nodes (where no node holds one, or the pool
            #           cannot hold all of them beside what runs with it)
        for r in sp.replicas:
            for start in range(0, len(r), c.tp):
                group = r[start:start + c.tp]
                if not job.cluster.same_node(group):
                    problems.append(f"{sp.stage}: TP group {list(group)} spans nodes although "
                                    f"the pool's nodes can hold every TP group of the stages "
                                    f"running beside it")
    if problems:
        return problems

    # concurrency: stages of one phase in different groups must not share a GPU
    by_phase: dict[Phase, list[str]] = defaultdict(list)
    for sp in plan.stages:
        by_phase[wf.stage(sp.stage).phase].append(sp.stage)
    for phase, stages in by_phase.items():
        for i, a in enumerate(stages):
            for b in stages[i + 1:]:
                shared = set(plan.stage(a).gpus) & set(plan.stage(b).gpus)
                together = b in plan.group_of(a)
                if shared and not together:
                    problems.append(f"{a} and {b} run concurrently in {phase.value} but share "
                                    f"GPUs {sorted(shared)[:8]}")
    if wf.execution is Execution.ASYNC:
        gen = {g for s in by_phase.get(Phase.GENERATION, []) for g in plan.stage(s).gpus}
        rest = {g for p in (Phase.INFERENCE, Phase.TRAINING) for s in by_phase.get(p, [])
                for g in plan.stage(s).gpus}
        if gen & rest:
            problems.append(f"asynchronous generation shares GPUs {sorted(gen & rest)[:8]} with "
                            f"inference or training")

    limit = HEADROOM * job.cluster.device.memory_bytes
    for over in over_memory(job, plan, cost):
        problems.append(f"GPU {over.gpu}: {over.stage} needs {gib(over.peak)} with "
                        f"{gib(over.idle)} of idle state beside it, over "
                        f"{gib(limit)} (estimated)")

    # the colocated weight sync: training parameters and generation weights on one GPU at once
    pair = wf.colocated_sync()
    if pair is not None and pair[0] in names and pair[1] in names:
        train_sp, gen_sp = plan.stage(pair[0]), plan.stage(pair[1])
        sync_bytes = cost.weight_sync_peak_bytes(train_sp.layout, gen_sp.layout)
        if sync_bytes > limit:
            problems.append(f"weight sync {pair[0]} -> {pair[1]}: its fullest GPU holds "
                            f"{gib(sync_bytes)} (training parameters, generation weights, "
                            f"gather buffer), over {gib(limit)} (estimated)")
    return problems
