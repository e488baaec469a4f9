"""A plan placed near the GPUs the current plan's state holds (``nereus.plan.near``)."""

import itertools
from pathlib import Path

import pytest

from nereus.cost.model import CostModel
from nereus.files import read_yaml
from nereus.plan.near import placed_near
from nereus.plan.search import best_plan
from nereus.plan.validate import validate_plan
from nereus.spec.job import parse_job
from nereus.spec.workflow import Execution, Phase
from nereus.transition.planner import plan_transition

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _job(config: str, gpus: int, length: int):
    data = dict(read_yaml(EXAMPLES / config, "config"), gpus=gpus)
    data["workload"] = dict(data.get("workload") or {}, response_len=length,
                            response_len_max=length)
    return parse_job(data)


@pytest.fixture(scope="module")
def ppo48():
    """The 8B PPO example on 48 GPUs at 2K and 8K responses, with the planner's best plans."""
    jobs = {n: _job("llama-3.1-8b-ppo.yaml", 48, n) for n in (2048, 8192)}
    return jobs, {n: best_plan(j) for n, j in jobs.items()}


def _same_plan_but_placement(job, near, plan):
    assert [(s.stage, s.candidate) for s in near.stages] == \
        [(s.stage, s.candidate) for s in plan.stages]
    assert sorted(near.groups) == sorted(plan.groups)
    assert set(near.gpus()) <= set(job.pool.ids)
    assert validate_plan(job, near) == []


def test_inference_stages_that_would_take_each_others_gpus_stay_where_they_are(ppo48):
    jobs, plans = ppo48
    cur, tgt = plans[2048], plans[8192]
    # as searched, reference, reward and critic inference rotate over three blocks of 16 GPUs;
    # they run concurrently, so none can hand its GPUs over before its new copy exists
    searched = plan_transition(jobs[8192], cur, tgt)
    assert not searched.feasible and "runs concurrently" in searched.reason
    nears = placed_near(jobs[8192], CostModel(jobs[8192]), tgt, cur)
    assert nears
    for near in nears:
        _same_plan_but_placement(jobs[8192], near, tgt)
    near = min(nears, key=lambda p: p.step_latency_s)
    assert near.step_latency_s == pytest.approx(tgt.step_latency_s, rel=1e-12)
    for stage in ("reference_infer", "reward_infer", "critic_infer"):
        assert set(near.stage(stage).gpus) == set(cur.stage(stage).gpus)
    moved = plan_transition(jobs[8192], cur, near)
    assert moved.feasible
    # nothing crosses between GPUs for the inference stages: they only reshard in place
    for p in moved.primitives:
        if p.primitive.stage in ("reference_infer", "reward_infer", "critic_infer"):
            assert p.primitive.op != "Extend"


def test_a_plan_placed_near_itself_is_unchanged(ppo48):
    jobs, plans = ppo48
    for n, plan in plans.items():
        assert placed_near(jobs[n], CostModel(jobs[n]), plan, plan) == []


def test_a_unit_on_the_same_gpus_keeps_its_gpu_order(ppo48):
    jobs, plans = ppo48
    cur = plans[2048]
    sp = cur.stage("actor_train")
    # the current actor replicas with their GPUs in reverse order: the near placement must
    # keep that order (same layout, same GPUs), or every shard would move
    flipped = type(cur)(tuple(type(s)(s.stage, s.candidate, tuple(r[::-1] for r in s.replicas),
                                      s.latency_s, s.peak_mem_bytes)
                              if s.stage == "actor_train" else s for s in cur.stages),
                        cur.step_latency_s, cur.source, cur.terms, cur.groups)
    nears = placed_near(jobs[2048], CostModel(jobs[2048]), cur, flipped)
    assert nears
    for near in nears:
        assert set(near.stage("actor_train").replicas) == {r[::-1] for r in sp.replicas}


@pytest.mark.parametrize("config", ["llama-3.1-8b-ppo.yaml", "llama-3.1-8b-remax-async.yaml"])
def test_near_placements_keep_candidates_groups_and_the_pool(config):
    jobs = {g: _job(config, g, 2048) for g in (16, 24, 32)}
    plans = {g: best_plan(j) for g, j in jobs.items()}
    seen = 0
    for a, b in itertools.permutations(plans, 2):
        job, tgt = jobs[b], plans[b]
        for near in placed_near(job, CostModel(job), tgt, plans[a]):
            seen += 1
            _same_plan_but_placement(job, near, tgt)
            if job.workflow.execution is Execution.ASYNC:
                gen = {g for s in job.workflow.phase_stages(Phase.GENERATION)
                       for g in near.stage(s.name).gpus}
                rest = {g for s in job.workflow.stages if s.phase is not Phase.GENERATION
                        for g in near.stage(s.name).gpus}
                assert gen.isdisjoint(rest)  # generation keeps GPUs of its own
    assert seen


def test_asynchronous_generation_may_stay_on_the_gpus_it_holds():
    """ReMax async on 16 GPUs from 512 to 2,048 tokens: the searched target swaps the GPUs of
    generation and of the other phases (no order fits); with generation placed first near its
    GPUs and the rest beside it, the same plan at the same speed is reachable."""
    jobs = {n: _job("llama-3.1-8b-remax-async.yaml", 16, n) for n in (512, 2048)}
    cur, tgt = best_plan(jobs[512]), best_plan(jobs[2048])
    assert not plan_transition(jobs[2048], cur, tgt).feasible
    nears = [p for p in placed_near(jobs[2048], CostModel(jobs[2048]), tgt, cur)
             if p.step_latency_s == pytest.approx(tgt.step_latency_s, rel=1e-12)]
    assert any(plan_transition(jobs[2048], cur, p).feasible for p in nears)
    for near in nears:
        _same_plan_but_placement(jobs[2048], near, tgt)


def test_placements_kept_between_calls_price_as_fresh_ones(ppo48):
    """``placed_near`` keeps its placements (not their prices) between calls: a call served
    from them returns the plans a call that placed them anew returns, at other lengths and
    efficiencies too."""
    from nereus.cost.efficiency import Efficiencies
    from nereus.cost.ops import OpClass
    from nereus.plan import near

    jobs, plans = ppo48
    job, other = jobs[8192], jobs[2048]
    current = plans[2048]
    eff = Efficiencies({OpClass.GEMM: 0.6})
    near._PLACEMENTS.clear()
    first = placed_near(job, CostModel(job), plans[8192], current)
    kept = placed_near(other, CostModel(other, eff), plans[8192], current)
    near._PLACEMENTS.clear()
    fresh = placed_near(other, CostModel(other, eff), plans[8192], current)
    assert first and [p.to_dict() for p in kept] == [p.to_dict() for p in fresh]
