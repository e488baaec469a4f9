"""Measured engine stages beside the cost model's estimate after calibration.

Each case is one stage operation (train_step, forward, generate) of a small model in one layout
(tp, pp, dp) and one batch shape, run on the runtime's workers (Ray actors, gloo on CPU, NCCL on
GPU). Time is the slowest worker's wall time of the operation (the fastest of ``--repeats``
rounds that run every case in turn, after a warm-up: on a shared machine other processes only
add time, and interleaving spreads their bursts over all cases); memory is the largest
per-worker peak of one extra run with memory tracking (``nereus.engine.measure``), with the case
set up alone on the workers: the bytes of tensors, state and transient, so it is compared with
the estimate's tensor terms (all but its ``workspace`` assumption for non-tensor memory). Both
are measured.

Calibration never sees the case it scores: the cases are split into two folds; a ``Calibrator``
learns the op-class efficiencies (from stage latencies) and the memory scale per stage kind from
one fold, and the cost model so calibrated estimates the other fold. The last line is one JSON
object: ``cases``, ``latency_mape``, ``memory_mape`` (targets 0.15 and 0.10), and the device.

    python benchmarks/engine.py [--json] [--workers 2] [--repeats 3] [--model small-llama]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import ray
import torch

from nereus.cost.calibrate import Calibrator
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.engine.batch import Batch
from nereus.engine.losses import weighted_nll
from nereus.engine.optim import AdamConfig
from nereus.engine.runner import StageRunner
from nereus.engine.sampling import SamplingParams
from nereus.runtime.comm import Rendezvous
from nereus.runtime.movement import destroy_member, place_seeded
from nereus.runtime.state import StateSpec
from nereus.runtime.workers import WorkerPool
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.device import get_device
from nereus.spec.job import JobSpec
from nereus.spec.model import Head, get_model
from nereus.spec.workflow import StageKind, ppo
from nereus.spec.workload import Workload
from nereus.transition.emu import Emu, Holds

STAGES = {"train": "actor_train", "forward": "reference_infer", "generate": "actor_gen"}
KINDS = {"train": StageKind.TRAIN, "forward": StageKind.FORWARD, "generate": StageKind.GENERATE}


@dataclass(frozen=True)
class Case:
    """One stage operation: ``seqs`` sequences of ``prompt`` + ``response`` tokens (for
    generation, ``response`` new tokens are sampled), micro-batch ``b``, ``a`` per replica."""

    kind: str
    tp: int
    pp: int
    dp: int
    a: int
    seqs: int
    prompt: int
    response: int

    @property
    def b(self) -> int:
        return self.seqs // (self.dp * self.a)

    @property
    def name(self) -> str:
        return (f"{self.kind} tp{self.tp}pp{self.pp}dp{self.dp} b{self.b}a{self.a} "
                f"n{self.seqs} s{self.prompt}+{self.response}")


def cases(workers: int) -> list[Case]:
    layouts = [(tp, pp, dp) for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2, 4)
               if tp * pp * dp <= workers]
    out = []
    for tp, pp, dp in layouts:
        out += [Case("train", tp, pp, dp, 2, 8, 64, 64), Case("train", tp, pp, dp, 1, 8, 32, 32),
                Case("forward", tp, pp, dp, 2, 8, 64, 64),
                Case("forward", tp, pp, dp, 1, 16, 32, 32),
                Case("generate", tp, pp, dp, 1, 8, 32, 32),
                Case("generate", tp, pp, dp, 1, 4, 64, 16)]
    return out


def job_for(c: Case, model: str, device: str, workers: int) -> JobSpec:
    dev = get_device(device)
    cluster = Cluster(dev, 1, workers)
    dtype = "fp32" if device == "cpu" else "bf16"
    wl = Workload(prompts_per_step=c.seqs, responses_per_prompt=1, prompt_len=c.prompt,
                  response_len_mean=c.response, response_len_max=c.response,
                  ppo_mini_batches=1, ppo_epochs=1, param_dtype=dtype, grad_dtype="fp32",
                  master_weights=dtype != "fp32")
    return JobSpec(get_model(model), cluster, GpuPool.first(cluster, workers), ppo(), wl)


def candidate(c: Case) -> Candidate:
    return Candidate(Layout(c.tp, c.pp), c.dp, c.b, c.a)


def batch_for(c: Case, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(7)
    s = c.prompt + c.response
    ids = torch.randint(0, vocab, (c.seqs, s), generator=g)
    if c.kind == "generate":
        return Batch(ids[:, :c.prompt])
    w = torch.full((c.seqs, s - 1), 1.0 / (c.seqs * (s - 1)))
    return Batch(ids, None, {"weight": w})


@dataclass(frozen=True)
class Measured:
    case: Case
    wall_s: float            # fastest of the repeats (measured)
    walls: tuple[float, ...]
    peak_mem_bytes: int      # largest worker peak (measured, memory run)
    op_s: dict[str, float]   # per op class, median run (measured)


class Bench:
    """One case set up on the workers: its seeded units and its runner (groups open)."""

    def __init__(self, pool: WorkerPool, rv: Rendezvous, c: Case, model: str, device: str,
                 tag: str) -> None:
        spec = get_model(model)
        trainable = c.kind == "train"
        dtype = "fp32" if device == "cpu" else "bf16"
        sspec = StateSpec(spec, Head.LM, trainable, dtype, trainable and dtype != "fp32")
        size = c.tp * c.pp
        holds = Holds.THETA_OMEGA if trainable else Holds.THETA
        self.pool, self.case = pool, c
        self.emus = [Emu(f"{STAGES[c.kind]}/{tag}{d}", STAGES[c.kind], "actor",
                         Layout(c.tp, c.pp), tuple(range(d * size, (d + 1) * size)), holds)
                     for d in range(c.dp)]
        pool.run({g: (place_seeded, (e.id, sspec, (c.tp, c.pp), e.position(i), 1, False))
                  for e in self.emus for i, g in enumerate(e.gpus)})
        self.batch = batch_for(c, spec.vocab_size)
        self.sampling = SamplingParams(max_new_tokens=c.response, temperature=1.0, seed=3)
        self.runner = StageRunner(pool, self.emus, rv, AdamConfig(lr=1e-5))
        self.runs: list[Any] = []

    def once(self, track: bool = False) -> Any:
        c, run = self.case, self.runner
        if c.kind == "train":
            return run.train_step(self.batch, weighted_nll, c.b, track_memory=track)[1]
        if c.kind == "forward":
            return run.forward(self.batch, c.b, track_memory=track)[1]
        return run.generate(self.batch, self.sampling, c.b, track_memory=track)[1]

    def close(self) -> None:
        self.runner.close()
        self.pool.run({g: (destroy_member, (e.id,)) for e in self.emus for g in e.gpus})


def measure_all(pool: WorkerPool, rv: Rendezvous, todo: list[Case], model: str, device: str,
                repeats: int) -> list[Measured]:
    """Every case set up at once, then ``repeats`` rounds that run each case once in turn, so
    a burst of load from other processes hits all cases alike; each case keeps its fastest
    round (other processes only ever add time). Then one memory run per case, set up alone:
    a worker's peak counts every unit it holds, and with every case set up the other cases'
    state would be in each one's peak (it was: about 780 MiB whatever the case)."""
    benches: list[Bench] = []
    try:
        for i, c in enumerate(todo):
            benches.append(Bench(pool, rv, c, model, device, f"b{i}_"))
            benches[-1].once()   # warm-up
        for _ in range(repeats):
            for b in benches:
                b.runs.append(b.once())
    finally:
        for b in benches:
            b.close()
    out = []
    for i, b in enumerate(benches):
        alone = Bench(pool, rv, b.case, model, device, f"m{i}_")
        try:
            alone.once()  # warm-up, as the timed runs had
            mem = alone.once(track=True)
        finally:
            alone.close()
        best = min(b.runs, key=lambda m: m.wall_s)
        out.append(Measured(b.case, best.wall_s, tuple(m.wall_s for m in b.runs),
                            int(mem.peak_mem_bytes), dict(best.op_s)))
        ops = " ".join(f"{k}={v * 1e3:.0f}" for k, v in sorted(best.op_s.items()))
        print(f"measured  {b.case.name:<44} {best.wall_s * 1e3:9.1f} ms  "
              f"{mem.peak_mem_bytes / 2**20:8.1f} MiB  [{ops} ms]", file=sys.stderr)
    return out


