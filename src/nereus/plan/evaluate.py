"""Score a plan a user runs today (their verl or NeMo RL layout) with the same cost model.

The user gives tp/pp/dp per model-stage, and optionally GPU ids, micro-batch, accumulation and
recomputation. Missing GPU ids are filled the way frameworks run: colocated (synchronous), every
stage of a phase on the same GPUs from the start of the pool; asynchronous, generation from the
start of the pool and the other stages on the GPUs generation leaves (they must be disjoint).
Missing (b, a, recompute) take the fastest choice that fits. Stages of a phase whose GPUs overlap
share them and run one after another.

Every stage is priced on the links its GPU ids give each collective, as the planner's plans
are. GPU ids a layout file gives may put a TP group, a pipeline, a DP group or a replica across
nodes although its size fits one; the plan notes each stage (and the weight sync) whose ids
price it apart from a node-aligned placement of the same sizes (``Plan.notes``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel, Links
from nereus.errors import InputError, count, is_integer
from nereus.files import read_yaml, validate
from nereus.plan.overlap import step_and_terms
from nereus.plan.types import (
    MAX_GPU_ID,
    MODEL_STAGES,
    PLAN_FILE_KEYS,
    Plan,
    StagePlan,
    contiguous_replicas,
    weight_sync_estimate,
)
from nereus.spec.cluster import gpu_ranges
from nereus.spec.job import JobSpec
from nereus.spec.sharding import layout_problem, layout_sizes
from nereus.spec.workflow import Execution, Phase, StageKind
from nereus.spec.workload import largest_share


@dataclass(frozen=True)
class StageLayoutSpec:
    tp: int
    pp: int
    dp: int
    gpus: tuple[tuple[int, ...], ...] | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    recompute: bool | None = None
    # where the stage sits in the file (``evaluate.stages.3``): errors found while pricing it
    # name this path; empty for layouts built in code (then ``evaluate.<model-stage>``)
    where: str = dc_field(default="", compare=False)


class _LayoutStage(BaseModel):
    """One model-stage of a layout: tp, pp, dp (default 1), optional GPU ids and (b, a,
    recompute); ``latency_s`` and ``peak_mem_bytes`` of a plan JSON are accepted and recomputed."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = None
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    gpus: list[list[Annotated[int, Field(ge=0, le=MAX_GPU_ID)]]] | None = Field(
        None, description="one list of tp x pp GPU ids per DP replica ([[0, 1], [2, 3]])")
    micro_batch: int | None = Field(None, ge=1)
    grad_accum: int | None = Field(None, ge=1)
    recompute: bool | None = None
    latency_s: float | None = None
    peak_mem_bytes: int | None = None

    def to_spec(self, field: str) -> StageLayoutSpec:
        """The layout. Its GPU lists are checked against the job's pool (one per replica of
        tp x pp ids from the pool, no GPU twice) where it is priced (``evaluate_plan``)."""
        replicas = None if self.gpus is None else tuple(tuple(r) for r in self.gpus)
        return StageLayoutSpec(self.tp, self.pp, self.dp, replicas, self.micro_batch,
                               self.grad_accum, self.recompute, field)


def _validated(raw: Any, field: str) -> _LayoutStage:
    """``raw`` as a model-stage of a layout. An error in its GPU lists (not a list of lists of
    integers, an id past the largest cluster) says what the lists must be for this stage's
    tp, pp and dp, rather than the schema's generic description."""
    try:
        return validate(_LayoutStage, raw, field, prefix=f"{field}.")
    except InputError as e:
        if not (e.field == f"{field}.gpus" or e.field.startswith(f"{field}.gpus.")):
            raise
        # pydantic reports the first field in order: tp, pp and dp before gpus are valid
        tp, pp, dp = (raw.get(k, 1) for k in ("tp", "pp", "dp"))
        if tp * pp > MAX_GPU_ID + 1:  # no list can be right: say why, not an example
            allowed = (f"{_degrees(tp, pp)} GPUs a replica, more than the largest cluster "
                       f"holds ({MAX_GPU_ID + 1:,})")
        else:
            allowed = _lists_rule(tp, pp, dp, range(tp * pp * min(dp, 2)))
        value = _at(raw, e.field[len(f"{field}."):])
        if is_integer(value) and not 0 <= value <= MAX_GPU_ID:
            allowed = f"a GPU id from 0 to {MAX_GPU_ID:,}, in the job's pool; {allowed}"
        raise InputError(e.field, e.problem, allowed) from None


