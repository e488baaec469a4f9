"""The figures issue 6 asks of ``nereus simulate``, with the time it takes to get them.

    python benchmarks/simulate_targets.py [--scenarios default,stationary,churn,drift]

Targets: on the default scenario Nereus >= 1.3x the static policy's throughput and >= the
replan-without-admission throughput with fewer transitions; on the stationary trace no
transition after the first plan; the calibrator's stage-latency error under 10 % after 10
steps; the default scenario (four policies) in under a minute on a 2-core machine.
Beside them, not timed with them: Nereus against ``static_verl`` (static within the plans a
verl user can configure, ``nereus.plan.frameworks``) and the steps on which that policy ran
static's plan because verl's space had none for the pool.
And where static's time goes beyond the oracle's (``gap_to_oracle``): the oracle runs the best
plan every step with free moves, so no policy's throughput exceeds its; the split says how much
of static's extra time is its plan (steps on the whole pool), running on fewer GPUs than the
pool holds (it grows back only at a restart), and restarts with their redone steps.
Throughputs are simulated; times are measured on this machine (wall and CPU).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

from nereus.sim.policies import VerlStaticPolicy
from nereus.sim.scenarios import builtin, run_scenario, simulator
from nereus.sim.simulator import PolicyResult


def _cpu() -> float:
    """CPU seconds of this process and its finished workers."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def gap_to_oracle(static: PolicyResult, oracle: PolicyResult) -> dict[str, Any]:
    """Static's busy time beyond the oracle's, split by cause (simulated seconds), and static's
    step time against the oracle's on the steps both ran on the whole pool."""
    same, plan_s, short_s, short_steps = [], 0.0, 0.0, 0
    for s, o in zip(static.rows, oracle.rows, strict=True):
        extra = s.step_s - o.step_s
        if s.plan_gpus < s.pool_gpus:
            short_s += extra
            short_steps += 1
        else:
            plan_s += extra
            if o.plan_gpus == o.pool_gpus == s.pool_gpus:
                same.append(s.step_s / o.step_s)
    same.sort()
    return {
        "extra_busy_s": round(static.busy_s - oracle.busy_s),
        "plan_s": round(plan_s), "fewer_gpus_s": round(short_s),
        "restarts_and_redone_s": round(static.restart_s + static.lost_s
                                       - oracle.restart_s - oracle.lost_s),
        "static_steps_on_fewer_gpus": short_steps,
        "whole_pool_steps": len(same),
        "whole_pool_step_ratio_median": round(same[len(same) // 2], 4) if same else None,
        "whole_pool_step_ratio_max": round(same[-1], 4) if same else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="default,stationary,churn,drift")
    args = ap.parse_args()
    out: dict[str, object] = {"source": "simulated (throughputs); measured (run times)",
                              "cpus": os.cpu_count()}
    for name in args.scenarios.split(","):
        sc = builtin(name)
        t0, c0 = time.perf_counter(), _cpu()
        res = run_scenario(sc)
        wall = time.perf_counter() - t0
        cpu = _cpu() - c0
        r = res.results
        s, a, n, o = r["static"], r["replan_always"], r["nereus"], r["oracle"]
        row: dict[str, Any] = {
            "steps": sc.steps, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "tokens_per_s": {k: round(v.tokens_per_s, 1) for k, v in r.items()},
            "transitions": {k: v.transitions for k, v in r.items()},
            "restarts": {k: v.restarts for k, v in r.items()},
            "nereus_vs_static": round(n.tokens_per_s / s.tokens_per_s, 3),
            "nereus_vs_replan_always": round(n.tokens_per_s / a.tokens_per_s, 3),
            "oracle_vs_static": round(o.tokens_per_s / s.tokens_per_s, 3),
            "nereus_transitions_after_first_plan": n.transitions,
            "calibration_error_step10": round(n.calib_error_at(10) or 0.0, 4),
            "static_gap_to_oracle": {"source": "simulated", **gap_to_oracle(s, o)},
        }
        sim = simulator(sc)
        verl = VerlStaticPolicy(sim.truth, sc.lengths)
        v = sim.run([verl]).results[verl.name]
        row["nereus_vs_static_verl"] = round(n.tokens_per_s / v.tokens_per_s, 3)
        row["static_verl_fallback_steps"] = sum(ev.pool in verl.fallback_pools
                                                for ev in sim.events)
        row["tokens_per_s"]["static_verl"] = round(v.tokens_per_s, 1)
        out[name] = row
        print(f"{name:<11} {sc.steps} steps in {wall:5.1f} s wall ({cpu:.0f} s CPU): "
              f"Nereus {row['nereus_vs_static']}x"
              f" static, {row['nereus_vs_replan_always']}x replan-always "
              f"({n.transitions} vs {a.transitions} transitions), oracle "
              f"{row['oracle_vs_static']}x static, calibration error after 10 steps "
              f"{row['calibration_error_step10']:.2%}; Nereus {row['nereus_vs_static_verl']}x "
              f"static in verl's space ({row['static_verl_fallback_steps']} steps on static's "
              f"plan)")
        g = row["static_gap_to_oracle"]
        print(f"{'':<11} static's {g['extra_busy_s']} s beyond the oracle (simulated): plan "
              f"{g['plan_s']} s "
              f"(on {g['whole_pool_steps']} steps on the whole pool its step is "
              f"{g['whole_pool_step_ratio_median']}x the oracle's, median, "
              f"{g['whole_pool_step_ratio_max']}x at most), fewer GPUs than the pool "
              f"{g['fewer_gpus_s']} s ({g['static_steps_on_fewer_gpus']} steps), restarts and "
              f"redone steps {g['restarts_and_redone_s']} s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
