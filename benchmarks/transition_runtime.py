"""Transitions executed for real: Nereus's executor against checkpoint-and-reload, measured.

Model: a Llama-style decoder of ~123 M parameters (hidden 1024, 8 layers, GQA 16/4 heads,
vocabulary 16384), trainable with Adam, fp32 on CPU: 1.48 GB of state per full copy, so that
bandwidth, not per-call overhead, sets the times. One model-stage (actor_train) on 2 workers
(Ray actors, one per CPU device slot, i.e. per core of this 2-core machine; gloo over loopback,
or NCCL on GPUs with ``--kind gpu``). The CPU device's bandwidths in the job (the cost model's
peaks) are the runtime's measured inventory (``measure_cpu_device``: a copy and a loopback
broadcast), not the ``cpu`` preset's guesses; efficiencies are calibrated on top of them.

Per case (a layout change), all times measured, the best of ``--repeats`` runs (on a shared
machine other processes only add time):
- Nereus: the transition layer's schedule executed by ``nereus.runtime.Executor`` (wall clock
  from the first primitive's start to the last one's end, communicator set-up included).
- Checkpoint: torch.distributed.checkpoint save of the current layout plus resharded load into
  the target layout, on the same workers, same state (``nereus.runtime.Checkpointer``; files in
  ``--ckpt-dir``, written without fsync, which favours the checkpoint path).
- Bitwise: after Nereus's transition and after the checkpoint reload, every position of every
  target unit is compared with the seeded state on its own worker (``torch.equal``).

Figures (last line, one JSON object):
- ``extend_bw_ratio``: bytes per second of the Extend primitive of a (tp=1, pp=1) unit (driver
  wall time of the primitive: dispatch, set-up, allocation and broadcast) over a raw gloo
  broadcast of the same bytes between the same two processes on an existing group (worker
  time of the broadcast alone). Target >= 0.8.
- ``vs_checkpoint_speedup``: median over cases of checkpoint time / Nereus time. Target >= 5.
- ``estimate_error``: median relative error of the schedule's estimated L_tran against the
  measured one, with efficiencies calibrated (``nereus.transition.calibrate``) only on the
  other fold of cases (two folds). Target <= 0.2.

    python benchmarks/transition_runtime.py [--json] [--repeats 2] [--kind cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import torch

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.plan.types import Plan, StagePlan
from nereus.runtime.checkpoint import Checkpointer
from nereus.runtime.comm import Rendezvous, close_groups, open_groups
from nereus.runtime.executor import ExecutionReport, Executor, state_specs
from nereus.runtime.faults import TransitionFailed
from nereus.runtime.inventory import measure_cpu_device
from nereus.runtime.placement import place_units, verify_units
from nereus.runtime.state import position_bytes
from nereus.runtime.workers import WorkerContext, WorkerPool
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.device import DeviceSpec, GiB, get_device
from nereus.spec.job import JobSpec
from nereus.spec.model import ModelSpec
from nereus.spec.workflow import grpo
from nereus.spec.workload import Workload
from nereus.transition.calibrate import calibrate_transition
from nereus.transition.emu import phi
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule

MODEL = ModelSpec("bench-llama-123m", hidden_size=1024, intermediate_size=2816, num_layers=8,
                  num_heads=16, num_kv_heads=4, head_dim=64, vocab_size=16384,
                  rope_theta=10_000.0, max_position_embeddings=2048)
STAGE = "actor_train"
SEED = 7
WORKERS = 2


def make_job(device: DeviceSpec, kind: str) -> JobSpec:
    cluster = Cluster(device, 1, WORKERS)
    wl = Workload(prompts_per_step=8, ppo_mini_batches=2,
                  param_dtype="fp32" if kind == "cpu" else "bf16")
    return JobSpec(MODEL, cluster, GpuPool(cluster, tuple(range(WORKERS))), grpo(), wl)


def plan(tp: int, pp: int, reps: Sequence[Sequence[int]]) -> Plan:
    cand = Candidate(Layout(tp, pp), len(reps), 1, 1)
    return Plan((StagePlan(STAGE, cand, tuple(tuple(r) for r in reps)),))


# Alternate cases form the two calibration folds; each fold has an Extend, a TP and a PP Split
# (one alone, one followed by a Merge) and a Merge.
CASES: dict[str, tuple[Plan, Plan]] = {
    "extend-1x1": (plan(1, 1, [[0]]), plan(1, 1, [[0], [1]])),
    "move-1x1": (plan(1, 1, [[0]]), plan(1, 1, [[1]])),
    "split-tp2": (plan(2, 1, [[0, 1]]), plan(1, 1, [[0], [1]])),
    "split-pp2": (plan(1, 2, [[0, 1]]), plan(1, 1, [[0], [1]])),
    "merge-pp2": (plan(1, 1, [[0], [1]]), plan(1, 2, [[0, 1]])),
    "merge-tp2": (plan(1, 1, [[0], [1]]), plan(2, 1, [[0, 1]])),
    "pp2-to-tp2": (plan(1, 2, [[0, 1]]), plan(2, 1, [[0, 1]])),
    "tp2-to-pp2": (plan(2, 1, [[0, 1]]), plan(1, 2, [[0, 1]])),
}


@dataclass
class CaseResult:
    name: str
    forward: list[tuple[Schedule, ExecutionReport]] = field(default_factory=list)
    backward: list[tuple[Schedule, ExecutionReport]] = field(default_factory=list)
    checkpoint_s: list[float] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)

    @property
    def nereus_s(self) -> float:
        return min(r.wall_s for _, r in self.forward)

    @property
    def speedup(self) -> float:
        return min(self.checkpoint_s) / self.nereus_s

    def best(self) -> tuple[Schedule, ExecutionReport]:
        return min(self.forward, key=lambda sr: sr[1].wall_s)


def _drop_all(ctx: WorkerContext) -> None:
    for u in list(ctx.units):
        ctx.drop(u)
    if ctx.cache is not None:
        ctx.cache.clear()


def _raw_broadcast(ctx: WorkerContext, name: str, nbytes: int) -> float:
    """Seconds of one gloo/NCCL broadcast of ``nbytes`` from rank 0 on group ``name``, into a
    buffer kept (and touched) across calls, as a raw transfer loop would."""
    g = ctx.groups[name]
    if "raw" not in ctx.scratch:
        ctx.memory.reserve(nbytes, "raw broadcast buffer")
        ctx.scratch["raw"] = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
    buf = ctx.scratch["raw"]
    g.barrier()
    t0 = time.perf_counter()
    g.broadcast(buf, src=0)
    g.synchronize()
    return time.perf_counter() - t0


def _raw_free(ctx: WorkerContext) -> None:
    buf = ctx.scratch.pop("raw", None)
    if buf is not None:
        ctx.memory.release(buf.numel())


def run_case(name: str, pool: WorkerPool, job: JobSpec, ex: Executor, ck: Checkpointer,
             repeats: int, log: Any) -> CaseResult:
    current, target = CASES[name]
    specs = ex.specs
    res = CaseResult(name)
    pool.run_all(_drop_all)
    place_units(pool, phi(job, current)[STAGE], specs, SEED)
    for rep in range(repeats):
        fwd = plan_transition(job, current, target)
        res.forward.append((fwd, ex.run(fwd)))
        if rep == repeats - 1:
            res.differences += verify_units(pool, phi(job, target)[STAGE], SEED)
        back = plan_transition(job, target, current)
        res.backward.append((back, ex.run(back)))
    for rep in range(repeats):  # the same layout change through a checkpoint
        t0 = time.perf_counter()
        where = ck.save(pool, phi(job, current), tag=f"{name}-{rep}")
        t1 = time.perf_counter()
        pool.run_all(_drop_all)  # the job restarts: the old layout's state is gone
        t2 = time.perf_counter()
        ck.restore(pool, STAGE, phi(job, target)[STAGE], specs[STAGE], where)
        t3 = time.perf_counter()
        res.save_s.append(t1 - t0)
        res.load_s.append(t3 - t2)
        res.checkpoint_s.append((t1 - t0) + (t3 - t2))
        if rep == repeats - 1:
            res.differences += verify_units(pool, phi(job, target)[STAGE], SEED)
        shutil.rmtree(where, ignore_errors=True)
        if rep < repeats - 1:
            ex.run(plan_transition(job, target, current))
    log(f"{name}: nereus {res.nereus_s:.3f} s, checkpoint {min(res.checkpoint_s):.3f} s "
        f"(save {min(res.save_s):.3f} + load {min(res.load_s):.3f}), speedup "
        f"{res.speedup:.1f}x, bitwise {'ok' if not res.differences else res.differences[:2]}")
    return res


def extend_ratio(pool: WorkerPool, job: JobSpec, ex: Executor, repeats: int
                 ) -> dict[str, float]:
    """Extend's bytes/s over a raw broadcast's, same bytes, same two processes, measured in
    alternation (best of each) so that load from other processes hits both alike. Extend:
    driver wall time of the primitive (dispatch, set-up, allocation, broadcast); raw: worker
    time of one broadcast on an existing group into a touched buffer."""
    cur, tgt = CASES["extend-1x1"]
    pool.run_all(_drop_all)
    place_units(pool, phi(job, cur)[STAGE], ex.specs, SEED)
    src, dst = tgt.stage(STAGE).replicas[0][0], tgt.stage(STAGE).replicas[1][0]
    nbytes = position_bytes(ex.specs[STAGE], 1, 1, 0, 0)
    ext: list[tuple[float, float]] = []
    raw: list[float] = []
    with Rendezvous() as rv:
        open_groups(pool, {"raw": (src, dst)}, rv)
    try:
        for _ in range(repeats + 2):
            refs = [pool.submit(d, _raw_broadcast, "raw", nbytes) for d in (src, dst)]
            raw.append(max(ray.get(refs)))
            rep = ex.run(plan_transition(job, cur, tgt))
            t = next(t for t in rep.timings if t.op == "Extend")
            ext.append((t.duration_s, t.setup_s))
            ex.run(plan_transition(job, tgt, cur))
    finally:
        close_groups(pool, {"raw": (src, dst)})
        pool.run_all(_raw_free)
    ext_s, setup_s = min(ext)
    raw_s = min(raw)
    return {"extend_bytes": nbytes, "extend_s": ext_s, "extend_setup_s": setup_s,
            "extend_bw": nbytes / ext_s, "raw_broadcast_s": raw_s, "raw_bw": nbytes / raw_s,
            "extend_bw_ratio": raw_s / ext_s,
            "extend_bw_ratio_without_setup": raw_s / max(ext_s - setup_s, 1e-9),
            "extend_cold_s": ext[0][0]}


def _calibrated(job: JobSpec, runs: Sequence[tuple[Schedule, ExecutionReport]]) -> Efficiencies:
    """Efficiencies fitted to every measured primitive of ``runs`` at once: one least-squares
    problem over all their primitives (``calibrate_transition`` on their concatenation)."""
    prims = tuple(sp for sched, _ in runs for sp in sched.primitives)
    measured = [t.duration_s for _, rep in runs for t in rep.timings]
    joint = replace(runs[0][0], primitives=prims,
                    efficiencies=Efficiencies(device=job.cluster.device.name))
    return calibrate_transition(joint, measured)


def estimate_errors(job: JobSpec, results: Sequence[CaseResult]) -> list[dict[str, Any]]:
    """Two folds of cases: calibrate on one fold's forward transitions (their backward ones
    can be the other fold's cases), score the other fold's."""
    out = []
    folds = [results[0::2], results[1::2]]
    for f, held_out in enumerate(folds):
        train = [r for r in results if r not in held_out]
        eff = _calibrated(job, [sr for r in train for sr in r.forward])
        for r in held_out:
            cur, tgt = CASES[r.name]
            est = plan_transition(job, cur, tgt, eff).estimated_s
            meas = r.nereus_s
            out.append({"case": r.name, "fold": f, "estimated_s": est, "measured_s": meas,
                        "relative_error": abs(est - meas) / meas,
                        "efficiencies": {c.value: v for c, v in eff.values.items()}})
    return out


def _cpu_name() -> str:
    import os

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical CPUs"
    except OSError:
        pass
    return f"{os.cpu_count()} logical CPUs"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kind", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--memory-gib", type=float, default=3.5, help="device memory per worker")
    ap.add_argument("--ckpt-dir", default="/tmp/nereus-bench-ckpt")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers run our helpers
    t_start = time.perf_counter()
    ray.init(include_dashboard=False, resources={"nereus_slot": WORKERS},
             object_store_memory=256 * 1024**2, log_to_driver=False)
    try:
        pool = WorkerPool.start(WORKERS, kind=args.kind,
                                capacity_bytes=int(0.9 * args.memory_gib * GiB))
        base = get_device("cpu" if args.kind == "cpu" else "h100-sxm-80gb").with_memory(
            int(args.memory_gib * GiB))
        device_spec = measure_cpu_device(pool, base) if args.kind == "cpu" else base
        log(f"device: {device_spec.source}")
        job = make_job(device_spec, args.kind)
        specs = state_specs(job)
        ex = Executor(pool, specs)
        ck = Checkpointer(args.ckpt_dir, sync_files=False)
        try:
            results = [run_case(n, pool, job, ex, ck, args.repeats, log) for n in args.cases]
        except TransitionFailed as e:
            for tbs in e.report.tracebacks.values():
                for d, tb in tbs.items():
                    log(f"worker {d}: {tb}")
            raise
        ext = extend_ratio(pool, job, ex, args.repeats)
        errs = estimate_errors(job, results)
        device = torch.cuda.get_device_name(0) if args.kind == "gpu" and \
            torch.cuda.is_available() else _cpu_name()
        pool.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(args.ckpt_dir, ignore_errors=True)
    state_bytes = position_bytes(specs[STAGE], 1, 1, 0, 0)
    per_case = [{"case": r.name, "nereus_s": r.nereus_s,
                 "checkpoint_s": min(r.checkpoint_s), "save_s": min(r.save_s),
                 "load_s": min(r.load_s), "speedup": r.speedup,
                 "primitives": [sp.op for sp in r.best()[0].primitives],
                 "bytes_moved": r.best()[1].bytes, "setup_s": r.best()[1].setup_s,
                 "bitwise_equal": not r.differences} for r in results]
    for row in per_case:
        log(json.dumps({**row, "source": "measured"}))
    for est in errs:
        log(f"estimate {est['case']} (fold {est['fold']}): estimated {est['estimated_s']:.3f} "
            f"s, measured {est['measured_s']:.3f} s, error {est['relative_error']:.2f}")
    log(f"extend: {ext['extend_bw'] / 1e9:.2f} GB/s vs raw broadcast "
        f"{ext['raw_bw'] / 1e9:.2f} GB/s (measured)")
    out = {
        "bitwise_equal": all(not r.differences for r in results),
        "cases": len(results),
        "extend_bw_ratio": ext["extend_bw_ratio"],
        "vs_checkpoint_speedup": statistics.median(r.speedup for r in results),
        "estimate_error": statistics.median(e["relative_error"] for e in errs),
        "vs_checkpoint_speedup_min": min(r.speedup for r in results),
        "extend": ext,
        "per_case": per_case,
        "estimates": errs,
        "model": MODEL.name, "state_bytes_per_copy": state_bytes,
        "device_spec": {"hbm_bw": device_spec.hbm_bw,
                        "intra_node_bw": device_spec.intra_node_bw,
                        "source": device_spec.source},
        "device": f"{args.kind}: {device}", "workers": WORKERS, "repeats": args.repeats,
        "backend": "gloo" if args.kind == "cpu" else "nccl",
        "source": "measured (estimates: transition cost model after calibration)",
        "bench_s": time.perf_counter() - t_start,
    }
    print(json.dumps(out))
    ok = (out["bitwise_equal"] and out["extend_bw_ratio"] >= 0.8
          and out["vs_checkpoint_speedup"] >= 5 and out["estimate_error"] <= 0.2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
