"""What a checkpoint/restart costs: the urgent path's last resort, and a static job's only answer
to a lost GPU.

A restart stops every process, starts the job again on the GPUs it has, and loads the last
checkpoint: the parameters and optimizer state of every trainable model and the weights of the
frozen ones. When it follows a failure, the steps since the last checkpoint are done again; a
planned restart (no failure) first writes a checkpoint at the boundary and loses nothing. The
write holds what training changed -- θ and ω of the trainable models (what verl and OpenRLHF
save); the frozen models' weights are read again from where the job first read them.

    seconds = startup_s + checkpoint_bytes / (read_bw_per_node * nodes) + lost_s
              [+ saved_bytes / (write_bw_per_node * nodes)]

The periodic checkpoints that bound ``lost_s`` are written the same way, one every
``checkpoint_interval_steps`` steps (``checkpoint_write_s``); their cost does not depend on the
plan, so it never changes which plan is best, but a simulated job pays it.

Every default below is an assumption (marked so in ``RESTART_SOURCES``): no figure in the paper
gives them. Scenarios may override them and must say where their values come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from nereus.errors import InputError, is_finite_real, is_integer
from nereus.spec.job import JobSpec

GB = 1e9


@dataclass(frozen=True)
class RestartParams:
    """Parameters of a checkpoint/restart (seconds, bytes per second, steps)."""

    startup_s: float = 180.0
    storage_read_bw_per_node: float = 2.0 * GB
    storage_write_bw_per_node: float = 1.0 * GB
    checkpoint_interval_steps: int = 10

    def __post_init__(self) -> None:
        for f in ("startup_s", "storage_read_bw_per_node", "storage_write_bw_per_node"):
            v = getattr(self, f)
            if not is_finite_real(v):
                raise InputError(f"restart.{f}", f"must be a finite number, got {v!r}")
            if f == "startup_s" and v < 0:
                raise InputError(f"restart.{f}", f"must be >= 0, got {v!r}")
            if f != "startup_s" and v <= 0:
                raise InputError(f"restart.{f}", f"must be > 0, got {v!r}")
        n = self.checkpoint_interval_steps
        if not (is_integer(n) and n >= 1):
            raise InputError("restart.checkpoint_interval_steps",
                             f"must be an integer >= 1, got {n!r}")


RESTART_SOURCES: dict[str, str] = {
    "startup_s": "assumption: Ray workers, NCCL communicators, a vLLM engine with CUDA-graph "
                 "capture and model construction take a few minutes for an 8B PPO job",
    "storage_read_bw_per_node": "assumption: a shared file system or object store read in "
                                "parallel delivers about 2 GB/s to each node",
    "storage_write_bw_per_node": "assumption: writes at about half the read rate, 1 GB/s per node",
    "checkpoint_interval_steps": "assumption: a checkpoint every 10 RL steps (verl and OpenRLHF "
                                 "leave the save frequency to the user)",
}


def _state_bytes(job: JobSpec, trainable_only: bool) -> int:
    """θ and ω of each trainable model, and (unless ``trainable_only``) θ of each frozen one."""
    w = job.workload
    total = 0
    for m in job.workflow.models:
        if m.trainable:
            total += job.model.param_count(m.head) * (w.param_bytes
                                                       + w.optimizer_state_bytes_per_param())
        elif not trainable_only:
            total += job.model.param_count(m.head) * w.param_bytes
    return int(total)


def checkpoint_bytes(job: JobSpec) -> int:
    """Bytes a restart reads: θ and ω of each trainable model, θ of each frozen one."""
    return _state_bytes(job, trainable_only=False)


def saved_bytes(job: JobSpec) -> int:
    """Bytes a planned restart writes first: θ and ω of each trainable model (frozen weights
    never change, so no checkpoint holds them)."""
    return _state_bytes(job, trainable_only=True)


def checkpoint_write_s(job: JobSpec, params: RestartParams) -> float:
    """Seconds to write one checkpoint of ``job`` on its pool: what training changed (θ and ω
    of each trainable model) over the storage write bandwidth of every node of the pool. The
    job waits for the write (assumption: a synchronous save, no overlap with training). A
    planned restart and every periodic checkpoint write the same bytes."""
    nodes = max(1, len(job.pool.by_node()))
    return saved_bytes(job) / (params.storage_write_bw_per_node * nodes)


@dataclass(frozen=True)
class RestartCost:
    """A restart's predicted seconds by term (``source`` says estimated or simulated)."""

    startup_s: float
    load_s: float
    lost_s: float
    save_s: float
    checkpoint_bytes: int
    source: str = "estimated"

    @property
    def seconds(self) -> float:
        return self.startup_s + self.load_s + self.lost_s + self.save_s

    def explain(self) -> str:
        return (f"restart {self.seconds:.0f} s ({self.source}): start-up {self.startup_s:.0f} s"
                f" + load {self.checkpoint_bytes / GB:.0f} GB in {self.load_s:.0f} s"
                f" + redo {self.lost_s:.0f} s + save {self.save_s:.0f} s")


def restart_cost(job: JobSpec, params: RestartParams, *, step_s: float = 0.0,
                 after_failure: bool = True, lost_steps: float | None = None,
                 source: str = "estimated") -> RestartCost:
    """Cost of restarting ``job`` on its pool (``job.pool``).

    After a failure the steps since the last checkpoint are redone: ``lost_steps`` of
    ``step_s`` each, by default half a checkpoint interval (the expectation). A planned restart
    writes a checkpoint first instead.
    """
    nbytes = checkpoint_bytes(job)
    nodes = max(1, len(job.pool.by_node()))
    load = nbytes / (params.storage_read_bw_per_node * nodes)
    if after_failure:
        steps = params.checkpoint_interval_steps / 2.0 if lost_steps is None else lost_steps
        return RestartCost(params.startup_s, load, steps * step_s, 0.0, nbytes, source)
    return RestartCost(params.startup_s, load, 0.0, checkpoint_write_s(job, params), nbytes,
                       source)
