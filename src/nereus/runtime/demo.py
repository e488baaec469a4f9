"""``nereus transition --execute``: run a schedule on local workers on a seeded model and check it.

Starts one worker per device id the two plans use (CPU device slots by default), builds the
current plan's state of every model-stage that changes from a seed, executes the schedule,
checks every unit of the result bitwise against the seeded state on the worker that holds it,
and reports measured beside estimated time per primitive. Workers and a Ray session it started
are stopped before it returns, also on failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nereus.cost.efficiency import Efficiencies
from nereus.errors import InfeasibleError, InputError, first_line
from nereus.plan.types import Plan
from nereus.runtime.comm import GroupAborted
from nereus.runtime.executor import ExecutionReport, Executor, state_specs
from nereus.runtime.faults import TransitionFailed
from nereus.runtime.memory import CapacityError
from nereus.runtime.placement import place_current, verify_units
from nereus.runtime.workers import RayStartFailed, WorkerCallsFailed, WorkerPool, describe_error
from nereus.spec.device import GiB
from nereus.spec.job import JobSpec
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule

# the runtime's byte counter sums the arenas and buffers it reserves: a count, not a measurement
# of resident memory
COUNTED = "counted (runtime byte counter)"


class RunFailed(RuntimeError):
    """The transition did not run to its end (a worker died, a collective failed, a worker ran
    out of its capacity, Ray could not start the workers): one line, for the command to print."""


class RunInterrupted(RunFailed):
    """Ctrl-C stopped the transition part-way: one line, with the units that stayed intact."""


@dataclass(frozen=True)
class ExecutionCheck:
    """A schedule executed on real workers: what was measured and whether the state held."""

    schedule: Schedule
    report: ExecutionReport
    bitwise_equal: bool
    differences: tuple[str, ...]
    device: str

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for sp, t in zip(self.schedule.primitives, self.report.timings):
            out.append({"index": sp.index, "op": sp.op, "stage": sp.stage,
                        "gpus": list(t.gpus), "estimated_s": sp.seconds,
                        "measured_s": t.duration_s, "setup_s": t.setup_s, "bytes": t.bytes,
                        "start_s": t.start_s, "end_s": t.end_s})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "bitwise_equal": self.bitwise_equal,
                "differences": list(self.differences),
                "estimated_s": self.schedule.estimated_s, "measured_s": self.report.wall_s,
                "within_capacity": self.report.within_capacity(),
                "peak_bytes": {str(g): b for g, b in sorted(self.report.peak_bytes.items())},
                **({"device_peak_bytes": {str(g): b for g, b in
                                          sorted(self.report.device_peak_bytes.items())}}
                   if self.report.device_peak_bytes else {}),
                "primitives": self.rows(),
                "sources": {"estimated_s": "estimated (transition cost model)",
                            "measured_s": "measured (wall clock on the driver)",
                            "within_capacity": COUNTED, "peak_bytes": COUNTED,
                            "device_peak_bytes": "measured (torch.cuda.max_memory_allocated "
                                                 "on each GPU worker)"}}


def execute_transition(job: JobSpec, current: Plan, target: Plan,
                       schedule: Schedule | None = None, *, seed: int = 0, kind: str = "cpu",
                       address: str | None = None,
                       efficiencies: Efficiencies | None = None) -> ExecutionCheck:
    """Plan (unless ``schedule`` is given), execute on workers and check bitwise."""
    import ray

    schedule = schedule or plan_transition(job, current, target, efficiencies)
    if not schedule.feasible:
        raise InfeasibleError(f"transition: {schedule.reason}")
    ids = sorted(set(current.gpus()) | set(target.gpus()))
    if kind == "cpu":
        _check_fits_machine(job, schedule, len(ids))
    started_ray = not ray.is_initialized()
    pool = None
    try:
        capacity = schedule.capacity_bytes if kind == "cpu" else None
        pool = WorkerPool.start(ids, kind=kind, capacity_bytes=capacity, address=address,
                                ready_timeout_s=_ready_timeout_s(len(ids)))
        if kind != "cpu":  # a GPU holds at most the planner's capacity, and its own
            pool.set_capacity(min(schedule.capacity_bytes, pool.capacity_bytes))
        specs = state_specs(job)
        changed = set(schedule.changed)
        seeds = _seeds(job, seed)
        try:  # held as the schedule assumes: what it loads later, or never, offloaded
            place_current(pool, schedule, specs, seeds)
        except (CapacityError, WorkerCallsFailed) as e:
            why = describe_error(e)
            raise RunFailed(f"could not place the current plan's state on the workers "
                            f"(capacity {pool.capacity_bytes} B each): "
                            f"{why.partition(': ')[2] or why}") from None
        report = Executor(pool, specs).run(schedule)
        final = [e for s, es in report.units.items() if s in changed for e in es]
        # every worker holds exactly the target's units (only changed stages were placed),
        # each at its position, equal to the seeded state bitwise
        diffs = verify_units(pool, final, seeds, expected=final)
        return ExecutionCheck(schedule, report, not diffs, tuple(diffs), pool.kind)
    finally:
        try:
            if pool is not None:
                pool.shutdown()
        finally:  # a pool that fails to shut down still leaves no Ray behind
            if started_ray:
                ray.shutdown()


# A CPU worker is a Python process with torch and Ray loaded: about 190 MiB of its own memory
# (RssAnon of an idle worker, measured on this project's 2-core development machine; its
# ~110 MiB of shared libraries are counted once), and about 7.5 core-seconds to start
# (measured there: 4 workers in 15 s on 2 cores).
WORKER_BYTES = 190 * 1024**2
WORKER_START_CORE_S = 7.5
MAX_WORKERS_PER_CORE = 8  # more, and the workers mostly wait on each other (16 on 2 cores ran)


def _ready_timeout_s(workers: int) -> float:
    """How long to wait for the workers to start: 60 s, or twice the start time they need
    on this machine's cores."""
    cores = os.cpu_count() or 1
    return max(60.0, 2 * WORKER_START_CORE_S * workers / cores)


