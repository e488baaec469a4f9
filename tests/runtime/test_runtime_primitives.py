"""What a primitive allocates on the workers against what the transition planner charged for it.

The planner's memory check is the only thing that keeps a schedule it calls feasible from
stalling on the workers, so for every Merge and Extend the bytes a worker allocates when it
starts must be what the planner's ``MemStep`` adds, and for a Split at least its new shards
(its all-gather buffers come on top and shrink to fit, see ``fit_bucket``).
"""

from __future__ import annotations

import random

import pytest
from runtime_testlib import cpu_job

from nereus.runtime.executor import state_specs
from nereus.runtime.primitives import need_bytes
from nereus.transition.instances import random_pair, stage_names
from nereus.transition.planner import plan_transition
from nereus.transition.primitives import Split
from nereus.transition.sizes import StateSizes


@pytest.mark.parametrize("model,seed", [("tiny-llama", s) for s in range(6)]
                         + [("tiny-qwen3", s) for s in range(6)])
def test_workers_allocate_what_the_planner_charged(model: str, seed: int) -> None:
    job = cpu_job(model, 8)
    rng = random.Random(seed)
    pair = None
    while pair is None:
        pair = random_pair(rng, job, stage_names(job, 4), rng.choice([4, 6, 8]),
                           rng.choice([4, 6, 8]))
    schedule = plan_transition(job, *pair)
    assert schedule.feasible, schedule.reason
    specs = state_specs(job, "cpu")
    sizes = StateSizes(job)
    checked = 0
    for sp in schedule.primitives:
        p = sp.primitive
        planned = p.memory(sizes)
        for g, n in need_bytes(p, specs[p.stage]).items():
            extra = planned[g].during - planned[g].before
            if isinstance(p, Split):
                assert n >= extra, (p.op, g)
            else:
                assert n == extra, (p.op, p.stage, g, n, extra)
            checked += 1
    assert checked or not schedule.primitives