def tensor_bytes(est: Any) -> int:
    """The estimate's bytes of tensors: every memory term but ``workspace`` (CUDA context,
    library buffers, the interpreter), which the engine's allocator-level peak does not see."""
    return int(est.peak_mem_bytes - est.memory.get("workspace", 0))


def calibrated(train: list[Measured], model: str, device: str, workers: int
               ) -> tuple[Efficiencies, dict[StageKind, float]]:
    cal = Calibrator(prior=Efficiencies(device=device), forgetting=1.0)
    for m in train:
        job = job_for(m.case, model, device, workers)
        est = CostModel(job).estimate(STAGES[m.case.kind], candidate(m.case))
        cal.observe_stage(est, m.wall_s)
        cal.observe_memory(KINDS[m.case.kind], tensor_bytes(est), m.peak_mem_bytes)
    return cal.efficiencies(), cal.memory_scale()


def score(test: list[Measured], eff: Efficiencies, mem_scale: dict[StageKind, float],
          model: str, device: str, workers: int) -> list[dict[str, Any]]:
    rows = []
    for m in test:
        job = job_for(m.case, model, device, workers)
        est = CostModel(job, eff).estimate(STAGES[m.case.kind], candidate(m.case))
        mem = int(tensor_bytes(est) * mem_scale.get(KINDS[m.case.kind], 1.0))
        rows.append({"case": m.case.name, "measured_s": m.wall_s,
                     "estimated_s": est.latency_s,
                     "latency_err": abs(est.latency_s - m.wall_s) / m.wall_s,
                     "measured_mem": m.peak_mem_bytes, "estimated_mem": mem,
                     "memory_err": abs(mem - m.peak_mem_bytes) / m.peak_mem_bytes,
                     "op_s": m.op_s, "walls": m.walls})
    return rows


