"""``nereus transition``: how to move a job from one plan to another, and how long it takes.

Two plans, each a plan JSON (as ``nereus plan --json`` writes it) or a layout (tp/pp/dp per
model-stage, as ``nereus plan --evaluate`` reads it: the layout a job runs today), with the
job's model, device and workload from ``--config`` or the options, or, without them, from the
jobs both files record (``planned_for.job``: each plan under its own job, the move under the
target's, as between two job specs); or two job YAML files (each planned with the planner;
say a pool that grew, or responses that got longer). A plan JSON that records the job it was
planned for must match that job. Prints the primitives per model-stage, the schedule, the
estimated L_tran and, with ``--gantt``, a chart per GPU. Exit 3 with the reason when the
transition is infeasible; 2 for bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from nereus.commands.common import (
    FIGURE_FORMATS,
    Command,
    FitTable,
    console,
    err_console,
    fail,
    one_line_errors,
    output_path,
    writable,
)
from nereus.commands.jobopts import JOB_HELP, job_from_options
from nereus.commands.plan import layout_from_data, renamed_field
from nereus.commands.planfile import (
    JOB_KEY,
    PLAN_FIELDS,
    RECORD_KEY,
    architecture,
    check_record,
    job_shaped,
    output_kind,
    record_options,
    recorded_job,
    split_record,
    with_record,
)
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.errors import (
    EXIT_INFEASIBLE,
    EXIT_INTERRUPTED,
    EXIT_RUN_FAILED,
    InfeasibleError,
    InputError,
)
from nereus.files import existing_file, os_reason, read_json, read_yaml
from nereus.interrupts import Terminated, ctrl_c_deferred, sigterm_raises
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.types import Plan
from nereus.plan.validate import over_memory
from nereus.spec.cluster import MAX_DEVICES, GpuPool, format_gpus, gpu_ranges
from nereus.spec.job import JobSpec, check_groups, parse_job
from nereus.spec.model import MODEL_PRESETS
from nereus.transition.global_dag import FEWER_STAGES
from nereus.transition.planner import in_two_moves, plan_transition
from nereus.transition.schedule import Schedule
from nereus.transition.sizes import StateSizes, format_bytes

PLAN_SUFFIXES = (".json",)
JOB_SUFFIXES = (".yaml", ".yml")
# what CURRENT and TARGET take
PLAN_ARGS = ("a plan .json (nereus plan --json), a layout (as nereus plan --evaluate reads) or "
             "a job .yaml")
OPS = ("Split", "Destroy", "Extend", "Merge")


@dataclass(frozen=True)
class PlanArg:
    """One of the two files ``nereus transition`` takes: a plan JSON (``plan``), a layout as
    ``nereus plan --evaluate`` reads it (``layout``: tp/pp/dp per model-stage, priced and
    placed under the job), or a job YAML (``job``: planned by the planner)."""

    which: str   # "current" or "target": the field its errors name
    path: Path
    kind: str
    data: Any = None
    record: dict[str, Any] | None = None  # the job a plan file was planned for


def _kind(path: Path, field: str) -> PlanArg:
    """What ``path`` holds, from its suffix and its fields: a .json with ``stages`` is a plan;
    a .yaml with job fields (model, gpus, ...) is a job; a mapping of model-stages (at the
    top or under ``stages``) is a layout."""
    existing_file(path, field, "a plan .json, a layout or a job .yaml")
    suffix = path.suffix.lower()
    if suffix not in PLAN_SUFFIXES + JOB_SUFFIXES:
        raise InputError(field, f"{path.name}: unknown file type", PLAN_ARGS)
    raw = read_json(path, field) if suffix in PLAN_SUFFIXES else \
        read_yaml(path, field, allowed=PLAN_ARGS)
    data, record = split_record(raw, field)
    if (what := output_kind(data)) is not None:  # another command's --json output
        raise InputError(field, f"{path.name} is {what}, not a plan", PLAN_ARGS)
    if suffix in PLAN_SUFFIXES:
        # a plan JSON lists its stages; anything else that is no mapping of model-stages (a
        # plan that lost its stages included) is read as a plan, whose errors say what a plan
        # file needs
        is_layout = (isinstance(data, Mapping) and "stages" not in data and data
                     and not job_shaped(data) and not any(k in data for k in PLAN_FIELDS))
        return PlanArg(field, path, "layout" if is_layout else "plan", data, record)
    if not isinstance(data, Mapping) or job_shaped(data) or not data:
        return PlanArg(field, path, "job")  # load_job says what is wrong with it
    return PlanArg(field, path, "layout", data, record)


def _efficiencies(job: JobSpec, profile: Path | None) -> Efficiencies | None:
    if profile is None:
        return None
    from nereus.cost.calibrate import Calibrator

    return Calibrator.from_profile(profile, job.cluster.device.name).efficiencies()


def _cost_model(job: JobSpec, profile: Path | None) -> CostModel:
    """The planner's cost model, with the profile's efficiencies and memory scale."""
    from nereus.commands.plan import cost_model

    return cost_model(job, profile)


def check_stages(job: JobSpec, plan: Plan, which: str) -> None:
    """Every model-stage a plan file lists must be one of the job's workflow (a plan of
    another algorithm, or the wrong --algo); named after the plan file's field. Its layout is
    checked where the transition layer shards it; its micro_batch, grad_accum and recompute
    are not read: they change no state, so the move is the same whatever they say."""
    names = [s.name for s in job.workflow.stages]
    for i, sp in enumerate(plan.stages):
        if sp.stage not in names:
            raise InputError(f"{which}.stages.{i}.name", f"model-stage {sp.stage!r}, which "
                             f"{job.workflow.algo} does not have", names)


def _load_job(path: Path, which: str) -> tuple[JobSpec, str]:
    """A job spec whose errors say which of the two files is wrong (``current.gpus``), and
    its ``model`` as the file gives it (a preset, or a path: what tells two models apart
    that are named alike)."""
    try:
        data = read_yaml(path, "config")
        return parse_job(data), str(data["model"])
    except InputError as e:
        field = which if e.field == "config" else f"{which}.{e.field}"
        raise InputError(field, e.problem, e.allowed) from None


def jobs_from_specs(current: Path, target: Path, profile: Path | None
                    ) -> tuple[JobSpec, Plan, Plan, Schedule | None]:
    """Plan both job specs; the transition's job spans both pools, with the target's workload.
    Also the schedule to the target where choosing its placement already planned it."""
    from nereus.plan.search import best_plan

    (a, model_a), (b, model_b) = _load_job(current, "current"), _load_job(target, "target")
    for which, job in (("current", a), ("target", b)):
        try:
            check_groups(job)
        except InputError as e:
            raise InputError(f"{which}.{e.field}", e.problem, e.allowed) from None
    check_spannable(a, b, "target", "job specs", (model_a, model_b))
    plans, costs = [], []
    for which, job, path in (("current", a, current), ("target", b, target)):
        costs.append(_cost_model(job, profile))
        try:
            plans.append(best_plan(job, cost=costs[-1]))
        except InfeasibleError as e:  # which of the two job specs fits nowhere
            raise InfeasibleError(f"{which} ({path.name}): {e}") from None
    cur, tgt = plans
    job = spanning_job(a, b)
    return job, cur, *_nearest(job, b, costs[1], cur, tgt, profile is not None)


# Workload fields that size the state a transition moves: it moves state of one shape and
# casts nothing, so a job that changes one of them is another job, not another plan
# (gradients are no state: at a step boundary there are none, and no transition sizes them).
STATE_FIELDS = ("param_dtype", "master_weights", "optimizer")


def check_spannable(a: JobSpec, b: JobSpec, where: str, what: str,
                    given: tuple[str, str] | None = None) -> None:
    """Refuse two jobs no transition spans: another model, workflow, reward, device, node
    size, or state dtypes. ``where``: the target's field prefix its errors name
    (``target``, ``target.planned_for.job``); ``what``: the two, as the errors call them;
    ``given``: their models as the files give them (:func:`_models_differ`)."""
    # the model is its shape, not its name: one config.json copied to two files is one model
    if replace(a.model, name=b.model.name) != b.model:
        raise InputError(f"{where}.model", _models_differ(a, b, given),
                         f"the same model in both {what}")
    if (a.workflow.algo, a.workflow.execution) != (b.workflow.algo, b.workflow.execution):
        field = "algo" if a.workflow.algo != b.workflow.algo else "execution"
        raise InputError(f"{where}.{field}", f"the RL workflow differs between the {what}",
                         "the same algo and execution in both")
    if a.workflow.reward != b.workflow.reward:
        raise InputError(f"{where}.reward", f"{b.workflow.reward} differs from the current "
                         f"{a.workflow.reward}: the reward model's state would have nowhere "
                         "to go, or come from nowhere", "the same reward in both")
    if a.cluster.device != b.cluster.device:
        raise InputError(f"{where}.cluster.device", f"the device differs between the {what}",
                         "the same device in both")
    small = min((a.cluster, b.cluster), key=lambda c: c.devices_per_node)
    # a job on one node smaller than the other's is that node with part of it in the pool
    # (the node size defaults to a pool smaller than the device's node: plans for 2 and for 4
    # GPUs say 2 and 4): the spanning cluster, the other's, places its GPUs alike, on node 0
    if a.cluster.devices_per_node != b.cluster.devices_per_node and small.num_nodes > 1:
        raise InputError(f"{where}.cluster.devices_per_node",
                         f"{b.cluster.devices_per_node} differs from the current "
                         f"{a.cluster.devices_per_node}", "the same node size in both")
    for f in STATE_FIELDS:
        mine, theirs = (getattr(j.workload, f) for j in (a, b))
        if mine != theirs:
            # an Optimizer by its name in the YAML
            mine, theirs = (getattr(v, "value", v) for v in (mine, theirs))
            raise InputError(f"{where}.workload.{f}", f"{theirs} differs from the current "
                             f"{mine}: the transition moves the state as it is, and casts "
                             "nothing", "the same in both")


def _models_differ(a: JobSpec, b: JobSpec, given: tuple[str, str] | None) -> str:
    """How the target's model differs from the current one's, in words that tell them apart:
    by name; where both have one name (two config.json files, each named after its folder),
    by where the files found them (``given``), else by their shapes."""
    if a.model.name != b.model.name:
        return f"{b.model.name} differs from the current {a.model.name}"
    if given is not None and given[0] != given[1]:
        return (f"{b.model.name} from {given[1]} differs from the current "
                f"{a.model.name} from {given[0]}")
    return (f"{b.model.name} ({architecture(b.model)}) differs from the current "
            f"{a.model.name} ({architecture(a.model)})")


def spanning_job(a: JobSpec, b: JobSpec) -> JobSpec:
    """The job a transition from ``a`` to ``b`` runs under: the target's, on a cluster and
    pool that hold both jobs' GPUs (the state lies on ``a``'s and goes to ``b``'s). Of two
    node sizes (:func:`check_spannable`), the larger cluster has the larger."""
    cluster = max((a.cluster, b.cluster), key=lambda c: c.num_devices)
    pool = GpuPool(cluster, tuple(sorted(set(a.pool.ids) | set(b.pool.ids))))
    return replace(b, cluster=cluster, pool=pool)


def _nearest(job: JobSpec, target_job: JobSpec, cost: CostModel, cur: Plan, tgt: Plan,
             calibrated: bool) -> tuple[Plan, Schedule | None]:
    """The target as the controller would take it: the search's placement, or one near the
    current plan's GPUs (``nereus.plan.near``) that is no slower per step and has the cheapest
    feasible transition; with its schedule where it was planned to choose. ``cost``: the
    target's cost model (``calibrated``: its efficiencies come from a profile)."""
    from nereus.plan.near import placed_near_no_slower

    nears = placed_near_no_slower(target_job, cost, tgt, cur)
    if not nears:
        return tgt, None
    from nereus.control.admission import cheapest_to_reach

    eff = cost.eff if calibrated else None
    planned = [(p, plan_transition(job, cur, p, eff)) for p in [tgt, *nears]]
    return cheapest_to_reach(planned, lambda ps: ps[1], lambda ps: ps[0].step_latency_s)


