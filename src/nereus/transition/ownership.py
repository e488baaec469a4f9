"""GPU ownership during a transition: which model-stages may not hold EMUs on one GPU at once.

Two model-stages run concurrently in a plan when they run at the same time on disjoint GPU
sets: the same phase in different groups (``Plan.groups``), or, in asynchronous execution,
generation against inference or training. Stages of different phases, or of one group, share
GPUs one after another. During a transition, a pair that runs concurrently in the current or
the target plan must never hold EMUs on one GPU at the same moment, except on the GPUs the two
share in one of the plans (where that plan serializes them): a pair concurrent in both plans
may share nothing, and a pair that becomes serialized may meet on the GPUs it will share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nereus.plan.types import Plan
from nereus.spec.workflow import Execution, Phase, Workflow


def concurrent_in(plan: Plan, workflow: Workflow, a: str, b: str) -> bool:
    """Whether model-stages ``a`` and ``b`` run at the same time in ``plan``."""
    if a == b:
        return False
    pa, pb = workflow.stage(a).phase, workflow.stage(b).phase
    same = pa is pb
    cross = (workflow.execution is Execution.ASYNC
             and (pa is Phase.GENERATION) != (pb is Phase.GENERATION))
    if not (same or cross):
        return False
    if same and plan.group_of(a) == plan.group_of(b):
        return False
    return set(plan.stage(a).gpus).isdisjoint(plan.stage(b).gpus)


@dataclass(frozen=True)
class Ownership:
    """For every pair that must not share GPUs: the GPUs it may share anyway."""

    rivals: Mapping[str, Mapping[str, frozenset[int]]]  # stage -> rival stage -> exempt GPUs

    def rivals_of(self, stage: str) -> Mapping[str, frozenset[int]]:
        return self.rivals.get(stage, {})

    @classmethod
    def between(cls, workflow: Workflow, current: Plan, target: Plan,
                stages: Iterable[str] | None = None) -> Ownership:
        names = list(stages) if stages is not None else list(current.names)
        rivals: dict[str, dict[str, frozenset[int]]] = {}
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if not (concurrent_in(current, workflow, a, b)
                        or concurrent_in(target, workflow, a, b)):
                    continue
                shared = (set(current.stage(a).gpus) & set(current.stage(b).gpus)) | \
                         (set(target.stage(a).gpus) & set(target.stage(b).gpus))
                rivals.setdefault(a, {})[b] = frozenset(shared)
                rivals.setdefault(b, {})[a] = frozenset(shared)
        return cls(rivals)