def _at(data: Any, path: str) -> Any:
    """The value at a dotted path (``gpus.1.7``) of parsed data, or None."""
    for part in path.split("."):
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def _degrees(tp: int, pp: int) -> str:
    return f"tp x pp = {tp} x {pp} = {tp * pp}"


def _one(ids: Sequence[int]) -> str:
    """A replica's GPU list as a layout writes it, shortened past two ids (``[0, ..., 7]``)."""
    return f"[{', '.join(map(str, ids))}]" if len(ids) <= 2 else f"[{ids[0]}, ..., {ids[-1]}]"


def _example(ids: Sequence[int], dp: int, size: int) -> str:
    """The GPU lists of ``dp`` replicas of ``size`` ids each, laid in order on ``ids``, as a
    layout writes them (``[[0, ..., 7], [8, ..., 15]]``): the first two replicas."""
    shown = [_one(ids[i * size:(i + 1) * size]) for i in range(min(dp, 2))]
    return f"[{', '.join(shown)}{', ...' if dp > 2 else ''}]"


def _lists_rule(tp: int, pp: int, dp: int, ids: Sequence[int], pool: str = "") -> str:
    """What a stage's ``gpus`` must be: dp lists of tp x pp ids (``pool``: from where)."""
    each = " each" if dp > 1 else ""
    return (f"dp = {dp} {'list' if dp == 1 else 'lists'} of {_degrees(tp, pp)} GPU "
            f"{'id' if tp * pp == 1 else 'ids'}{each}{pool}, e.g. "
            f"{_example(ids, dp, tp * pp)}")


def _check_replicas(at: str, spec: StageLayoutSpec, pool: Sequence[int]) -> None:
    """A layout's GPU lists: one per DP replica, tp x pp ids each, from the pool, no GPU in two
    places. Each error names the list (``gpus.1``) where it is one, and says what is allowed
    with the stage's degrees and the job's pool. The pool holds tp x pp x dp GPUs (checked
    before)."""
    reps = spec.gpus
    if reps is None:
        return
    size = spec.tp * spec.pp
    ranges = gpu_ranges(pool)
    if len(reps) != spec.dp:
        raise InputError(f"{at}.gpus", f"{count(len(reps), 'GPU list')} for dp = {spec.dp}",
                         _lists_rule(spec.tp, spec.pp, spec.dp, pool,
                                     f" from the pool {ranges} (one list per DP replica)"))
    for i, r in enumerate(reps):
        if len(r) != size:
            raise InputError(f"{at}.gpus.{i}", f"replica {i} lists {count(len(r), 'GPU')} for "
                             f"{_degrees(spec.tp, spec.pp)}", f"{count(size, 'GPU id')} in each "
                             f"replica from the pool {ranges}, e.g. {_one(pool[:size])}")
    ids = set(pool)
    for i, r in enumerate(reps):
        outside = sorted(set(r) - ids)
        if outside:
            raise InputError(f"{at}.gpus.{i}", f"GPU {outside[0]} of replica {i} is not in the "
                             "pool", f"GPU ids {ranges}")
    seen: dict[int, int] = {}
    for i, r in enumerate(reps):
        for g in r:
            if g in seen:
                where = (f"twice in replica {i}" if seen[g] == i else
                         f"in replica {seen[g]} and again in replica {i}")
                raise InputError(f"{at}.gpus.{i}", f"GPU {g} is listed {where}",
                                 f"{spec.dp * size} distinct GPU ids (tp x pp x dp = {spec.tp} "
                                 f"x {spec.pp} x {spec.dp}) from the pool {ranges}: no GPU in "
                                 "two replicas or twice in one")
            seen[g] = i


# what ``--evaluate`` reads, as its errors say it
PLAN_FILES = ("a plan JSON (nereus plan --json) or a layout YAML of tp, pp, dp and gpus per "
              "model-stage (nereus examples writes two, under layouts/)")


def read_plan_file(path: str | Path) -> Any:
    """A plan JSON or a layout YAML, parsed; one that does not parse is 'not valid JSON or
    YAML', not 'not valid YAML' alone (a cut-off plan JSON was said to be bad YAML)."""
    return read_yaml(path, "evaluate", "JSON or YAML", PLAN_FILES)


def load_layout_spec(path: str | Path) -> dict[str, StageLayoutSpec]:
    """A plan JSON (``nereus plan --json``: ``stages`` a list of ``{name, tp, pp, dp, ...}``), or a
    YAML mapping stage -> {tp, pp, dp, ...}, at the top level or under ``stages``."""
    return layout_spec_from_data(read_plan_file(path))


