"""A plan on GPU ids the job's cluster lacks is refused in one line before anything is planned
(the transition layer used to plan onto them, and its validator to accept the result)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nereus.errors import InputError
from nereus.transition.instances import make_job, paper_example_a
from nereus.transition.planner import plan_transition


@pytest.mark.parametrize("gpu", [-1, 32, 100])
def test_a_plan_on_gpus_outside_the_cluster_is_refused(gpu: int) -> None:
    job = make_job("llama-3.1-8b", 32)
    current, target = paper_example_a()
    sp = target.stages[0]
    bad = replace(sp, replicas=((gpu, *sp.replicas[0][1:]), *sp.replicas[1:]))
    moved = replace(target, stages=(bad, *target.stages[1:]))
    with pytest.raises(InputError, match=rf"^target\.{sp.stage}\.gpus: GPU ids \[{gpu}\] "
                                         r"outside the cluster's 32 devices"):
        plan_transition(job, current, moved)