def _allreduce_times(ctx: Any, name: str, nbytes: int, n: int) -> list[float]:
    """Seconds of ``n`` all-reduces of ``nbytes`` on group ``name`` (after a warm-up)."""
    g = ctx.groups[name]
    t = torch.ones(max(1, nbytes // 4), device=ctx.device)
    for _ in range(5):
        g.all_reduce(t)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        g.all_reduce(t)
        out.append(time.perf_counter() - t0)
    return out


def link_figures(pool: WorkerPool, rv: Rendezvous) -> dict[str, float]:
    """Measured all-reduce time between two workers: small messages (the per-message latency
    the device preset assumes) and 4 MiB (bandwidth). Medians, seconds and bytes/s."""
    from nereus.runtime.comm import close_groups, open_groups

    groups = {"bench/link": (0, 1)}
    open_groups(pool, groups, rv)
    try:
        small = pool.run({d: (_allreduce_times, ("bench/link", 4, 200)) for d in (0, 1)})[0]
        big = pool.run({d: (_allreduce_times, ("bench/link", 4 << 20, 20)) for d in (0, 1)})[0]
    finally:
        close_groups(pool, groups)
    return {"allreduce_small_s": statistics.median(small),
            "allreduce_4MiB_bytes_per_s": (4 << 20) / statistics.median(big)}


def run_cases(args: argparse.Namespace, device: str
              ) -> tuple[list[Measured], dict[str, float]]:
    """Measure every case, and the link between two workers, on a fresh Ray session and
    worker pool (released at the end)."""
    if args.kind == "cpu":
        ray.init(num_cpus=max(2, args.workers), include_dashboard=False, log_to_driver=False,
                 resources={"nereus_slot": args.workers})
    else:
        ray.init(include_dashboard=False, log_to_driver=False)
    pool = rv = None
    results: list[Measured] = []
    link: dict[str, float] = {}
    try:
        pool = WorkerPool.start(args.workers, kind=args.kind)
        rv = Rendezvous("127.0.0.1" if args.kind == "cpu" else None)
        todo = [c for c in cases(args.workers) if args.only in c.name]
        results = measure_all(pool, rv, todo, args.model, device, args.repeats)
        if args.workers >= 2:
            link = link_figures(pool, rv)
    finally:
        if rv is not None:
            rv.close()
        if pool is not None:
            pool.shutdown()
        ray.shutdown()
    return results, link


def load_measurements(path: str) -> list[Measured]:
    with open(path) as f:
        return [Measured(Case(**r["case"]), r["wall_s"], tuple(r["walls"]), r["peak_mem_bytes"],
                         r["op_s"]) for r in json.load(f)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print per-case rows as JSON too")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="small-llama")
    ap.add_argument("--profile", default=None, help="write the efficiencies calibrated on all "
                    "cases to this JSON profile (nereus.cost.calibrate format)")
    ap.add_argument("--save", default=None, help="write the raw measurements to this JSON file")
    ap.add_argument("--load", default=None, help="score measurements saved by --save instead of "
                    "measuring (calibration studies without re-running)")
    ap.add_argument("--only", default="", help="measure only cases whose name has this text "
                    "(diagnosis; the scores then come from fewer cases)")
    ap.add_argument("--kind", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--device", default=None, help="device preset the cost model prices "
                    "(default: cpu, or h200-141gb with --kind gpu)")
    args = ap.parse_args(argv)
    device = args.device or ("cpu" if args.kind == "cpu" else "h200-141gb")

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    results, link = ((load_measurements(args.load), {}) if args.load
                     else run_cases(args, device))
    if args.save:
        with open(args.save, "w") as f:
            json.dump([asdict(m) for m in results], f)

    folds = [results[0::2], results[1::2]]
    rows = []
    for k in (0, 1):
        eff, mem_scale = calibrated(folds[1 - k], args.model, device, args.workers)
        rows += score(folds[k], eff, mem_scale, args.model, device, args.workers)
    for r in rows:
        print(f"{r['case']:<44} time {r['measured_s'] * 1e3:8.1f} ms meas / "
              f"{r['estimated_s'] * 1e3:8.1f} ms est ({r['latency_err']:5.1%})   memory "
              f"{r['measured_mem'] / 2**20:7.1f} MiB meas / {r['estimated_mem'] / 2**20:7.1f} "
              f"MiB est ({r['memory_err']:5.1%})")
    if args.profile:
        cal = Calibrator(prior=Efficiencies(device=device), forgetting=1.0)
        for m in results:
            job = job_for(m.case, args.model, device, args.workers)
            cal.observe_stage(CostModel(job).estimate(STAGES[m.case.kind], candidate(m.case)),
                              m.wall_s)
        cal.save(args.profile, args.model)
    if args.json:
        print(json.dumps({"rows": rows}, default=str))
    summary = {
        "cases": len(rows),
        "latency_mape": statistics.fmean(r["latency_err"] for r in rows),
        "memory_mape": statistics.fmean(r["memory_err"] for r in rows),
        "latency_mape_by_kind": {k: statistics.fmean(r["latency_err"] for r in rows
                                                     if r["case"].startswith(k))
                                 for k in STAGES if any(r["case"].startswith(k) for r in rows)},
        "device": device, "workers": args.workers, "model": args.model,
        "source": "measured vs estimated (2-fold: calibrated on the other fold)",
        "wall_s": time.perf_counter() - t0,
        # other processes on the machine add time to every measurement; say how busy it was
        "load_avg_1min": (None if args.load else
                          [round(load0, 2), round(os.getloadavg()[0], 2)]),
        "measurements": args.load or "this run",
        # measured beside the device preset's intra-node latency and bandwidth assumptions
        "link_measured": link or None,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
