"""verl's plan space: what its plans look like, the most GPUs that hold one, and the search
against brute force over the same space."""

import math
from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Candidate
from nereus.errors import InfeasibleError
from nereus.plan.bruteforce import brute_force_latency
from nereus.plan.frameworks import (
    best_verl_plan,
    uniform_part,
    verl_keep,
    verl_overrides,
)
from nereus.plan.search import best_plan
from nereus.plan.validate import validate_plan
from nereus.spec import GpuPool, parse_job
from nereus.spec.job import JobSpec

from plan_testlib import searched_latency


def _job(gpus, algo: str = "ppo", response_len: int = 4096, **extra) -> JobSpec:
    return parse_job({"model": "llama-3.1-8b", "algo": algo, "execution": "sync", "gpus": gpus,
                      "workload": {"response_len": response_len, "prompts_per_step": 512},
                      **extra})


def _critic_shared(choice: dict[str, Candidate]) -> bool:
    return ("critic_infer" not in choice or "critic_train" not in choice
            or choice["critic_infer"].layout == choice["critic_train"].layout)


def test_every_stage_runs_on_the_same_gpus_and_the_critic_on_its_training_layout():
    job = _job(16)
    plan = best_verl_plan(job)
    assert validate_plan(job, plan) == []
    assert all(sorted(sp.gpus) == list(range(16)) for sp in plan.stages)
    assert plan.stage("actor_gen").candidate.pp == 1
    assert plan.stage("critic_infer").layout == plan.stage("critic_train").layout
    # a subspace: never faster than the planner's best over all plans
    assert plan.step_latency_s >= best_plan(job).step_latency_s * (1 - 1e-9)


def test_a_pool_no_verl_plan_spans_runs_on_the_fullest_node():
    """12 GPUs (8 on node 1, 4 on node 0): a batch of 512 splits evenly over no TP x DP of 12,
    so verl runs on 8, the whole of node 1, where the planner's best uses all 12."""
    cluster = {"nodes": 2, "devices_per_node": 8}
    job = _job([4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], cluster=cluster)
    plan = best_verl_plan(job)
    assert sorted(plan.gpus()) == list(range(8, 16))
    assert len(best_plan(job).gpus()) == 12


def test_asynchronous_execution_has_no_verl_plan():
    with pytest.raises(InfeasibleError, match="same GPUs"):
        best_verl_plan(_job(16, execution="async"))


def test_no_plan_on_any_number_of_gpus_is_an_infeasible_error_naming_the_pool():
    job = _job(4, response_len=16384)
    with pytest.raises(InfeasibleError, match="4 GPUs"):
        best_verl_plan(job)


STAGE_SETS = [
    ("ppo", ("actor_gen", "critic_infer", "actor_train", "critic_train")),
    ("ppo", ("reference_infer", "critic_infer", "critic_train")),
    ("grpo", ("actor_gen", "reference_infer", "actor_train")),
]


@st.composite
def small_jobs(draw):
    algo, stages = draw(st.sampled_from(STAGE_SETS))
    data = {
        "model": draw(st.sampled_from(["tiny-llama", "tiny-qwen3"])),
        "algo": algo,
        "execution": "sync",
        "gpus": draw(st.sampled_from([1, 2, 3, 4, 6, 8])),
        "cluster": {"device": "cpu", "devices_per_node": draw(st.sampled_from([2, 4, 8])),
                    "device_memory_gib": draw(st.sampled_from([0.07, 0.1, 0.2, 2.0]))},
        "workload": {"prompts_per_step": draw(st.sampled_from([2, 4])),
                     "responses_per_prompt": 1,
                     "prompt_len": draw(st.sampled_from([16, 64])),
                     "response_len": draw(st.sampled_from([32, 256, 1024])),
                     "ppo_mini_batches": 2},
    }
    job = parse_job(data)
    wf = job.workflow
    return replace(job, workflow=replace(wf, stages=tuple(s for s in wf.stages
                                                          if s.name in stages)))


