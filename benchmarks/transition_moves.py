"""Which moves between the 8B PPO example's best plans have a memory-safe schedule.

Eight jobs: ``examples/llama-3.1-8b-ppo.yaml`` on 16, 24, 32 and 48 GPUs, with responses of
2,048 and 8,192 tokens (mean and longest). Each gets the planner's best plan; every ordered
pair of the eight is then planned as a transition under the 48-GPU, 8K job (the largest pool,
the largest activations' workload). A move is feasible when the transition layer finds a
schedule that keeps every GPU within its capacity; staged when that schedule copies a shard
through host memory. Then the same moves with the target placed near the current GPUs
(``nereus.plan.near``), as the controller weighs them: the cheapest feasible transition to the
planner's placement or to a near placement no slower per step. Byte counts and times are
estimated (cost and transition models).

    python benchmarks/transition_moves.py [--json] [-v]

``-v`` prints why each infeasible move is so. Last line with ``--json``: one JSON object with
``moves``, ``feasible``, ``staged``, ``feasible_near``, ``faster_near``, the summed L_tran of
the moves feasible as planned (``l_tran_sum_s``, and ``l_tran_near_sum_s`` with near
placements) and ``infeasible`` (pairs, with their reasons).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from nereus.cost.model import CostModel
from nereus.files import read_yaml
from nereus.plan.near import placed_near_no_slower
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
    jobs = {(g, n): job_for(base, g, n) for g, n in itertools.product(POOLS, LENGTHS)}
    costs = {k: CostModel(j) for k, j in jobs.items()}
    plans: dict[tuple[int, int], Plan] = {k: best_plan(j, cost=costs[k]) for k, j in jobs.items()}
    job = job_for(base, max(POOLS), max(LENGTHS))
    feasible = staged = near_feasible = 0
    infeasible: list[dict[str, Any]] = []
    l_tran: list[float] = []       # the moves feasible as planned: L_tran as planned
    l_tran_near: list[float] = []  # the same moves: the cheapest of them and the near placements
    pairs = list(itertools.permutations(plans, 2))
    for a, b in pairs:
        s = plan_transition(job, plans[a], plans[b])
        near = [plan_transition(job, plans[a], p)
                for p in placed_near_no_slower(jobs[b], costs[b], plans[b], plans[a])]
        cheapest = min((x.estimated_s for x in [s, *near] if x.feasible), default=None)
        near_feasible += cheapest is not None
        if not s.feasible:
            infeasible.append({"from": list(a), "to": list(b), "reason": s.reason,
                               "near_s": cheapest})
            if args.verbose:
                print(f"{a} -> {b}: {s.reason}")
                print(f"  placed near the current GPUs: "
                      f"{'none feasible' if cheapest is None else f'{cheapest:.3f} s'} "
                      f"(estimated)")
            continue
        feasible += 1
        staged += any(p.primitive.staged for p in s.primitives)
        l_tran.append(s.estimated_s)
        l_tran_near.append(cheapest if cheapest is not None else s.estimated_s)
    print(f"{feasible} of {len(pairs)} moves have a memory-safe schedule, {staged} of them "
          f"with staged primitives (estimated)")
    improved = sum(n < t - 1e-9 for n, t in zip(l_tran_near, l_tran))
    print(f"with the target placed near the current GPUs at no step cost (as the controller "
          f"does): {near_feasible} of {len(pairs)} feasible; of the {feasible} above, "
          f"{improved} move faster, L_tran summed {sum(l_tran):.1f} s -> {sum(l_tran_near):.1f} s "
          f"(estimated)")
    if args.json:
        print(json.dumps({"moves": len(pairs), "feasible": feasible, "staged": staged,
                          "feasible_near": near_feasible, "faster_near": improved,
                          "l_tran_sum_s": round(sum(l_tran), 3),
                          "l_tran_near_sum_s": round(sum(l_tran_near), 3),
                          "source": "estimated", "infeasible": infeasible}))


if __name__ == "__main__":
    main()