def layout_spec_from_data(data: Any) -> dict[str, StageLayoutSpec]:
    """:func:`load_layout_spec` on parsed data; every error names ``evaluate.<field>``."""
    shape = "a plan JSON or a YAML mapping of model-stage to {tp, pp, dp}"
    if not isinstance(data, Mapping):
        raise InputError("evaluate", "must map each model-stage to {tp, pp, dp}", shape)
    # a plan file as ``nereus plan --json`` writes it (one that lost its stages, or a stage's
    # tp, included) is checked as every reader of plan files checks one, so its errors name
    # the same fields (``stages``, ``stages.0.tp``), where its stages read as a layout pass
    plan_file = any(k in data for k in PLAN_FILE_KEYS if k != "stages")
    if plan_file and "stages" not in data:
        Plan.from_dict(data, "evaluate")  # says which field is missing
    if "stages" not in data:
        return {str(k): _stage(f"evaluate.{k}", v, str(k)) for k, v in data.items()}
    # a plan file's keys (its stages are checked one by one below; the rest evaluation
    # recomputes and does not read)
    unknown = sorted(str(k) for k in data if k not in PLAN_FILE_KEYS)
    if unknown:
        raise InputError(f"evaluate.{unknown[0]}", "unknown field", PLAN_FILE_KEYS)
    stages = data["stages"]
    if isinstance(stages, Mapping):
        return {str(k): _stage(f"evaluate.stages.{k}", v, str(k)) for k, v in stages.items()}
    if not isinstance(stages, list) or not stages:
        raise InputError("evaluate.stages", "must be a non-empty list or a mapping",
                         "a list of {name, tp, pp, dp, ...} (as a plan JSON writes it) or a "
                         "mapping of model-stage to {tp, pp, dp}")
    out: dict[str, StageLayoutSpec] = {}
    for i, raw in enumerate(stages):
        f = _validated(raw, f"evaluate.stages.{i}")
        if f.name is None:
            raise InputError(f"evaluate.stages.{i}.name", "required field is missing",
                             f"the model-stage's name: {', '.join(sorted(MODEL_STAGES))}")
        if f.name in out:
            raise InputError(f"evaluate.stages.{i}.name", f"model-stage {f.name!r} listed twice",
                             f"each model-stage once ({out[f.name].where} is {f.name})")
        out[f.name] = f.to_spec(f"evaluate.stages.{i}")
    if plan_file:
        Plan.from_dict(data, "evaluate")
    return out


def _stage(field: str, raw: Any, name: str) -> StageLayoutSpec:
    if raw is None:
        raise InputError(field, "must be a mapping with tp, pp and dp",
                         "{tp: 1, pp: 1, dp: 1} with the stage's degrees, and optionally gpus, "
                         "micro_batch, grad_accum, recompute")
    f = _validated(raw, field)
    if f.name is not None and f.name != name:
        raise InputError(f"{field}.name", f"{f.name!r} differs from the model-stage it is "
                         f"listed under", [name])
    return f.to_spec(field)


def _where(name: str, spec: StageLayoutSpec) -> str:
    return spec.where or f"evaluate.{name}"


