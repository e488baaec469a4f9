"""Helpers for the runtime's multi-process tests: a Ray session, jobs, leak checks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import ray

from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.job import JobSpec, parse_job

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
            lines = open(table).read().splitlines()[1:]
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


def _drop_everything(ctx: WorkerContext) -> None:
    for u in list(ctx.units):
        ctx.drop(u)
    ctx.memory.reset_peak()


def clear_units(pool: WorkerPool) -> None:
    pool.run_all(_drop_everything)


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
