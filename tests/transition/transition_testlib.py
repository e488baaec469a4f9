"""Plans built by hand for the transition tests, and the paper's two worked examples."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nereus.cost.candidate import Candidate, Layout
from nereus.plan.types import Plan, StagePlan
from nereus.spec.job import JobSpec, parse_job


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
    """§5.1: actor generation and critic training, each (TP=1, PP=4, DP=2) on 16 GPUs; the pool
    grows to 32 and responses to 4K. The actor goes to (TP=2, PP=4, DP=2), the critic to
    (TP=1, PP=4, DP=4). Each actor target unit is the Merge of two (1, 4) units laid
    TP-innermost: the first from the current replicas, the second from their Extends."""
    cur = Plan((sp("actor_gen", 1, 4, [range(0, 4), range(4, 8)]),
                sp("critic_train", 1, 4, [range(8, 12), range(12, 16)])))
    tgt = Plan((sp("actor_gen", 2, 4, [[0, 4, 1, 5, 2, 6, 3, 7],
                                       [16, 20, 17, 21, 18, 22, 19, 23]]),
                sp("critic_train", 1, 4, [range(8, 12), range(12, 16), range(24, 28),
                                          range(28, 32)])))
    return cur, tgt


def example_b() -> tuple[Plan, Plan]:
    """§6.1, Fig. 6: reward inference (TP=4, PP=8) on 32 GPUs becomes (TP=8, PP=2) on 16 of
    them. The (4, 2) pieces of the Split on GPUs 0-7 and 16-23 are exactly the two pieces the
    target unit merges, so two are kept and two destroyed."""
    cur = Plan((sp("reward_infer", 4, 8, [range(32)]),))
    tgt = Plan((sp("reward_infer", 8, 2, [[0, 4, 1, 5, 2, 6, 3, 7,
                                           16, 20, 17, 21, 18, 22, 19, 23]]),))
    return cur, tgt
