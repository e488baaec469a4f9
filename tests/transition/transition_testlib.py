"""Plans built by hand for the transition tests, and the paper's two worked examples."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nereus.cost.candidate import Candidate, Layout
from nereus.plan.types import Plan, StagePlan
from nereus.spec.job import JobSpec, parse_job
from nereus.transition.instances import paper_example_a, paper_example_b


def sp(name: str, tp: int, pp: int, replicas: Sequence[Iterable[int]]) -> StagePlan:
    reps = tuple(tuple(r) for r in replicas)
    return StagePlan(name, Candidate(Layout(tp, pp), len(reps), 1, 1), reps)


def job8b(gpus: int = 32, **cluster: object) -> JobSpec:
    """Llama-3.1-8B PPO on H100 nodes of 8 (the paper's default workload)."""
    return parse_job({"model": "llama-3.1-8b", "gpus": gpus,
                      "cluster": {"device": "h100-sxm-80gb", **cluster}})


def tiny_job(gpus: int = 16, memory_gib: float | None = None) -> JobSpec:
    cluster: dict[str, object] = {"device": "cpu", "devices_per_node": 4}
    if memory_gib is not None:
        cluster["device_memory_gib"] = memory_gib
    return parse_job({"model": "tiny-llama", "gpus": gpus, "cluster": cluster})


def example_a() -> tuple[Plan, Plan]:
    return paper_example_a()


def example_b() -> tuple[Plan, Plan]:
    return paper_example_b()