def job_for_plans(gpu_ids: tuple[int, ...] | list[int], config: Path | None,
                  model: str | None, algo: str | None, execution: str | None,
                  device: str | None, devices_per_node: int | None,
                  reward: str | None = None, least: int = 1) -> JobSpec:
    """The job whose state the plans move; its cluster holds every GPU the plan files use
    (``gpu_ids``). Without a config, whose pool the user sized, the pool is the first GPUs up
    to the largest id the files use, and at least ``least`` (a layout without GPU ids needs
    tp x pp x dp of the pool's GPUs to be placed on)."""
    needed = max(gpu_ids, default=0) + 1

    def build(path: Path | None, gpus: int | None) -> JobSpec:
        # the workload is read only for its dtypes here: GRPO's group size is checked where
        # the file sets it (a --config), not on a default the command has no option for
        return job_from_options(path, model=model, algo=algo, execution=execution,
                                reward=reward, gpus=gpus, device=device,
                                devices_per_node=devices_per_node,
                                check_groups=path is not None, derived=("gpus",))

    if config is None:
        return build(None, max(needed, least))
    job = build(config, None)
    if job.cluster.num_devices >= needed or _pool_listed(config):
        # a pool the config lists by id is the GPUs the job has: a plan on others is refused
        # where its stages are checked (check_in_pool), not grown to
        return job
    # plans made with --gpus beyond the config's count (the README's grow-the-pool example):
    # the cluster grows to hold them, and the user hears of it (a typo'd id is grown to as well)
    grown = build(config, needed)  # a cluster that cannot grow says so, with no note first
    err_console.print(f"note: the plans use GPU ids up to {needed - 1}; {config.name}'s "
                      f"{job.cluster.num_devices} GPUs are taken as {needed}", markup=False,
                      highlight=False, soft_wrap=True)
    return grown