def _check_fits_machine(job: JobSpec, schedule: Schedule, workers: int) -> None:
    """Refuse, before starting anything, what this machine cannot run: more worker
    processes than its cores serve, or more memory than it has for the workers and the
    state."""
    from nereus.runtime.state import position_bytes

    cores = os.cpu_count() or 1
    if workers > MAX_WORKERS_PER_CORE * cores:
        raise InputError("--execute", f"the plans use {workers} GPU ids, so {workers} CPU "
                         f"worker processes; this machine has {cores} cores",
                         f"plans on at most {MAX_WORKERS_PER_CORE * cores} GPUs here")
    specs = state_specs(job)
    need = 0
    for stage in schedule.changed:
        for e in schedule.initial.get(stage, ()):
            lay = (e.layout.tp, e.layout.pp)
            need += sum(position_bytes(specs[stage], *lay, *e.position(i))
                        for i in range(len(e.gpus)))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    procs = workers * WORKER_BYTES
    if 2 * need + procs > ram:  # the state, the copies a transition makes, the processes
        raise InputError("model", f"{job.model.name}: its state takes {need / GiB:.1f} GiB on "
                         f"{workers} CPU workers (and the processes {procs / GiB:.1f} GiB, "
                         "estimated), "
                         f"this machine has {ram / GiB:.1f} GiB",
                         "a small model for --execute on CPU (tiny-llama, tiny-qwen3, "
                         "small-llama)")


def _seeds(job: JobSpec, seed: int) -> Mapping[str, int]:
    return {s.name: seed * 1000 + i for i, s in enumerate(job.workflow.stages)}


def render(check: ExecutionCheck, as_json: bool = False) -> str:
    """The result as the CLI prints it: a table, or one JSON object."""
    if as_json:
        return json.dumps(check.to_dict())
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"executed on {check.device} workers: measured vs estimated")
    for col in ("#", "op", "stage", "gpus", "estimated s", "measured s", "setup s", "MiB"):
        t.add_column(col, justify="right" if col not in ("op", "stage") else "left")
    for r in check.rows():
        t.add_row(str(r["index"]), r["op"], r["stage"], ",".join(map(str, r["gpus"])),
                  f"{r['estimated_s']:.4f}", f"{r['measured_s']:.4f}", f"{r['setup_s']:.4f}",
                  f"{r['bytes'] / 2**20:.1f}")
    buf = StringIO()
    con = Console(file=buf, width=120)
    con.print(t)
    verdict = "bitwise equal" if check.bitwise_equal else "DIFFERS: " + "; ".join(
        check.differences[:3])
    con.print(f"L_tran estimated {check.schedule.estimated_s:.4f} s (estimated), "
              f"measured {check.report.wall_s:.4f} s (measured); state after the transition: "
              f"{verdict}; peak bytes within capacity ({COUNTED}): "
              f"{'yes' if check.report.within_capacity() else 'NO'}"
              + device_peak_note(check.report.device_peak_bytes))
    return buf.getvalue()


def device_peak_note(device_peak: Mapping[int, int] | Mapping[str, int]) -> str:
    """'; peak allocated on a GPU ...' for GPU workers' measured peaks, '' on CPU workers."""
    if not device_peak:
        return ""
    g, most = max(device_peak.items(), key=lambda kv: kv[1])
    return (f"; peak allocated {most / 2**20:.1f} MiB on GPU {g} (measured: "
            "torch.cuda.max_memory_allocated)")


def cli_execute(job: JobSpec, current: Plan, target: Plan, schedule: Schedule | None = None, *,
                seed: int = 0, kind: str = "cpu", address: str | None = None,
                as_json: bool = False, echo: Any = print) -> int:
    """The hook ``nereus transition --execute`` calls: run, print, and return the exit code:
    0 when the state after the transition equals the state before, bitwise; 1 when it
    differs. Raises :class:`RunFailed` (one line) when the run itself failed; a bug keeps its
    own exception and traceback."""
    from ray.exceptions import RayError

    schedule = schedule or plan_transition(job, current, target)
    if not schedule.feasible:  # no run failed: the caller reports it (the command, with 3)
        raise InfeasibleError(f"transition: {schedule.reason}")
    try:
        check = execute_transition(job, current, target, schedule, seed=seed, kind=kind,
                                   address=address)
    except TransitionFailed as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # the user's stop, not a failure
            keep = ", ".join(u.id for us in e.report.intact.values() for u in us) or "none"
            lost = ", ".join(u.id for u in e.report.lost)
            raise RunInterrupted(f"interrupted mid-transition; intact units: {keep}"
                                 + (f"; lost: {lost}" if lost else "")) from None
        # its line is the whole fault report, what stayed intact last: kept whole
        raise RunFailed(f"the transition did not run to its end (TransitionFailed): "
                        f"{first_line(e)}") from None
    except (WorkerCallsFailed, CapacityError, GroupAborted, RayError, RayStartFailed,
            InfeasibleError) as e:
        # InfeasibleError here comes from the run (no placement for the workers in time, the
        # executor's memory check before a primitive, a worker lacking a unit): a run that
        # failed, exit 4, not input to fix (2). The worker's own error where Ray wrapped it.
        kind, sep, why = describe_error(e).partition(": ")
        raise RunFailed(f"the transition did not run to its end ({kind}){sep}{why}") from None
    echo(render(check, as_json).rstrip("\n"))
    return 0 if check.bitwise_equal else 1