def _fewer(job: JobSpec, gpus: int) -> JobSpec | None:
    part = uniform_part(job.pool, gpus)
    return None if part is None else job.with_pool(GpuPool(job.cluster, part))


@given(small_jobs())
@settings(max_examples=40, deadline=None)
def test_best_verl_plan_equals_brute_force_over_verl_space(job):
    """On the GPUs it chose, nothing in verl's space is faster; on more, nothing fits."""
    def brute(gpus: int) -> float:
        sub = _fewer(job, gpus)
        if sub is None:  # verl's resource pool cannot take that many of these GPUs
            return math.inf
        return brute_force_latency(sub, keep=verl_keep(sub), consistent=_critic_shared,
                                   max_combinations=200_000)

    try:
        plan = best_verl_plan(job)
    except InfeasibleError:
        event("infeasible")
        assert all(brute(g) == math.inf for g in range(1, job.pool.size + 1))
        return
    used = len(plan.gpus())
    event(f"on {used} of {job.pool.size}")
    sub = _fewer(job, used)
    assert sub is not None
    assert all(sorted(sp.gpus) == sorted(sub.pool.ids) for sp in plan.stages)
    assert searched_latency(sub, plan) == pytest.approx(brute(used), rel=1e-9)
    assert all(brute(g) == math.inf for g in range(used + 1, job.pool.size + 1))


def test_verl_takes_as_many_gpus_on_every_node():
    """8 + 4 GPUs: 12 sit unevenly, so verl's resource pool (nnodes x n_gpus_per_node) takes
    12 from neither; 8 from the full node, or 4 + 4 where both hold 4 or more."""
    cluster = parse_job({"model": "llama-3.1-8b", "gpus": 16,
                         "cluster": {"nodes": 2, "devices_per_node": 8}}).cluster
    pool = GpuPool(cluster, tuple(range(4, 16)))  # node 0: 4-7, node 1: 8-15
    assert uniform_part(pool, 12) is None
    assert uniform_part(pool, 8) == tuple(range(8, 16))
    assert uniform_part(pool, 6) == tuple(range(8, 14))
    assert uniform_part(GpuPool(cluster, tuple(range(1, 8)) + tuple(range(9, 16))), 8) == \
        (1, 2, 3, 4, 9, 10, 11, 12)
    assert uniform_part(pool, 13) is None


def test_a_batch_twelve_gpus_share_evenly_still_runs_on_one_node_of_8_and_4():
    job = _job(list(range(12)), cluster={"nodes": 2, "devices_per_node": 8},
               response_len=1024)
    job = job.with_workload(replace(job.workload, prompts_per_step=384))  # 12 x 32
    plan = best_verl_plan(job)
    assert sorted(plan.gpus()) == list(range(8))
    keys = verl_overrides(job, plan)
    assert keys[:2] == ["trainer.nnodes=1", "trainer.n_gpus_per_node=8"]


def test_the_overrides_set_every_stage_s_layout():
    job = _job(16, cluster={"nodes": 2, "devices_per_node": 8})
    plan = best_verl_plan(job)
    got = dict(k.split("=") for k in verl_overrides(job, plan))
    assert got["trainer.nnodes"] == "2" and got["trainer.n_gpus_per_node"] == "8"
    gen, actor, critic = (plan.stage(n).candidate for n in ("actor_gen", "actor_train",
                                                             "critic_train"))
    assert got["actor_rollout_ref.rollout.tensor_model_parallel_size"] == str(gen.tp)
    assert got["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"] == str(actor.pp)
    assert got["critic.megatron.tensor_model_parallel_size"] == str(critic.tp)
    assert "reward_model.megatron.pipeline_model_parallel_size" in got
    uneven = _job(list(range(12)), cluster={"nodes": 2, "devices_per_node": 8})
    with pytest.raises(ValueError, match="as many on every node"):
        verl_overrides(uneven, best_plan(uneven))
