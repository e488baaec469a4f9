"""Which moves between the 8B PPO example's best plans have a memory-safe schedule.

Eight jobs: ``examples/llama-3.1-8b-ppo.yaml`` on 16, 24, 32 and 48 GPUs, with responses of
2,048 and 8,192 tokens (mean and longest). Each gets the planner's best plan; every ordered
pair of the eight is then planned as a transition under the 48-GPU, 8K job (the largest pool,
the largest activations' workload). A move is feasible when the transition layer finds a
schedule that keeps every GPU within its capacity; staged when that schedule copies a shard
through host memory. Byte counts and times are estimated (cost and transition models).

    python benchmarks/transition_moves.py [--json] [-v]

``-v`` prints why each infeasible move is so. Last line with ``--json``: one JSON object with
``moves``, ``feasible``, ``staged`` and ``infeasible`` (pairs, with their reasons).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from nereus.files import read_yaml
from nereus.plan.search import best_plan
from nereus.plan.types import Plan
from nereus.spec.job import JobSpec, parse_job
from nereus.transition.planner import plan_transition

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "llama-3.1-8b-ppo.yaml"
POOLS = (16, 24, 32, 48)          # GPUs
LENGTHS = (2048, 8192)            # response tokens, mean = longest


def job_for(base: dict[str, Any], gpus: int, length: int) -> JobSpec:
    data = dict(base, gpus=gpus)
    data["workload"] = dict(base.get("workload") or {}, response_len=length,
                            response_len_max=length)
    return parse_job(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    ap.add_argument("-v", "--verbose", action="store_true", help="why each move is infeasible")
    args = ap.parse_args()
    base = read_yaml(CONFIG, "config")
    plans: dict[tuple[int, int], Plan] = {
        (g, n): best_plan(job_for(base, g, n)) for g, n in itertools.product(POOLS, LENGTHS)}
    job = job_for(base, max(POOLS), max(LENGTHS))
    feasible = staged = 0
    infeasible: list[dict[str, Any]] = []
    pairs = list(itertools.permutations(plans, 2))
    for a, b in pairs:
        s = plan_transition(job, plans[a], plans[b])
        if not s.feasible:
            infeasible.append({"from": list(a), "to": list(b), "reason": s.reason})
            if args.verbose:
                print(f"{a} -> {b}: {s.reason}")
            continue
        feasible += 1
        staged += any(p.primitive.staged for p in s.primitives)
    print(f"{feasible} of {len(pairs)} moves have a memory-safe schedule, {staged} of them "
          f"with staged primitives (estimated)")
    if args.json:
        print(json.dumps({"moves": len(pairs), "feasible": feasible, "staged": staged,
                          "source": "estimated", "infeasible": infeasible}))


if __name__ == "__main__":
    main()