def _pool_listed(config: Path) -> bool:
    """Whether ``config`` gives its pool as a list of GPU ids (``gpus: [8, 9, ...]``), not a
    count: a count is grown to hold the plans' GPUs, a list is what the job may use."""
    data = read_yaml(config, "config")
    return isinstance(data, Mapping) and isinstance(data.get("gpus"), list)


def check_in_pool(plan: Plan, job: JobSpec, which: str, config: Path | None) -> None:
    """Every GPU a plan file's stages use must be in the job's pool (a pool a config lists by
    id need not start at 0), named after the plan file's replica, as ``plan --evaluate`` names
    a layout's."""
    ids = set(job.pool.ids)
    source = f" {config.name} gives" if config is not None else ""
    for i, sp in enumerate(plan.stages):
        for r, replica in enumerate(sp.replicas):
            outside = sorted(set(replica) - ids)
            if outside:
                raise InputError(f"{which}.stages.{i}.gpus.{r}",
                                 f"GPU {outside[0]} of replica {r} is not in the "
                                 f"pool{source}", f"GPU ids {gpu_ranges(job.pool.ids)}")


def _layout_gpus(specs: Mapping[str, StageLayoutSpec]) -> list[int]:
    return [g for s in specs.values() for r in (s.gpus or ()) for g in r]


def _layout_size(specs: Mapping[str, StageLayoutSpec], which: str) -> int:
    """The GPUs a layout's largest model-stage spans (tp x pp x dp): the least pool it can be
    placed on, where no --config sizes the pool."""
    name, size = max(((n, s.tp * s.pp * s.dp) for n, s in specs.items()),
                     key=lambda ns: ns[1], default=("", 1))
    if size > MAX_DEVICES:
        raise InputError(f"{which}.{name}", f"needs {size:,} GPUs (tp x pp x dp), more than "
                         "the largest cluster", f"tp x pp x dp at most {MAX_DEVICES:,}")
    return size


