"""``nereus transition``: how to move a job from one plan to another, and how long it takes.

Two plan JSON files (as ``nereus plan --json`` writes them; the job's model, device and
workload from ``--config`` or the options), or two job YAML files (each planned with the
planner; say a pool that grew, or responses that got longer). Prints the primitives per
model-stage, the schedule, the estimated L_tran and, with ``--gantt``, a chart per GPU.
Exit 3 with the reason when the transition is infeasible; 2 for bad input.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from nereus.commands.common import (
    EXIT_INFEASIBLE,
    EXIT_RUN_FAILED,
    FIGURE_FORMATS,
    console,
    fail,
    one_line_errors,
    output_path,
)
from nereus.commands.jobopts import job_from_options
from nereus.cost.efficiency import Efficiencies
from nereus.errors import InputError
from nereus.plan.types import Plan
from nereus.spec.cluster import GpuPool
from nereus.spec.device import GiB
from nereus.spec.job import JobSpec, load_job
from nereus.transition.emu import format_gpus
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule
from nereus.transition.sizes import StateSizes

PLAN_SUFFIXES = (".json",)
JOB_SUFFIXES = (".yaml", ".yml")
OPS = ("Split", "Destroy", "Extend", "Merge")


def _kind(path: Path, field: str) -> str:
    if not path.is_file():
        raise InputError(field, f"no file at {path}")
    suffix = path.suffix.lower()
    if suffix in PLAN_SUFFIXES:
        return "plan"
    if suffix in JOB_SUFFIXES:
        return "job"
    raise InputError(field, f"{path.name}: unknown file type",
                     "a plan .json (nereus plan --json) or a job .yaml")


def _efficiencies(job: JobSpec, profile: Path | None) -> Efficiencies | None:
    if profile is None:
        return None
    from nereus.cost.calibrate import Calibrator

    return Calibrator.from_profile(profile, job.cluster.device.name).efficiencies()


def jobs_from_specs(current: Path, target: Path, profile: Path | None
                    ) -> tuple[JobSpec, Plan, Plan]:
    """Plan both job specs; the transition's job spans both pools, with the target's workload."""
    from nereus.plan.search import best_plan

    a, b = load_job(current), load_job(target)
    if a.model != b.model:
        raise InputError("target.model", f"{b.model.name} differs from the current "
                         f"{a.model.name}", "the same model in both job specs")
    if (a.workflow.algo, a.workflow.execution) != (b.workflow.algo, b.workflow.execution):
        raise InputError("target.algo", "the RL workflow differs between the job specs",
                         "the same algo and execution in both")
    if a.cluster.device != b.cluster.device:
        raise InputError("target.cluster.device", "the device differs between the job specs",
                         "the same device in both")
    if a.cluster.devices_per_node != b.cluster.devices_per_node:
        raise InputError("target.cluster.devices_per_node",
                         f"{b.cluster.devices_per_node} differs from the current "
                         f"{a.cluster.devices_per_node}", "the same node size in both")
    cur = best_plan(a, _efficiencies(a, profile))
    tgt = best_plan(b, _efficiencies(b, profile))
    cluster = max((a.cluster, b.cluster), key=lambda c: c.num_devices)
    pool = GpuPool(cluster, tuple(sorted(set(a.pool.ids) | set(b.pool.ids))))
    return replace(b, cluster=cluster, pool=pool), cur, tgt


def job_for_plans(current: Plan, target: Plan, config: Path | None, model: str | None,
                  algo: str | None, execution: str | None, device: str | None,
                  devices_per_node: int | None) -> JobSpec:
    """The job whose state the plans move; its cluster holds every GPU either plan uses."""
    needed = max((*current.gpus(), *target.gpus()), default=0) + 1

    def build(path: Path | None, gpus: int | None) -> JobSpec:
        return job_from_options(path, model=model, algo=algo, execution=execution, gpus=gpus,
                                device=device, devices_per_node=devices_per_node)

    if config is None:
        return build(None, needed)
    job = build(config, None)
    return job if job.cluster.num_devices >= needed else build(config, needed)


def stage_table(schedule: Schedule, current: Plan, target: Plan, sizes: StateSizes) -> Table:
    t = Table(title="primitives per model-stage", title_justify="left")
    for col in ("model-stage", "current", "target", *OPS, "bytes moved"):
        t.add_column(col, justify="left" if col in ("model-stage", "current", "target")
                     else "right", no_wrap=True)
    by = schedule.by_stage()
    for sp in current.stages:
        tp = target.stage(sp.stage)
        prims = by.get(sp.stage, [])
        counts = {op: sum(p.op == op for p in prims) for op in OPS}
        moved = sum(t.bytes for p in prims for t in p.primitive.transfers(sizes))
        t.add_row(sp.stage, f"tp={sp.tp} pp={sp.pp} dp={sp.dp}",
                  f"tp={tp.tp} pp={tp.pp} dp={tp.dp}",
                  *(str(counts[op]) if counts[op] else "-" for op in OPS),
                  f"{moved / GiB:.2f} GiB" if prims else "unchanged")
    return t


def schedule_table(schedule: Schedule) -> Table:
    t = Table(title="schedule (times estimated)", title_justify="left")
    for col in ("#", "op", "model-stage", "units", "GPUs", "start s", "end s", "after"):
        t.add_column(col, justify="right" if col in ("#", "start s", "end s") else "left")
    for p in schedule.primitives:
        prim = p.primitive
        units = ", ".join(e.id for e in prim.inputs)
        if prim.outputs:
            units += " -> " + ", ".join(e.id for e in prim.outputs)
        t.add_row(str(p.index), p.op, p.stage, units, format_gpus(p.gpus), f"{p.start_s:.4f}",
                  f"{p.end_s:.4f}", ",".join(map(str, p.deps)) or "-")
    return t


def print_schedule(job: JobSpec, schedule: Schedule, current: Plan, target: Plan) -> None:
    console.print(f"{job.model.name}, {job.workflow.algo.upper()} on "
                  f"{job.cluster.device.name} ({job.cluster.devices_per_node} per node)")
    console.print(stage_table(schedule, current, target, StateSizes(job)))
    if schedule.primitives:
        console.print(schedule_table(schedule))
    peaks = schedule.peak_bytes()
    if peaks:
        g = max(peaks, key=peaks.__getitem__)
        console.print(f"peak memory {peaks[g] / GiB:.1f} GiB on GPU {g} of "
                      f"{schedule.capacity_bytes / GiB:.1f} GiB allowed (estimated)")
    console.print(f"L_tran = {schedule.estimated_s:.4f} s (estimated), "
                  f"{len(schedule.primitives)} primitives")


def register(app: typer.Typer) -> None:
    @app.command("transition")
    @one_line_errors
    def transition_cmd(
        current: Path = typer.Argument(..., help="current plan .json, or current job .yaml"),
        target: Path = typer.Argument(..., help="target plan .json, or target job .yaml"),
        config: Optional[Path] = typer.Option(None, "--config", "-c",
                                              help="job YAML sizing the state (plan files)"),
        model: Optional[str] = typer.Option(None, help="model preset or HF config.json "
                                            "(plan files, without --config)"),
        algo: Optional[str] = typer.Option(None, help="ppo, grpo or remax [default: ppo]"),
        execution: Optional[str] = typer.Option(None, help="sync or async [default: sync]"),
        device: Optional[str] = typer.Option(None, help="device preset [default: h100-sxm-80gb]"),
        devices_per_node: Optional[int] = typer.Option(None, help="devices per node"),
        profile: Optional[Path] = typer.Option(None, help="calibration profile JSON to use"),
        gantt_path: Optional[Path] = typer.Option(None, "--gantt", metavar="OUT.png",
                                                  help="draw a Gantt chart per GPU"),
        as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
        execute: bool = typer.Option(False, "--execute", help="run the schedule on local "
                                     "workers on a seeded model (runtime layer) and compare"),
    ) -> None:
        """Plan the transition between two plans: primitives, schedule and L_tran."""
        output_path(gantt_path, "--gantt", FIGURE_FORMATS)
        kinds = (_kind(current, "current"), _kind(target, "target"))
        if kinds[0] != kinds[1]:
            raise InputError("target", f"{target.name} is a {kinds[1]} file but {current.name} "
                             f"is a {kinds[0]} file", "two plan .json files or two job .yaml files")
        if kinds[0] == "job":
            given = [name for name, v in (("--config", config), ("--model", model),
                                          ("--algo", algo), ("--execution", execution),
                                          ("--device", device),
                                          ("--devices-per-node", devices_per_node))
                     if v is not None]
            if given:
                raise InputError(given[0], "job specs carry their own model, workflow and "
                                 "cluster", "with plan files only")
            job, cur, tgt = jobs_from_specs(current, target, profile)
        else:
            cur, tgt = Plan.load(current, "current"), Plan.load(target, "target")
            job = job_for_plans(cur, tgt, config, model, algo, execution, device,
                                devices_per_node)
        schedule = plan_transition(job, cur, tgt, _efficiencies(job, profile))
        if as_json and not execute:
            print(json.dumps(schedule.to_json_dict()))
        if not schedule.feasible:
            raise fail(f"infeasible transition: {schedule.reason}", EXIT_INFEASIBLE)
        if not as_json:
            print_schedule(job, schedule, cur, tgt)
        if gantt_path is not None:
            from nereus.transition.gantt import gantt

            out = gantt(schedule, gantt_path)
            if not as_json:
                console.print(f"wrote {out}")
        if execute:  # the runtime layer runs it for real (its JSON replaces the schedule's)
            from nereus.runtime import cli_execute
            from nereus.runtime.demo import RunFailed

            try:
                code = cli_execute(job, cur, tgt, schedule, as_json=as_json)
            except RunFailed as e:
                raise fail(str(e), EXIT_RUN_FAILED) from None
            if code:
                raise typer.Exit(code)
