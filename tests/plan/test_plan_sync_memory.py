"""The colocated weight sync's memory in the plan layer: the search, the brute force and the
validator refuse a plan whose sync does not fit the GPUs it runs on (``CostModel.
weight_sync_fits``), as they refuse a stage that does not."""

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel
from nereus.plan.bruteforce import brute_force_latency
from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
from nereus.plan.search import Planner
from nereus.plan.validate import validate_plan
from nereus.spec import parse_job

from plan_testlib import searched_latency


def _small():
    return parse_job({"model": "tiny-llama", "algo": "grpo", "gpus": 4,
                      "cluster": {"device": "cpu", "devices_per_node": 2,
                                  "device_memory_gib": 0.2},
                      "workload": {"prompts_per_step": 4, "prompt_len": 16,
                                   "response_len": 256, "ppo_mini_batches": 2}})


def test_a_sync_that_does_not_fit_is_never_searched_and_brute_force_agrees(monkeypatch):
    """No real job on the presets makes the sync bind where a stage does not (the stages'
    peaks hold the training parameters and the generation weights too), so the test refuses
    the pair of layouts the unconstrained best plan syncs between: the search must find
    another, the brute force the same latency."""
    job = _small()
    sync = job.workflow.weight_sync()
    free = Planner(job).best()
    banned = (free.stage(sync[0]).layout, free.stage(sync[1]).layout)
    real = CostModel.weight_sync_fits
    monkeypatch.setattr(CostModel, "weight_sync_fits",
                        lambda self, t, g: (t, g) != banned and real(self, t, g))
    best = Planner(job).best()
    assert (best.stage(sync[0]).layout, best.stage(sync[1]).layout) != banned
    assert searched_latency(job, best) >= searched_latency(job, free)
    assert searched_latency(job, best) == pytest.approx(brute_force_latency(job), rel=1e-9)


def test_the_validator_names_a_sync_over_memory():
    """70B PPO on 128 H100s: training tp=2 pp=16 with recomputation and generation tp=2 pp=1
    each fit, but between them a GPU holds 76.6 GiB (training parameters, the 65.7 GiB
    generation shard, a gathered embedding, the workspace) against 71.7 allowed."""
    job = parse_job({"model": "llama-3.3-70b", "algo": "ppo", "gpus": 128,
                     "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
                     "workload": {"prompts_per_step": 512, "prompt_len": 512,
                                  "response_len": 2048, "ppo_mini_batches": 4}})
    best = Planner(job).best()
    assert validate_plan(job, best) == []
    specs = {sp.stage: StageLayoutSpec(sp.tp, sp.pp, sp.dp, None, sp.candidate.micro_batch,
                                       sp.candidate.grad_accum, sp.candidate.recompute)
             for sp in best.stages}
    specs["actor_train"] = StageLayoutSpec(2, 16, 4, None, 1, 32, True)
    specs["actor_gen"] = StageLayoutSpec(2, 1, 64, None, 8, 1, False)
    cost = CostModel(job)
    assert cost.estimate("actor_train", Candidate(Layout(2, 16), 4, 1, 32, True)).fits
    assert not cost.weight_sync_fits(Layout(2, 16), Layout(2, 1))
    plan = evaluate_plan(job, specs, cost=cost)
    problems = validate_plan(job, plan, cost)
    assert any(p.startswith("weight sync actor_train -> actor_gen: its fullest GPU holds 76.6 "
                            "GiB") for p in problems), problems
