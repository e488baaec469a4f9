"""The plan validator: one broken plan per rule, each built from a real best plan by replacing
one StagePlan (or, for memory, by checking it on a device with less memory), and each broken
so that only the rule it is named for catches it."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from nereus.cost.candidate import Layout
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.search import best_plan
from nereus.plan.types import Plan, StagePlan
from nereus.plan.validate import validate_plan
from nereus.spec import GiB, JobSpec, parse_job


@cache
def planned(gpus: int = 16, execution: str = "sync") -> tuple[JobSpec, Plan]:
    """Llama-3.1-8B PPO on H100 nodes of 8 and its best plan, which the validator passes."""
    job = parse_job({"model": "llama-3.1-8b", "gpus": gpus, "execution": execution})
    plan = best_plan(job)
    assert validate_plan(job, plan) == []
    return job, plan


def swapped(plan: Plan, new: StagePlan) -> Plan:
    """``plan`` with the StagePlan of ``new.stage`` replaced by ``new``."""
    return replace(plan, stages=tuple(new if s.stage == new.stage else s for s in plan.stages))


def test_the_plans_the_tests_break_are_what_they_assume() -> None:
    job, plan = planned()
    assert job.pool.ids == tuple(range(16))
    train = plan.stage("actor_train")
    assert (train.tp, train.pp, train.dp) == (2, 2, 2)
    assert train.candidate.micro_batch * train.candidate.grad_accum == 64
    assert CostModel(job).stage_batch("actor_train") == 128
    assert plan.group_of("critic_train") in ((), ("critic_train",))


def test_a_missing_stage_is_caught() -> None:
    """critic_train (in no group) left out of the plan."""
    job, plan = planned()
    broken = replace(plan, stages=tuple(s for s in plan.stages if s.stage != "critic_train"))
    assert validate_plan(job, broken) == ["critic_train: missing from the plan"]


def test_gpus_outside_the_pool_are_caught() -> None:
    """critic_train's one replica (tp=1, pp=8) moved to GPUs 16-23: the pool is GPUs 0-15."""
    job, plan = planned()
    critic = plan.stage("critic_train")
    assert (critic.tp, critic.pp, critic.dp) == (1, 8, 1)
    moved = replace(critic, replicas=(tuple(range(16, 24)),))
    assert validate_plan(job, swapped(plan, moved)) == [
        "critic_train: GPUs [16, 17, 18, 19, 20, 21, 22, 23] are not in the pool"]


def test_a_layout_that_cannot_shard_the_model_is_caught() -> None:
    """actor_train's (2, 2) replicas on GPUs 0-3 and 4-7 turned into (3, 1) replicas on GPUs
    0-2 and 3-5, the batch kept: 3 does not divide Llama-3.1-8B's 32 attention heads."""
    job, plan = planned()
    train = plan.stage("actor_train")
    c = train.candidate
    bad = replace(train, candidate=replace(c, layout=Layout(3, 1)),
                  replicas=((0, 1, 2), (3, 4, 5)))
    assert bad.candidate.dp * c.micro_batch * c.grad_accum == 128
    assert validate_plan(job, swapped(plan, bad)) == [
        "actor_train: tp=3 does not divide the 32 attention heads"]


def test_a_batch_the_candidate_does_not_cover_is_caught() -> None:
    """actor_train with half its gradient-accumulation steps: 2 x 1 x 32 = 64 samples of the
    128 a step trains on."""
    job, plan = planned()
    train = plan.stage("actor_train")
    c = train.candidate
    half = replace(train, candidate=replace(c, grad_accum=c.grad_accum // 2))
    assert (half.candidate.layout, half.candidate.dp) == (c.layout, c.dp)
    assert validate_plan(job, swapped(plan, half)) == [
        "actor_train: dp x b x a = 2x1x32 != batch 128"]


def test_asynchronous_generation_sharing_gpus_with_training_is_caught() -> None:
    """Asynchronous execution: actor_gen generates the next step while the rest trains on this
    one, so it needs GPUs of its own. Its (2, 2) replica moved onto actor_train's first
    replica's GPUs 0-1 and critic_infer's 8-9 (both in the same nodes as before)."""
    job, plan = planned(execution="async")
    gen = plan.stage("actor_gen")
    assert (gen.tp, gen.pp, gen.dp) == (2, 2, 1)
    assert {0, 1} <= set(plan.stage("actor_train").gpus)
    assert {8, 9} <= set(plan.stage("critic_infer").gpus)
    moved = replace(gen, replicas=((0, 1, 8, 9),))
    broken = swapped(plan, moved)
    assert validate_plan(job, broken) == [
        "asynchronous generation shares GPUs [0, 1, 8, 9] with inference or training"]
    # in synchronous execution generation has the GPUs to itself while it runs
    sync = replace(job, workflow=parse_job({"model": "llama-3.1-8b", "gpus": 16}).workflow)
    assert validate_plan(sync, broken) == []


def test_the_idle_state_of_co_resident_stages_counts_toward_memory() -> None:
    """On 8 GPUs, actor_train and critic_train share GPUs 0-7 and take turns: each one runs
    beside the other's resident state. The plan checked on a device with 60 GiB (54 GiB
    allowed): every stage alone fits, but actor_train beside critic_train's idle state does
    not."""
    job, plan = planned(gpus=8)
    assert ("actor_train", "critic_train") in plan.groups
    small = replace(job, cluster=replace(job.cluster,
                                         device=job.cluster.device.with_memory(60 * GiB)))
    limit = HEADROOM * small.cluster.device.memory_bytes
    cost = CostModel(small)
    for s in plan.stages:  # alone, every stage fits
        assert cost.estimate(s.stage, s.candidate, 0).peak_mem_bytes <= limit, s.stage
    problems = validate_plan(small, plan)
    assert problems, problems
    for p in problems:
        assert p.startswith("GPU ") and "of idle state beside it, over 54.0 GiB" in p, problems
        assert " with 0.0 GiB of idle state" not in p, problems
    assert any(": actor_train needs " in p for p in problems), problems


def test_the_reward_models_stage_in_a_job_scored_by_a_rule_is_caught_with_why() -> None:
    """A plan made for PPO with a reward model, checked against the same job scored by a
    rule: its reward_infer is no model-stage there, and the problem says why."""
    _, plan = planned()
    rule = parse_job({"model": "llama-3.1-8b", "gpus": 16, "reward": "rule"})
    why = "a rule scores the responses here, with no reward model"
    assert validate_plan(rule, plan) == [f"reward_infer: not a model-stage of ppo: {why}"]
