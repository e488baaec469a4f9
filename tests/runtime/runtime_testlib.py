"""Helpers for the runtime's multi-process tests: a Ray session and its worker pool, jobs,
leak checks, bitwise checks of the state the workers hold."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import ray

from nereus.cost.candidate import Candidate, Layout
from nereus.plan.types import Plan, StagePlan
from nereus.runtime.executor import state_specs
from nereus.runtime.loading import seeded_logical
from nereus.runtime.placement import gather_unit
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.job import JobSpec, parse_job
from nereus.transition.emu import Emu

SLOTS = 16  # device slots the test Ray session offers (workers use no CPU reservation)


@contextmanager
def ray_session(module: str, slots: int = SLOTS) -> Iterator[None]:
    """One local Ray per test module, shut down even when a test fails. Functions of the test
    module and of this one are pickled by value: workers cannot import test files."""
    import sys

    for name in (__name__, module):
        ray.cloudpickle.register_pickle_by_value(sys.modules[name])
    ray.init(num_cpus=2, include_dashboard=False, resources={"nereus_slot": slots},
             object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def cpu_job(model: str, gpus: int, algo: str = "grpo", memory_mib: float | None = None
            ) -> JobSpec:
    """A job on ``cpu`` device slots with fp32 parameters (what CPU workers hold)."""
    cluster: dict[str, object] = {"device": "cpu", "devices_per_node": 8}
    if memory_mib is not None:
        cluster["device_memory_gib"] = memory_mib / 1024
    return parse_job({"model": model, "gpus": gpus, "algo": algo, "cluster": cluster,
                      "workload": {"param_dtype": "fp32", "prompts_per_step": 8,
                                   "ppo_mini_batches": 2}})


def stage_seeds(job: JobSpec, base: int) -> dict[str, int]:
    """A different seed per model-stage, so a unit moved to the wrong stage is caught."""
    return {s.name: base * 100 + i for i, s in enumerate(job.workflow.stages)}


def listening_ports(pid: int | str = "self") -> set[int]:
    """TCP ports a process listens on (Linux /proc)."""
    inodes = set()
    base = f"/proc/{pid}/fd"
    for fd in os.listdir(base):
        try:
            link = os.readlink(f"{base}/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def _worker_resources(ctx: WorkerContext) -> tuple[int, int, int, list[str]]:
    """(listening ports, groups, parked aborted groups, units) of one worker."""
    ctx.reap()
    return len(listening_ports()), len(ctx.groups), len(ctx.zombies), sorted(ctx.units)


def worker_resources(pool: WorkerPool) -> dict[int, tuple[int, int, int, list[str]]]:
    return pool.run_all(_worker_resources)


def _drop_everything(ctx: WorkerContext) -> int:
    """Drops every unit; returns how many Split or Merge outputs were left unsettled."""
    unsettled = len(ctx.pending)
    ctx.pending.clear()
    for u in list(ctx.units):
        ctx.drop(u)
    ctx.memory.reset_peak()
    return unsettled


def clear_units(pool: WorkerPool) -> dict[int, int]:
    """Drops every unit on every worker; returns the unsettled outputs each had."""
    return pool.run_all(_drop_everything)


def wait_released(pool: WorkerPool, baseline: Mapping[int, int], timeout_s: float = 30.0
                  ) -> dict[int, tuple[int, int, int, list[str]]]:
    """Wait until no worker has a group or parked group and listens on more ports than at
    ``baseline``; returns the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = worker_resources(pool)
        ok = all(r[1] == 0 and r[2] == 0 and r[0] <= baseline.get(d, r[0])
                 for d, r in now.items())
        if ok or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def pids(pool: WorkerPool) -> dict[int, int]:
    return {d: i.pid for d, i in pool.infos().items()}


def live_pids(pool: WorkerPool) -> list[int]:
    """The pids of the workers that answer (a test that failed may have left one dead)."""
    dead, silent = pool.liveness()
    return [ray.get(pool.actor(d).info.remote()).pid for d in pool.device_ids
            if d not in dead and d not in silent]


def gone(pid_list: Sequence[int], timeout_s: float = 20.0) -> bool:
    """Whether every process has exited (zombie entries of reaped children count as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for p in pid_list:
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().split()[2] != "Z":
                        alive.append(p)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.3)
    return False


@contextmanager
def worker_pool(module: str, workers: int, **options: object) -> Iterator[WorkerPool]:
    """One Ray session and a pool of ``workers`` CPU workers for a test module; the workers'
    processes are gone after it, a failing test included."""
    with ray_session(module):
        pool = WorkerPool.start(workers, kind="cpu", **options)  # type: ignore[arg-type]
        try:
            yield pool
        finally:
            ids = live_pids(pool)
            pool.shutdown()
            assert gone(ids), "worker processes outlived the pool"


@contextmanager
def leaves_nothing(pool: WorkerPool, clear: bool = True) -> Iterator[None]:
    """After the block, a failing one included: no group, no parked backend, no extra port on
    any worker or in the driver; ``clear``: no state left on the workers and their capacity
    back to the pool's."""
    before_driver = listening_ports()
    before = {d: r[0] for d, r in worker_resources(pool).items()}
    try:
        yield
    finally:
        after = wait_released(pool, before)
        unsettled = {}
        if clear:
            unsettled = {d: n for d, n in clear_units(pool).items() if n}
            pool.set_capacity(pool.capacity_bytes)
        assert not unsettled, f"Split or Merge outputs never settled: {unsettled}"
        assert all(r[1] == 0 and r[2] == 0 for r in after.values()), after
        assert all(after[d][0] <= before.get(d, after[d][0]) for d in after), (before, after)
        assert listening_ports() <= before_driver


def check_stages(pool: WorkerPool, job: JobSpec, units: Mapping[str, Sequence[Emu]],
                 seeds: Mapping[str, int]) -> None:
    """Every unit the workers hold equals its model-stage's seeded state, bitwise."""
    specs = state_specs(job)
    for stage, es in units.items():
        want = seeded_logical(specs[stage], seeds[stage])
        for e in es:
            diff = gather_unit(pool, e).first_difference(want)
            assert diff is None, f"{e}: {diff}"


def plan_of(job: JobSpec, stages: Mapping[str, tuple[int, int, Sequence[Sequence[int]]]]
            ) -> Plan:
    """A plan of the named model-stages only: (tp, pp, replicas' GPU ids) each, b = a = 1."""
    out = []
    for s in job.workflow.stages:
        if s.name in stages:
            tp, pp, reps = stages[s.name]
            out.append(StagePlan(s.name, Candidate(Layout(tp, pp), len(reps), 1, 1),
                                 tuple(tuple(r) for r in reps)))
    assert len(out) == len(stages), stages
    return Plan(tuple(out))
