"""Score a plan a user runs today (their verl or NeMo RL layout) with the same cost model.

The user gives tp/pp/dp per model-stage, and optionally GPU ids, micro-batch, accumulation and
recomputation. Missing GPU ids are filled the way colocated frameworks run: every stage of a
phase on the same GPUs from the start of the pool. Missing (b, a, recompute) take the fastest
choice that fits. Stages of a phase whose GPUs overlap share them and run one after another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel
from nereus.errors import InputError
from nereus.files import read_yaml
from nereus.plan.overlap import critical_path, overlap_graph
from nereus.plan.types import Plan, StagePlan, contiguous_replicas
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import StageKind


@dataclass(frozen=True)
class StageLayoutSpec:
    tp: int
    pp: int
    dp: int
    gpus: tuple[tuple[int, ...], ...] | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    recompute: bool | None = None


def load_layout_spec(path: str | Path) -> dict[str, StageLayoutSpec]:
    """A plan JSON (``nereus plan --json``) or a YAML mapping stage -> {tp, pp, dp, ...}."""
    data = read_yaml(path, "evaluate")
    if isinstance(data, Mapping) and isinstance(data.get("stages"), list):
        return {str(s.get("name")): _spec(str(s.get("name")), s) for s in data["stages"]}
    if isinstance(data, Mapping) and isinstance(data.get("stages"), Mapping):
        data = data["stages"]
    if not isinstance(data, Mapping):
        raise InputError("evaluate", "must map each model-stage to {tp, pp, dp}",
                         "a plan JSON or a YAML mapping")
    return {str(k): _spec(str(k), v) for k, v in data.items()}


def _spec(name: str, raw: Any) -> StageLayoutSpec:
    if not isinstance(raw, Mapping):
        raise InputError(f"evaluate.{name}", "must be a mapping with tp, pp and dp")
    allowed = {"name", "tp", "pp", "dp", "gpus", "micro_batch", "grad_accum", "recompute",
               "latency_s", "peak_mem_bytes"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InputError(f"evaluate.{name}.{unknown[0]}", "unknown field", sorted(allowed - {"name"}))
    try:
        tp, pp, dp = (int(raw.get(k, 1)) for k in ("tp", "pp", "dp"))
    except (TypeError, ValueError):
        raise InputError(f"evaluate.{name}", "tp, pp and dp must be integers") from None
    for k, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if v < 1:
            raise InputError(f"evaluate.{name}.{k}", f"must be >= 1, got {v}")
    gpus = raw.get("gpus")
    replicas = tuple(tuple(int(g) for g in r) for r in gpus) if gpus else None
    opt = {k: raw.get(k) for k in ("micro_batch", "grad_accum")}
    return StageLayoutSpec(tp, pp, dp, replicas,
                           int(opt["micro_batch"]) if opt["micro_batch"] else None,
                           int(opt["grad_accum"]) if opt["grad_accum"] else None,
                           raw.get("recompute"))


def _choose(cost: CostModel, name: str, spec: StageLayoutSpec) -> Candidate:
    st = cost.job.workflow.stage(name)
    batch = cost.stage_batch(st)
    layout = Layout(spec.tp, spec.pp)
    why = layout_problem(cost.job.model, spec.tp, spec.pp)
    if why:
        raise InputError(f"evaluate.{name}", why)
    if batch % spec.dp:
        raise InputError(f"evaluate.{name}.dp", f"dp={spec.dp} does not divide the stage's batch "
                         f"of {batch} sequences")
    per = batch // spec.dp
    if st.kind is StageKind.GENERATE:
        return Candidate(layout, spec.dp, per, 1)
    options = []
    bs = [spec.micro_batch] if spec.micro_batch else [b for b in (1, 2, 4, 8, 16) if per % b == 0]
    rcs = [spec.recompute] if spec.recompute is not None else (
        [False, True] if st.kind is StageKind.TRAIN else [False])
    for b in bs:
        if per % b:
            raise InputError(f"evaluate.{name}.micro_batch", f"{b} does not divide the "
                             f"{per} sequences per replica")
        a = spec.grad_accum or per // b
        if spec.dp * b * a != batch:
            raise InputError(f"evaluate.{name}.grad_accum",
                             f"dp x b x a = {spec.dp}x{b}x{a} != batch {batch}")
        for rc in rcs:
            options.append(Candidate(layout, spec.dp, b, a, bool(rc)))
    fitting = [c for c in options if cost.estimate(st, c).fits]
    pool = fitting or options
    return min(pool, key=lambda c: cost.estimate(st, c).latency_s)


def evaluate_plan(job: JobSpec, specs: Mapping[str, StageLayoutSpec],
                  cost: CostModel | None = None) -> Plan:
    """The plan ``specs`` describes, placed and priced; validate it with ``validate_plan``."""
    cost = cost or CostModel(job)
    wf = job.workflow
    missing = [s.name for s in wf.stages if s.name not in specs]
    if missing:
        raise InputError(f"evaluate.{missing[0]}", "model-stage missing from the plan",
                         [s.name for s in wf.stages])
    extra = sorted(set(specs) - {s.name for s in wf.stages})
    if extra:
        raise InputError(f"evaluate.{extra[0]}", "not a model-stage of this job",
                         [s.name for s in wf.stages])
    cands = {s.name: _choose(cost, s.name, specs[s.name]) for s in wf.stages}
    replicas: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, c in cands.items():
        if c.gpus > job.pool.size:
            raise InputError(f"evaluate.{name}", f"needs {c.gpus} GPUs, the pool has "
                             f"{job.pool.size}")
        given = specs[name].gpus
        replicas[name] = given if given else contiguous_replicas(0, job.pool.ids, c)
    # stages of one phase that share GPUs form a group (serialized on those GPUs)
    groups: list[tuple[str, ...]] = []
    for phase in wf.phases:
        pending = [s.name for s in wf.phase_stages(phase)]
        while pending:
            grp = [pending.pop(0)]
            gpus = set(g for r in replicas[grp[0]] for g in r)
            changed = True
            while changed:
                changed = False
                for n in list(pending):
                    mine = set(g for r in replicas[n] for g in r)
                    if mine & gpus:
                        grp.append(n)
                        gpus |= mine
                        pending.remove(n)
                        changed = True
            groups.append(tuple(grp))
    stage_plans = []
    latency: dict[str, float] = {}
    for name, c in cands.items():
        grp = next(g for g in groups if name in g)
        idle = sum(cost.resident_bytes(o, cands[o].layout) for o in grp if o != name)
        est = cost.estimate(name, c, idle)
        latency[name] = est.latency_s
        stage_plans.append(StagePlan(name, c, replicas[name], est.latency_s, est.peak_mem_bytes))
    sync = wf.weight_sync()
    sync_s = cost.weight_sync(cands[sync[0]].layout, cands[sync[1]].layout).latency_s if sync else 0.0
    step, _ = critical_path(overlap_graph(wf, groups, latency, sync_s))
    terms: dict[str, float] = {}
    for phase in wf.phases:
        terms[phase.value] = max(sum(latency[n] for n in g) for g in groups
                                 if wf.stage(g[0]).phase is phase)
    terms["weight_sync"] = sync_s
    return Plan(tuple(stage_plans), step, "estimated", terms,
                tuple(g for g in groups if len(g) > 1))
