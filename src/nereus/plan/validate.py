"""An independent check of a plan: pool, batch, disjointness, memory per GPU, TP inside nodes.

It shares nothing with the search but the cost model's per-stage estimates: memory is checked
GPU by GPU from the placed replicas, not from the search's group bookkeeping.
"""

from __future__ import annotations

from collections import defaultdict

from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.types import Plan
from nereus.errors import count
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import Execution, Phase

GiB = 1024**3


def validate_plan(job: JobSpec, plan: Plan, cost: CostModel | None = None) -> list[str]:
    """Every way ``plan`` breaks the rules of a valid plan for ``job`` (empty when valid)."""
    cost = cost or CostModel(job)
    wf = job.workflow
    problems: list[str] = []
    names = set(plan.names)
    for st in wf.stages:
        if st.name not in names:
            problems.append(f"{st.name}: missing from the plan")
    pool = set(job.pool.ids)
    for sp in plan.stages:
        c = sp.candidate
        if sp.stage not in {s.name for s in wf.stages}:
            problems.append(f"{sp.stage}: not a model-stage of {wf.algo}")
            continue
        bad = sorted(set(sp.gpus) - pool)
        if bad:
            problems.append(f"{sp.stage}: GPUs {bad} are not in the pool")
        why = layout_problem(job.model, c.tp, c.pp)
        if why:
            problems.append(f"{sp.stage}: {why}")
        batch = cost.stage_batch(sp.stage)
        if c.dp * c.micro_batch * c.grad_accum != batch:
            problems.append(f"{sp.stage}: dp x b x a = {c.dp}x{c.micro_batch}x{c.grad_accum} "
                            f"!= batch {batch}")
        node_cap = job.pool.largest_node_share()
        for r in sp.replicas:
            for start in range(0, len(r), c.tp):
                group = r[start:start + c.tp]
                if c.tp <= node_cap and not job.cluster.same_node(group):
                    problems.append(f"{sp.stage}: TP group {list(group)} spans nodes although "
                                    f"a node of the pool holds {count(node_cap, 'GPU')}")
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

    # memory, GPU by GPU: a running stage's peak plus the resident state of the stages of its
    # phase that share the GPU and wait for their turn
    limit = HEADROOM * job.cluster.device.memory_bytes
    for phase, stages in by_phase.items():
        on_gpu: dict[int, list[str]] = defaultdict(list)
        for s in stages:
            for g in plan.stage(s).gpus:
                on_gpu[g].append(s)
        for g, here in on_gpu.items():
            for s in here:
                idle = sum(cost.resident_bytes(o, plan.stage(o).layout) for o in here if o != s)
                peak = cost.estimate(s, plan.stage(s).candidate, idle).peak_mem_bytes
                if peak > limit:
                    problems.append(f"GPU {g}: {s} needs {peak / GiB:.1f} GiB with "
                                    f"{idle / GiB:.1f} GiB of idle state beside it, over "
                                    f"{limit / GiB:.1f} GiB (estimated)")
                    break

    # the colocated weight sync: training parameters and generation weights on one GPU at once
    pair = wf.colocated_sync()
    if pair is not None and pair[0] in names and pair[1] in names:
        t, g = plan.stage(pair[0]), plan.stage(pair[1])
        held = cost.weight_sync_peak_bytes(t.layout, g.layout)
        if held > limit:
            problems.append(f"weight sync {pair[0]} -> {pair[1]}: its fullest GPU holds "
                            f"{held / GiB:.1f} GiB (training parameters, generation weights, "
                            f"gather buffer), over {limit / GiB:.1f} GiB (estimated)")
    return problems