def plans_for_job(args: tuple[PlanArg, PlanArg], config: Path | None, model: str | None,
                  algo: str | None, execution: str | None, device: str | None,
                  devices_per_node: int | None, profile: Path | None,
                  reward: str | None = None) -> tuple[JobSpec, Plan, Plan]:
    """Plan files and layouts, and the job from --config or the options: every plan file
    checked against the job it records, every layout placed and priced under the job."""
    plans: dict[str, Plan] = {}
    layouts: dict[str, dict[str, StageLayoutSpec]] = {}
    for a in args:
        if a.kind == "plan":
            plans[a.which] = Plan.from_dict(a.data, a.which)
        else:
            layouts[a.which] = layout_from_data(a.data, a.which)
    ids: list[int] = []
    least = max((_layout_size(specs, which) for which, specs in layouts.items()), default=1)
    for which in ("current", "target"):
        if which in plans:
            used = plans[which].gpus()
            ids += used
            where = f"{which}.stages"
        else:
            used = tuple(_layout_gpus(layouts[which]))
            ids += used
            where = which
        if max(used, default=0) >= MAX_DEVICES:
            raise InputError(where, f"GPU id {max(used)} is past the largest cluster",
                             f"GPU ids 0..{MAX_DEVICES - 1}")
    recorded = next((a for a in args if a.record), None)
    if config is None and model is None:
        _check_option_values(ids, least, recorded, algo, execution, device, devices_per_node,
                             reward)
    if config is None and model is None and recorded is not None:
        # the plan says what it was made for: offer that, rather than only name the option;
        # where both files record their jobs, an option alone (--algo) is what stops them
        alone = (", or no job options: both files record their jobs"
                 if all(a.record and JOB_KEY in a.record for a in args) else "")
        assert recorded.record is not None  # picked above for its record
        raise InputError("--model", "needed without --config", f"--config the job's YAML, or "
                         f"{record_options(recorded.record)} as {recorded.path.name} "
                         f"records{alone}")
    job = job_for_plans(ids, config, model, algo, execution, device, devices_per_node, reward,
                        least)
    for a in args:
        check_record(a.record, job, a.which, a.path)
    for which, plan in plans.items():  # a layout's GPU lists are checked where it is placed
        check_in_pool(plan, job, which, config)
    out = {a.which: _plan_under(a, job, profile) for a in args}
    return job, out["current"], out["target"]


def _check_option_values(ids: list[int], least: int, recorded: PlanArg | None,
                         algo: str | None, execution: str | None, device: str | None,
                         devices_per_node: int | None, reward: str | None) -> None:
    """Without --config or --model, refuse a job option whose own value is wrong (``--algo
    foo``) by that option, before saying --model is needed: adding --model would only lead to
    that error. Checked on the job the options would build, with the model the files record
    where it is a preset (else a tiny one: no option's own value depends on the model)."""
    options = {"--algo": algo, "--execution": execution, "--device": device,
               "--devices-per-node": devices_per_node, "--reward": reward}
    given = [o for o, v in options.items() if v is not None]
    if not given:
        return
    named = str((recorded.record or {}).get("model", "")) if recorded is not None else ""
    probe = named if named in MODEL_PRESETS else "tiny-llama"
    try:
        job_for_plans(ids, None, probe, algo, execution, device, devices_per_node, reward,
                      least)
    except InputError as e:
        if e.field in given:
            raise
    except InfeasibleError:
        pass  # the job, not an option's value: the error below names what is missing


def _plan_under(a: PlanArg, job: JobSpec, profile: Path | None) -> Plan:
    """``a`` under ``job``: a plan file with its stages checked against the job, or a layout
    placed and priced."""
    cost = _cost_model(job, profile)
    if a.kind == "layout":
        with renamed_field(a.which):
            plan = evaluate_plan(job, layout_from_data(a.data, a.which), cost)
    else:
        plan = Plan.from_dict(a.data, a.which)
        check_stages(job, plan, a.which)
    check_fits_memory(job, plan, cost, a)
    return plan


def check_fits_memory(job: JobSpec, plan: Plan, cost: CostModel, a: PlanArg) -> None:
    """Refuse a plan whose own stages do not fit the GPUs' memory (estimated, as plan
    --evaluate reports ``fits: false``): no transition can reach or leave it, and the
    transition layer would blame one of its primitives. Named after the file's stage (a plan
    file's ``stages.N``, a layout's model-stage)."""
    over = over_memory(job, plan, cost)
    if not over:
        return
    first = over[0]
    where = (f"{a.which}.stages.{plan.names.index(first.stage)}" if a.kind == "plan"
             else f"{a.which}.{first.stage}")
    beside = f" with {format_bytes(first.idle)} of idle state beside it" if first.idle else ""
    limit = HEADROOM * job.cluster.device.memory_bytes
    raise InputError(where, f"{a.path.name}'s {first.stage} plan exceeds memory: it needs "
                     f"{format_bytes(first.peak)} on GPU {first.gpu}{beside}, over the "
                     f"{format_bytes(int(limit))} a GPU may hold (estimated)",
                     "a plan whose stages fit memory (nereus plan --evaluate reports fits: true)")


def recorded_jobs(args: tuple[PlanArg, PlanArg]) -> tuple[JobSpec, JobSpec] | None:
    """The jobs both files record (``planned_for.job``), or None unless both record one (a
    file written before the job was recorded, or by hand, needs the job from the options)."""
    if not all(a.record and JOB_KEY in a.record for a in args):
        return None
    cur, tgt = (recorded_job(a.record, a.which, a.path) for a in args)
    assert cur is not None and tgt is not None
    return cur, tgt