def _options(cost: CostModel, name: str, spec: StageLayoutSpec) -> list[Candidate]:
    """The (b, a, recompute) choices ``spec`` leaves open, all on its layout and dp. Training's
    dp divides its batch (its gradient accumulation covers it exactly); a stage without a
    gradient takes any dp up to its batch, split unevenly, and (b, a) covers the largest
    replica's share, ceil(batch / dp), as the planner's candidates do."""
    st = cost.job.workflow.stage(name)
    batch = cost.stage_batch(st)
    layout = Layout(spec.tp, spec.pp)
    at = _where(name, spec)
    why = layout_problem(cost.job.model, spec.tp, spec.pp)
    if why:
        bad = "pp" if cost.job.model.num_layers % spec.pp else "tp"
        raise InputError(f"{at}.{bad}", why, layout_sizes(cost.job.model))
    train = st.kind is StageKind.TRAIN
    if train and batch % spec.dp:
        raise InputError(f"{at}.dp", f"dp={spec.dp} does not divide the training stage's batch "
                         f"of {batch} sequences (its gradient accumulation must cover it "
                         f"exactly)", "a divisor of the stage's batch")
    if spec.dp > batch:
        raise InputError(f"{at}.dp", f"dp={spec.dp} is more replicas than the stage's batch of "
                         f"{batch} sequences", f"1 to {batch}")
    # a stage without a gradient splits its batch unevenly: the largest replica's share
    # sets its time, and (b, a) covers that share
    per = largest_share(batch, spec.dp)
    share = (f"batch {batch} / dp {spec.dp}" if batch % spec.dp == 0 else
             f"the largest replica's share of batch {batch} over dp {spec.dp}")
    _unpriced_fields(at, st.kind, spec, per)
    if st.kind is StageKind.GENERATE:
        return [Candidate(layout, spec.dp, per, 1)]
    if spec.micro_batch:
        b = spec.micro_batch
        if per % b:
            raise InputError(f"{at}.micro_batch", f"{b} does not divide the "
                             f"{per} sequences per replica ({share})",
                             "a divisor of the sequences per replica")
        a = spec.grad_accum or per // b
        if b * a != per:
            total = (f"dp x b x a = {spec.dp}x{b}x{a} != batch {batch}" if train else
                     f"b x a = {b}x{a} != {per} sequences per replica ({share})")
            raise InputError(f"{at}.grad_accum", total, [per // b])
        shapes = [(b, a)]
    elif spec.grad_accum:  # b follows from a: b x a = the sequences per replica
        a = spec.grad_accum
        if per % a:
            raise InputError(f"{at}.grad_accum", f"{a} does not divide the {per} "
                             f"sequences per replica ({share})",
                             "a divisor of the sequences per replica")
        shapes = [(per // a, a)]
    else:
        shapes = [(b, per // b) for b in (1, 2, 4, 8, 16) if per % b == 0]
    rcs = [spec.recompute] if spec.recompute is not None else (
        [False, True] if st.kind is StageKind.TRAIN else [False])
    return [Candidate(layout, spec.dp, b, a, bool(rc)) for b, a in shapes for rc in rcs]


def _unpriced_fields(at: str, kind: StageKind, spec: StageLayoutSpec, per: int) -> None:
    """Refuse the fields the cost model does not price for ``kind``, rather than score a plan
    as if they were absent. Generation takes no micro-batches or accumulation: its engine
    decodes all ``per`` sequences of a replica together, as many at once as the KV cache holds
    (the cost model sizes that decode batch from memory), so its candidate is always
    ``b = per, a = 1``. Generation and inference run no backward pass, so no activations are
    recomputed. A plan JSON writes exactly those values, and they are accepted."""
    fields: list[tuple[str, object, object, str]] = []
    if kind is StageKind.GENERATE:
        fields += [
            ("micro_batch", spec.micro_batch, per,
             (f"generation takes no micro-batches: it decodes the {per} sequences per replica "
              "together, as many at once as the KV cache holds")),
            ("grad_accum", spec.grad_accum, 1, "generation accumulates no gradients")]
    if kind is not StageKind.TRAIN:
        what = "generation" if kind is StageKind.GENERATE else "inference"
        fields.append(("recompute", spec.recompute, False,
                       f"{what} runs no backward pass to recompute activations for"))
    for name, given, implied, why in fields:
        if given is not None and given != implied:
            raise InputError(f"{at}.{name}", f"{_yaml(given)}: {why}",
                             f"leave it out, or {_yaml(implied)} (as a plan JSON writes it)")


def _yaml(value: object) -> str:
    """A value as a layout file writes it (``false``, not ``False``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _choose(cost: CostModel, name: str, options: list[Candidate], idle: int,
            links: Links | None = None) -> Candidate:
    """The fastest option that fits beside ``idle`` bytes of the stages sharing its GPUs (the
    fastest of all if none does: the plan then reports the overflow), on ``links``."""
    est = {c: cost.estimate(name, c, idle, links) for c in options}
    fitting = [c for c in options if est[c].fits]
    return min(fitting or options, key=lambda c: est[c].latency_s)


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
        raise InputError(f"evaluate.{extra[0]}", "not a model-stage of this job"
                         f"{wf.absence(extra[0])}", [s.name for s in wf.stages])
    # every option of a stage has the same layout and dp, so the same GPUs: place with the
    # first, and choose (b, a, recompute) once the stages that share its GPUs are known
    opts = {s.name: _options(cost, s.name, specs[s.name]) for s in wf.stages}
    cands = {n: o[0] for n, o in opts.items()}
    replicas: dict[str, tuple[tuple[int, ...], ...]] = {}
    for name, c in cands.items():
        if c.gpus > job.pool.size:
            raise InputError(_where(name, specs[name]), f"needs {count(c.gpus, 'GPU')} (tp x pp "
                             f"x dp), the pool has {job.pool.size}",
                             f"tp x pp x dp at most {job.pool.size}")
        _check_replicas(_where(name, specs[name]), specs[name], job.pool.ids)
    # asynchronous generation runs on GPUs of its own: place it first, the rest beside it
    first = (Phase.GENERATION,) if wf.execution is Execution.ASYNC else ()
    taken: set[int] = set()
    for name in sorted(cands, key=lambda n: wf.stage(n).phase not in first):
        c, given = cands[name], specs[name].gpus
        ids = job.pool.ids
        if first and wf.stage(name).phase not in first:
            ids = tuple(g for g in ids if g not in taken)
            if not given and c.gpus > len(ids):
                raise InputError(_where(name, specs[name]), f"needs {count(c.gpus, 'GPU')} (tp "
                                 f"x pp x dp); asynchronous generation leaves {len(ids)} of the "
                                 f"pool's {job.pool.size}", f"tp x pp x dp at most {len(ids)}, "
                                 f"on GPUs {gpu_ranges(ids)}")
        replicas[name] = given if given else contiguous_replicas(0, ids, c)
        if wf.stage(name).phase in first:
            taken |= {g for r in replicas[name] for g in r}
    # stages of one phase that share GPUs form a group (serialized on those GPUs)
    groups: list[tuple[str, ...]] = []
    for phase in wf.phases:
        pending = [s.name for s in wf.phase_stages(phase)]
        while pending:
            grp = [pending.pop(0)]
            gpus = {g for r in replicas[grp[0]] for g in r}
            changed = True
            while changed:
                changed = False
                for n in list(pending):
                    mine = {g for r in replicas[n] for g in r}
                    if mine & gpus:
                        grp.append(n)
                        gpus |= mine
                        pending.remove(n)
                        changed = True
            groups.append(tuple(grp))
    stage_plans = []
    latency: dict[str, float] = {}
    notes: list[str] = []
    for name in list(cands):
        group = next(g for g in groups if name in g)
        idle = sum(cost.resident_bytes(o, cands[o].layout) for o in group if o != name)
        links = cost.placed_links(cands[name].layout, replicas[name])
        c = cands[name] = _choose(cost, name, opts[name], idle, links)
        est = cost.estimate(name, c, idle, links)
        if specs[name].gpus is not None:
            notes += _placed_notes(cost, name, c, idle, links, est.latency_s)
        latency[name] = est.latency_s
        stage_plans.append(StagePlan(name, c, replicas[name], est.latency_s, est.peak_mem_bytes))
    sync = wf.weight_sync()
    by_name = {sp.stage: sp for sp in stage_plans}
    sync_s = 0.0
    if sync:
        t, g = by_name[sync[0]], by_name[sync[1]]
        sync_s = weight_sync_estimate(cost, t, g).latency_s
        # only ids a layout gives can price the sync apart from node-aligned replicas
        given = specs[sync[0]].gpus or specs[sync[1]].gpus
        sized = weight_sync_estimate(cost, t, g, by_sizes=True).latency_s if given else sync_s
        if sync_s != sized:
            notes.append(f"weight sync: priced on the links its GPU ids use (a training or "
                         f"generation replica spans nodes): {sync_s:.3f} s, "
                         f"{sync_s - sized:+.3f} s against node-aligned replicas "
                         f"(estimated)")
    step, terms = step_and_terms(wf, groups, latency, sync_s)
    return Plan(tuple(stage_plans), step, "estimated", terms,
                tuple(g for g in groups if len(g) > 1), tuple(notes))


def _placed_notes(cost: CostModel, name: str, c: Candidate, idle: int, links: Links,
                  est: float) -> list[str]:
    """A stage whose GPU ids price it apart from the same sizes placed node-aligned: which
    groups span nodes, and what that costs."""
    if cost.priced_as_sized(name, c, links):
        return []  # the same ops as node-aligned groups, so the same seconds
    sized = cost.estimate(name, c, idle).latency_s
    if est == sized:
        return []
    spans = [group for _, group in cost.spanning(name, c, links)]
    across = f" ({', '.join(spans)} across nodes)" if spans else ""
    return [(f"{name}: priced on the links its GPU ids use{across}: {est:.3f} s, "
             f"{est - sized:+.3f} s against node-aligned groups of its sizes (estimated)")]
