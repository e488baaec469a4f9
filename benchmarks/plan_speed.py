"""How fast the exact plan search replans, and whether it agrees with brute force.

Each replan is cold: a new cost model prices every candidate of every model-stage for a new
response length, then the search runs. Beside its time, the peak memory one cold replan
allocates on top of what the process already holds (Python objects and numpy arrays,
``tracemalloc``; a replan of its own, since tracing slows it): what replanning adds to the
controller's process on the head node. Brute force enumerates every plan of small random
instances (tiny models, small pools, memory that binds).

    python benchmarks/plan_speed.py [--json] [--repeats 9] [--cases 40]

Targets (issue 2): 256 GPUs in at most 100 ms median, 1,024 in at most 1 s, brute-force
agreement on every case. Times are measured on this machine; plans are estimated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
import tracemalloc
from dataclasses import replace

from nereus.cost.model import CostModel
from nereus.errors import InfeasibleError
from nereus.plan.bruteforce import brute_force_latency
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.search import Planner
from nereus.spec import parse_job

GPU_COUNTS = (16, 64, 256, 1024)


def replan_ms(gpus: int, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of ``repeats`` cold replans (CPU time: what a busy host's
    other tenants cannot add to)."""
    walls, cpus = [], []
    for i in range(repeats):
        resp = 1024 + 768 * i  # a new response length each replan: nothing is cached
        job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": gpus,
                         "workload": {"response_len": resp}})
        t0, c0 = time.perf_counter(), time.process_time()
        Planner(job).best()
        walls.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return walls, cpus


def replan_peak_mib(gpus: int) -> float:
    """MiB allocated at the peak of one cold replan (tracemalloc counts numpy's buffers too)."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": gpus,
                     "workload": {"response_len": 999}})
    tracemalloc.start()
    try:
        Planner(job).best()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def random_small_job(rng: random.Random):
    stage_sets = [("grpo", ("actor_gen", "reference_infer", "actor_train")),
                  ("grpo", ("actor_gen", "reference_infer", "reward_infer", "actor_train")),
                  ("ppo", ("actor_gen", "critic_infer", "actor_train", "critic_train")),
                  ("remax", ("actor_gen", "reward_infer", "actor_train"))]
    algo, stages = rng.choice(stage_sets)
    job = parse_job({
        "model": rng.choice(["tiny-llama", "tiny-qwen3"]), "algo": algo,
        "execution": rng.choice(["sync", "async"]), "gpus": rng.choice([1, 2, 3, 4, 6, 8, 16]),
        "cluster": {"device": "cpu", "devices_per_node": rng.choice([1, 2, 4, 8]),
                    "device_memory_gib": rng.choice([0.07, 0.1, 0.2, 2.0])},
        "workload": {"prompts_per_step": rng.choice([2, 4]),
                     "responses_per_prompt": rng.choice([1, 2]),
                     "prompt_len": rng.choice([16, 64]),
                     "response_len": rng.choice([32, 256, 1024]), "ppo_mini_batches": 2}})
    wf = job.workflow
    return replace(job, workflow=replace(wf, stages=tuple(s for s in wf.stages
                                                          if s.name in stages)))


def brute_force_cases(n: int, seed: int = 0) -> tuple[int, int]:
    rng = random.Random(seed)
    cases = agree = 0
    while cases < n:
        job = random_small_job(rng)
        cost = CostModel(job)
        combos = math.prod(max(1, len(enumerate_candidates(cost, s, job.pool.size)))
                           for s in job.workflow.stages)
        if combos > 20_000:
            continue
        expected = brute_force_latency(job)
        try:
            got = Planner(job).best().step_latency_s
        except InfeasibleError:
            got = math.inf
        cases += 1
        agree += (got == expected == math.inf) or math.isclose(got, expected, rel_tol=1e-9)
    return cases, agree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cases", type=int, default=40)
    args = ap.parse_args()
    Planner(parse_job({"model": "llama-3.1-8b", "gpus": 16}))  # imports and warm caches
    load = os.getloadavg()[0]
    medians, cpu_medians, peaks = [], [], []
    for g in GPU_COUNTS:
        t, c = replan_ms(g, args.repeats)
        medians.append(statistics.median(t))
        cpu_medians.append(statistics.median(c))
        peaks.append(replan_peak_mib(g))
        print(f"PPO llama-3.1-8b on {g:5d} GPUs: replan median {medians[-1]:7.1f} ms "
              f"(min {min(t):.1f}, max {max(t):.1f}; CPU {cpu_medians[-1]:.1f} ms; "
              f"{args.repeats} cold replans), peak memory {peaks[-1]:.1f} MiB (measured)")
    print(f"load average (1 min) before the replans: {load:.2f}")
    cases, agree = brute_force_cases(args.cases)
    print(f"brute force: {agree}/{cases} small random instances agree with the search "
          f"(exact step latencies, estimated by the cost model)")
    if args.json:
        print(json.dumps({"gpus": list(GPU_COUNTS), "median_ms": [round(m, 2) for m in medians],
                          "cpu_median_ms": [round(m, 2) for m in cpu_medians],
                          "peak_mib": [round(m, 1) for m in peaks], "bruteforce_cases": cases,
                          "bruteforce_agree": agree,
                          "load_avg_1m": round(load, 2), "source": "measured"}))


if __name__ == "__main__":
    main()