def plans_for_recorded_jobs(args: tuple[PlanArg, PlanArg], jobs: tuple[JobSpec, JobSpec],
                            profile: Path | None) -> tuple[JobSpec, Plan, Plan]:
    """Plan files and layouts that record their jobs, with no job options: each is read (a
    layout priced) under its own file's job, and the move between them runs under the job
    that spans both, as between two job specs (:func:`spanning_job`)."""
    given = tuple(str((a.record or {}).get(JOB_KEY, {}).get("model")) for a in args)
    check_spannable(*jobs, f"target.{RECORD_KEY}.{JOB_KEY}", "jobs the files record",
                    (given[0], given[1]))
    out: dict[str, Plan] = {}
    for a, job in zip(args, jobs):
        # a hand-edited record whose names say another job than its own job entry
        check_record(a.record, job, a.which, a.path)
        plan = _plan_under(a, job, profile)
        outside = sorted(set(plan.gpus()) - set(job.pool.ids))
        if a.kind == "plan" and outside:  # the spanning cluster is built from the pools
            raise InputError(f"{a.which}.stages", f"GPU ids {format_gpus(outside)} are "
                             f"outside the pool {a.path.name} records "
                             f"({format_gpus(job.pool.ids)})",
                             f"GPU ids of {a.which}.{RECORD_KEY}.{JOB_KEY}.gpus")
        out[a.which] = plan
    return spanning_job(*jobs), out["current"], out["target"]


def bytes_moved(schedule: Schedule, current: Plan, sizes: StateSizes) -> dict[str, int]:
    """Bytes each model-stage's primitives move (estimated from the state's sizes), in the
    current plan's order; 0 for a stage the transition leaves as it is."""
    by = schedule.by_stage()
    return {sp.stage: sum(t.bytes for p in by.get(sp.stage, [])
                          for t in p.primitive.transfers(sizes)) for sp in current.stages}


# where each figure of the --json output beyond the schedule's comes from
JSON_SOURCES = {
    "peak_memory": "estimated (the transition's memory model: the most bytes any GPU holds "
                   f"during the move; capacity_bytes is {HEADROOM:.0%} of the device's memory)",
    "bytes_moved": "estimated (per model-stage, the state its primitives move, sized from "
                   "the model and the workload's dtypes)",
}


def peak(schedule: Schedule) -> tuple[int, int] | None:
    """The GPU that holds the most bytes during the move, and how many (estimated); None where
    no GPU holds any (no primitive, or no feasible schedule)."""
    peaks = schedule.peak_bytes()
    if not peaks:
        return None
    g = max(peaks, key=peaks.__getitem__)
    return g, peaks[g]


def estimated_json(job: JobSpec, schedule: Schedule, current: Plan) -> dict[str, Any]:
    """``--json`` without --execute: the schedule (``estimated_s``, ``feasible``,
    ``primitives``, ``loads_on_first_read``) and the figures the tables print beside it, the
    peak memory (null where the schedule has no memory timeline: nothing to move, or no
    feasible schedule) and the bytes moved per model-stage; ``sources`` says where each of
    these two comes from."""
    top = peak(schedule)
    return {"source": "estimated", **schedule.to_json_dict(),
            "peak_memory": None if top is None else
            {"gpu": top[0], "bytes": top[1], "capacity_bytes": schedule.capacity_bytes},
            "bytes_moved": bytes_moved(schedule, current, StateSizes(job))
            if schedule.feasible else None,
            "sources": JSON_SOURCES}


def stage_table(schedule: Schedule, current: Plan, target: Plan, sizes: StateSizes) -> Table:
    t = FitTable(title="primitives per model-stage", title_justify="left",
                 fold=("model-stage", "current", "target"))
    for col in ("model-stage", "current", "target", *OPS, "bytes moved (estimated)"):
        t.add_column(col, justify="left" if col in ("model-stage", "current", "target")
                     else "right", no_wrap=True)
    by = schedule.by_stage()
    moved = bytes_moved(schedule, current, sizes)
    for sp in current.stages:
        tp = target.stage(sp.stage)
        prims = by.get(sp.stage, [])
        counts = {op: sum(p.op == op for p in prims) for op in OPS}
        t.add_row(sp.stage, f"tp={sp.tp} pp={sp.pp} dp={sp.dp}",
                  f"tp={tp.tp} pp={tp.pp} dp={tp.dp}",
                  *(str(counts[op]) if counts[op] else "-" for op in OPS),
                  format_bytes(moved[sp.stage]) if prims else "unchanged")
    return t


def schedule_table(schedule: Schedule) -> Table:
    t = FitTable(title="schedule (times estimated)", title_justify="left",
                 fold=("op", "model-stage", "units", "GPUs", "after"))
    for col in ("#", "op", "model-stage", "units", "GPUs", "start s", "end s", "after"):
        # long lists fold onto more lines rather than end in an ellipsis: a dependency cut
        # off is a wrong schedule to whoever reads it
        t.add_column(col, justify="right" if col in ("#", "start s", "end s") else "left",
                     overflow="fold")
    for p in schedule.primitives:
        prim = p.primitive
        units = ", ".join(e.id for e in prim.inputs)
        if prim.outputs:
            units += " -> " + ", ".join(e.id for e in prim.outputs)
        t.add_row(str(p.index), op_label(p.op, prim.staged), p.stage, units,
                  format_gpus(p.gpus), f"{p.start_s:.4f}", f"{p.end_s:.4f}",
                  format_gpus(p.deps))  # runs of indices as a-b, like GPU ids
    return t


