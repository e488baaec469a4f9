"""How far the planner's capped search lands from the fastest plan on pools with holes.

On a pool of partly filled nodes a plan can place dearer than the search priced it; the search
then goes on for one that places at its price (placing first the plans one model-stage away,
``Planner._repair``), up to ``nereus.plan.search.MAX_REPRICED`` such plans, and marks the plan
it keeps as not proven the fastest (``Plan.proven``). This benchmark draws random pools
(explicit GPU ids out of 4 nodes of 8) for 8B and 14B jobs (PPO, GRPO with a rule reward and 4
responses a prompt, ReMax; sync and async), plans each with the cap and without it
(``Planner(exhaustive=True)``, ``nereus plan --exhaustive``), and prints where they differ.
Step times are estimated (the cost model); search times are measured on this machine.

    python benchmarks/plan_holes.py --pools 120 --seed 1 --json

Last line with ``--json``: one JSON object with ``pools``, ``unproven`` (plans the capped
search marked), ``slower`` (of them, those the uncapped search beats), ``gap_max`` (relative),
``uncapped_unproven`` (uncapped searches that still stopped, at ``MAX_REPLACEMENTS``),
``marked_all_slower`` (every slower plan was marked: the mark is never missing), and the
median and maximum search seconds, capped and uncapped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from nereus.errors import InfeasibleError, InputError
from nereus.plan import search
from nereus.plan.search import Planner
from nereus.spec import parse_job

NODES, PER_NODE = 4, 8


def draw(rng: random.Random) -> dict[str, object]:
    algo = rng.choice(["ppo", "grpo", "remax"])
    spec: dict[str, object] = {
        "model": rng.choice(["llama-3.1-8b", "qwen3-14b"]), "algo": algo,
        "execution": rng.choice(["sync", "async"]),
        "gpus": sorted(rng.sample(range(NODES * PER_NODE), rng.randint(6, 28)))}
    if algo == "grpo":
        spec.update(reward="rule", workload={"responses_per_prompt": 4})
    return spec


def plan(spec: dict[str, object], exhaustive: bool) -> tuple[float | None, bool, float]:
    """(estimated step seconds or None where nothing fits, proven, measured search seconds)."""
    t = time.perf_counter()
    try:
        p = Planner(parse_job(spec), exhaustive=exhaustive).best()
        return p.step_latency_s, p.proven, time.perf_counter() - t
    except (InfeasibleError, InputError):
        return None, True, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args()
    cap = search.MAX_REPRICED  # what the capped search stops at (reported)
    rng = random.Random(args.seed)
    rows = []
    for k in range(args.pools):
        spec = draw(rng)
        a, proven, ta = plan(spec, False)
        b, b_proven, tb = plan(spec, True)
        gap = a / b - 1 if a is not None and b is not None else 0.0
        rows.append((gap, proven, ta, tb, b_proven))
        if a is not None and b is not None and (not proven or gap > 1e-9):
            gpus = spec["gpus"]
            assert isinstance(gpus, list)
            print(f"pool {k:3d} {spec['model']} {spec['algo']} {spec['execution']} "
                  f"{len(gpus)} GPUs: capped {a:.3f} s in {ta:.2f} s"
                  f"{'' if proven else ' (marked)'}, uncapped {b:.3f} s in {tb:.2f} s, "
                  f"{gap:+.1%} (step times estimated, search times measured)", flush=True)
    slower = [r for r in rows if r[0] > 1e-9]
    out = {"pools": len(rows), "cap": cap, "unproven": sum(not r[1] for r in rows),
           "uncapped_unproven": sum(not r[4] for r in rows),
           "slower": len(slower), "gap_max": round(max((r[0] for r in rows), default=0.0), 4),
           "marked_all_slower": all(not r[1] for r in slower),
           "search_s_median_capped": round(statistics.median(r[2] for r in rows), 3),
           "search_s_max_capped": round(max(r[2] for r in rows), 2),
           "search_s_median_uncapped": round(statistics.median(r[3] for r in rows), 3),
           "search_s_max_uncapped": round(max(r[3] for r in rows), 2),
           "source": "estimated (step times); measured (search times)"}
    print(json.dumps(out) if args.json else out)


if __name__ == "__main__":
    main()