STAGED_NOTE = ("* staged through host memory: the GPU holds only the larger shard; the host "
               "copies are in its time")


def op_label(op: str, staged: bool) -> str:
    """``Split*`` for a Split or Merge staged through host memory (:data:`STAGED_NOTE`)."""
    return f"{op}*" if staged else op


def execution_table(result: dict) -> Table:
    """``--execute``'s result per primitive; every column says where its numbers come from."""
    t = FitTable(title=f"executed on {result['device']} workers: measured vs estimated",
                 title_justify="left", fold=("op", "stage", "gpus"))
    for col in ("#", "op", "stage", "gpus", "estimated s", "measured s", "setup s (measured)",
                "MiB (measured)"):
        t.add_column(col, justify="left" if col in ("op", "stage") else "right")
    for r in result["primitives"]:
        t.add_row(str(r["index"]), op_label(r["op"], bool(r.get("staged"))), r["stage"],
                  ",".join(map(str, r["gpus"])), f"{r['estimated_s']:.4f}",
                  f"{r['measured_s']:.4f}", f"{r['setup_s']:.4f}",
                  f"{r['bytes'] / 2**20:.1f}")
    return t


def estimate_note(result: dict) -> str:
    """Under the measured-vs-estimated table: what the estimate was computed with (by default
    the cost model's built-in efficiencies, not this machine's: an estimate several times off
    the measured time then says little about the transition model itself)."""
    eff = result["estimate_efficiencies"]
    priced = result.get("estimated_for")
    # the plans' device preset against the workers' kind (cpu or gpu)
    if priced is not None and (priced == "cpu") != (result.get("device") == "cpu"):
        return (f"estimated s: for {priced}, the device the plans were made for; these "
                f"workers are {result.get('device')} processes holding that device's capacity, "
                "so the memory and the state check compare, the seconds do not (plans made "
                "with --device cpu price the workers here)")
    if eff.startswith("default"):
        return ("estimated s: with the cost model's default efficiencies, not calibrated on "
                "this machine (--profile FILE calibrates them), so it can be several times "
                "off the measured time")
    return f"estimated s: with the {eff}"


def execution_summary(result: dict) -> str:
    from nereus.runtime.demo import COUNTED, device_peak_note  # loaded: the run used it

    verdict = ("bitwise equal" if result["bitwise_equal"]
               else "DIFFERS: " + "; ".join(result["differences"][:3]))
    return (f"L_tran estimated {result['estimated_s']:.4f} s (estimated), measured "
            f"{result['measured_s']:.4f} s (measured); state after the transition: {verdict}; "
            f"peak bytes within capacity ({COUNTED}): "
            f"{'yes' if result['within_capacity'] else 'NO'}"
            + device_peak_note(result.get("device_peak_bytes") or {}))


def by_sigterm(e: BaseException) -> bool:
    """Whether ``e`` comes of a SIGTERM (``Terminated`` in its chain of causes): raised where
    the signal found the run, it reaches the command wrapped (a failed run's report, or a
    SystemError where Ray's compiled code called back into Python)."""
    todo: list[BaseException | None] = [e]
    seen: set[int] = set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        if isinstance(x, Terminated):
            return True
        seen.add(id(x))
        todo += [x.__cause__, x.__context__]
    return False


def quiet_ray() -> None:
    """Keep Ray's own driver log lines (a token-authentication notice, 'Started a local Ray
    instance') off the user's terminal: the command says what ran and what failed itself.
    Errors still show; a RAY_LOGGER_LEVEL the user set wins. Ray reads it when imported, and
    its workers inherit it."""
    os.environ.setdefault("RAY_LOGGER_LEVEL", "error")


def measured_json(result: dict, schedule: Schedule | None = None,
                  profile: Path | None = None, priced_for: str | None = None) -> dict:
    """``--execute --json``: a top-level ``source`` as every command's JSON has (the run is
    measured; ``sources`` names the one estimated figure per field), a source for every
    per-primitive number, which efficiencies the estimate used (``estimate_efficiencies``:
    the default, uncalibrated ones unless ``--profile`` gave this machine's), the device the
    estimate is for (``estimated_for``: the plans' device, whatever the workers ran on), and
    per primitive whether it was staged through host memory."""
    eff = (f"efficiencies calibrated in {profile.name} (--profile)" if profile is not None
           else "default efficiencies (uncalibrated: no --profile for this machine)")
    result = {**result, "estimate_efficiencies": eff}
    if priced_for is not None:
        result["estimated_for"] = priced_for
    if schedule is not None:
        staged = {p.index: bool(p.primitive.staged) for p in schedule.primitives}
        result["primitives"] = [{**r, "staged": staged.get(r.get("index"), False)}
                                for r in result.get("primitives", [])]
    sources = dict(result.get("sources", {}))
    sources["estimated_s"] = (f"{sources.get('estimated_s', 'estimated (transition cost model)')}"
                              f", {eff}" + (f", for {priced_for}" if priced_for else ""))
    sources.update(
        staged="planned (the transition schedule: a Split or Merge staged through host "
               "memory)",
        setup_s="measured (per primitive, on the workers)",
        bytes="counted (bytes each primitive's workers received, summed by the runtime)",
        start_s="measured (per primitive, driver clock from the start of the transition)",
        end_s="measured (per primitive, driver clock from the start of the transition)")
    return {"source": "measured", **{k: v for k, v in result.items() if k != "source"},
            "sources": sources}


def print_schedule(job: JobSpec, schedule: Schedule, current: Plan, target: Plan) -> None:
    console.print(f"{job.model.name}, {job.workflow.algo_name} on "
                  f"{job.cluster.num_devices} x {job.cluster.device.name} "
                  f"({job.cluster.devices_per_node} per node)")
    console.print(stage_table(schedule, current, target, StateSizes(job)))
    if schedule.primitives:
        console.print(schedule_table(schedule))
        if any(p.primitive.staged for p in schedule.primitives):
            console.print(STAGED_NOTE, markup=False, highlight=False)
    top = peak(schedule)
    if top is not None:
        g, most = top
        console.print(f"peak memory {format_bytes(most)} on GPU {g} of "
                      f"{format_bytes(schedule.capacity_bytes)} allowed (estimated)")
    console.print(f"L_tran = {schedule.estimated_s:.4f} s (estimated), "
                  f"{len(schedule.primitives)} primitives")


def register(app: typer.Typer) -> None:
    @app.command("transition", cls=Command)
    @one_line_errors
    def transition_cmd(
        # readable=False on every file: nereus.files says why one cannot be read, in one
        # line naming it, where typer would say only that it "is not readable"
        current: Path = typer.Argument(..., metavar="CURRENT", readable=False,
                                       help="current plan .json, layout (as plan --evaluate "
                                       "reads), or job .yaml"),
        target: Path = typer.Argument(..., metavar="TARGET", readable=False,
                                      help="target plan .json, layout (as plan --evaluate "
                                      "reads), or job .yaml"),
        config: Path | None = typer.Option(None, "--config", "-c", readable=False,
                                           help="job YAML sizing the state (plan files and "
                                           "layouts); default: the jobs both plan files "
                                              "record"),
        model: str | None = typer.Option(None, help=JOB_HELP["model"] + " (plan files "
                                         "and layouts, without --config: the pool is "
                                         "sized to the GPU ids the files use, and to the "
                                         "largest tp x pp x dp of a layout's model-stages)"),
        algo: str | None = typer.Option(None, help=JOB_HELP["algo"]),
        execution: str | None = typer.Option(None, help=JOB_HELP["execution"]),
        reward: str | None = typer.Option(None, help=JOB_HELP["reward"]),
        device: str | None = typer.Option(None, help=JOB_HELP["device"]),
        devices_per_node: int | None = typer.Option(None, help=JOB_HELP["devices_per_node"]),
        profile: Path | None = typer.Option(None, readable=False, help=JOB_HELP["profile"]),
        # a string: a Path loses a trailing slash (output_path)
        gantt_given: str | None = typer.Option(None, "--gantt", metavar="OUT.png",
                                               help="draw a Gantt chart per GPU (.png, "
                                               ".pdf or .svg)"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object: source "
                                     "(estimated), estimated_s (null when infeasible, with "
                                     "a reason), feasible, primitives (op, stage, gpus, "
                                     "start_s, end_s, staged), loads_on_first_read (true: "
                                     "the memory peaks count each unit from the first "
                                     "primitive that reads it; false: from the start), "
                                     "peak_memory (gpu, bytes, capacity_bytes), bytes_moved "
                                     "(per model-stage), sources (of those two); when "
                                     "infeasible, in_two_moves (first_moved, first_s, "
                                     "second_s, estimated_s, and waypoint: the plan file "
                                     "between the two moves) or null; with "
                                     "--execute, the measured run instead"),
        execute: bool = typer.Option(False, "--execute", help="run the schedule on local "
                                     "workers on a seeded model (runtime layer): measured "
                                     "times beside the estimates, and the state after the "
                                     "move checked bitwise"),
    ) -> None:
        """Plan the transition between two plans: primitives, schedule and L_tran.

        The job comes from --config or --model and the options where given; else from the
        jobs both plan files record (nereus plan --json writes them): each plan is taken
        under its own file's job, the move under the target's, on the GPUs of both. Files
        that record no job need the options. Without --config the pool holds the GPU ids the
        files use and the largest tp x pp x dp of a layout's model-stages.

        From two job specs, each is planned; the target is then placed near the current
        plan's GPUs where that is no slower per step and cheaper to reach, as the controller
        does.

        Exit 2 for bad input, 3 when no memory-safe schedule exists; with --execute, 1 when
        the state after the move differs, 4 when the run on the workers failed, 130 on Ctrl-C
        and 143 on SIGTERM.
        """
        gantt_path = output_path(gantt_given, "--gantt", FIGURE_FORMATS)
        writable(gantt_path, "--gantt")
        args = (_kind(current, "current"), _kind(target, "target"))
        kinds = tuple(a.kind for a in args)
        if "job" in kinds and kinds != ("job", "job"):
            raise InputError("target", f"{args[1].path.name} is a {args[1].kind} file but "
                             f"{args[0].path.name} is a {args[0].kind} file",
                             "two job .yaml files, or plan .json files and layouts (as nereus "
                             "plan --evaluate reads) with --config or --model")
        if kinds[0] == "job":
            given = [name for name, v in (("--config", config), ("--model", model),
                                          ("--algo", algo), ("--execution", execution),
                                          ("--reward", reward), ("--device", device),
                                          ("--devices-per-node", devices_per_node))
                     if v is not None]
            if given:
                raise InputError(given[0], "job specs carry their own model, workflow and "
                                 "cluster", "with plan files only")
            job, cur, tgt, planned = jobs_from_specs(current, target, profile)
        else:
            options = (config, model, algo, execution, reward, device, devices_per_node)
            # options given override the records, as they override a plan file's own job
            jobs = recorded_jobs(args) if all(v is None for v in options) else None
            if jobs is not None:
                job, cur, tgt = plans_for_recorded_jobs(args, jobs, profile)
            else:
                job, cur, tgt = plans_for_job(args, config, model, algo, execution, device,
                                              devices_per_node, profile, reward)
            planned = None
        eff = _efficiencies(job, profile)
        schedule = planned if planned is not None else plan_transition(job, cur, tgt, eff)
        two = None if schedule.feasible else in_two_moves(job, cur, tgt, eff)
        if as_json and not execute:
            out = estimated_json(job, schedule, cur)
            if not schedule.feasible:  # a script reads why from the JSON, not only stderr
                out["reason"] = schedule.reason
                out["in_two_moves"] = None if two is None else {
                    "first_moved": list(two.first_moved), "first_s": two.first.estimated_s,
                    "second_s": two.second.estimated_s, "estimated_s": two.estimated_s,
                    # a plan file to move through: CURRENT -> waypoint, then waypoint -> TARGET
                    "waypoint": with_record({"stages": two.waypoint.to_dict()["stages"]},
                                            job)}
            print(json.dumps(out))
        if not schedule.feasible:
            reason = schedule.reason or ""
            if two is not None:  # the advice the reason ends with, done
                reason = reason.removesuffix(f"; {FEWER_STAGES}") + (
                    f"; in two moves it fits: first {', '.join(two.first_moved)} "
                    f"({two.first.estimated_s:.3f} s), then the rest "
                    f"({two.second.estimated_s:.3f} s), {two.estimated_s:.3f} s of L_tran in "
                    "all (estimated; --json gives the plan between them)")
            if gantt_path is not None:  # the user asked for a file: say why none appeared
                err_console.print(f"note: no Gantt chart written to {gantt_path}: the "
                                  "transition is infeasible, so there is no schedule to draw",
                                  markup=False, highlight=False, soft_wrap=True)
            raise fail(f"infeasible transition (bytes estimated by the transition's memory "
                       f"model; capacity {HEADROOM:.0%} of the device's memory): {reason}",
                       EXIT_INFEASIBLE)
        result: dict[str, Any] | None = None
        code = 0
        if execute and schedule.primitives:
            # the runtime layer runs it for real (its JSON replaces the schedule's), before
            # anything is printed: a state this machine cannot hold, or a run that fails, is
            # one line, not every table and then the error
            quiet_ray()
            with ctrl_c_deferred() as interrupted:  # a half-imported ray printed a traceback
                from nereus.runtime import cli_execute
                from nereus.runtime.demo import RunFailed, RunInterrupted
            if interrupted():
                raise KeyboardInterrupt

            printed: list[str] = []
            try:  # as JSON always: the table is drawn here, with every column's source
                # Ray prints its own warnings to stdout from a thread (a raylet's "worker
                # processes have been started" notice): stderr is theirs, stdout the command's
                # a person at a terminal sees that it runs (Ray's start alone takes seconds)
                n = len(schedule.primitives)
                # SIGTERM stops the workers and Ray before the command ends, in one line
                # (exit 143), where Ray's own handler printed a native crash dump and exit 1
                with sigterm_raises(), \
                        (err_console.status(f"running {n} primitive{'s' if n != 1 else ''} on "
                                            "local Ray workers ...")
                         if err_console.is_terminal else contextlib.nullcontext()), \
                        contextlib.redirect_stdout(sys.stderr):
                    code = cli_execute(job, cur, tgt, schedule, as_json=True,
                                       echo=printed.append)
            except RunFailed as e:
                if by_sigterm(e):
                    raise Terminated from None
                raise fail(str(e), EXIT_INTERRUPTED if isinstance(e, RunInterrupted)
                           else EXIT_RUN_FAILED) from None
            except Exception as e:
                if by_sigterm(e):  # Terminated raised inside Ray's Cython: a SystemError
                    raise Terminated from None
                raise
            result = measured_json(json.loads(printed[-1]), schedule, profile,
                                   job.cluster.device.name)
        if not as_json:
            print_schedule(job, schedule, cur, tgt)
        if gantt_path is not None:
            from nereus.transition.gantt import gantt

            try:
                written = gantt(schedule, gantt_path)
            except OSError as e:  # the folder changed since the check above
                raise fail(f"--gantt: cannot write {gantt_path}: "
                           f"{os_reason(e)}") from None
            if not as_json:
                console.print(f"wrote {written}")
        if execute and not schedule.primitives:  # no worker to start, nothing to check
            if as_json:
                print(json.dumps({**estimated_json(job, schedule, cur), "executed": False}))
            else:
                console.print("nothing to execute: no model-stage changes between the plans")
            return
        if result is not None:
            if as_json:
                print(json.dumps(result))
            else:
                console.print(execution_table(result))
                console.print(estimate_note(result), markup=False, highlight=False)
                if any(r.get("staged") for r in result["primitives"]):
                    console.print(STAGED_NOTE, markup=False, highlight=False)
                console.print(execution_summary(result), markup=False, highlight=False)
            if code:
                raise typer.Exit(code)
