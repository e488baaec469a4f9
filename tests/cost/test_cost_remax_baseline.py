"""ReMax's greedy baseline is a second generation run after the sampled one, on the same engine
(verl: a second ``generate_sequences`` call with do_sample=False), not extra rows of one batch:
priced as one batch it came almost free where decode is bound by memory bandwidth (14.16 s for
256 sampled + 256 greedy against 11.25 s for the 256 sampled alone)."""

from dataclasses import replace

import numpy as np
import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.model import CostModel
from nereus.spec import parse_job


def _job(algo: str, prompts: int, responses: int = 1):
    return parse_job({"model": "llama-3.1-8b", "gpus": 8, "algo": algo,
                      "workload": {"prompts_per_step": prompts, "prompt_len": 512,
                                   "response_len": 1024, "responses_per_prompt": responses,
                                   "ppo_mini_batches": 2}})


def _alone(prompts: int, responses: int, layout: Layout, dp: int):
    """The sampled generation of ``prompts`` x ``responses`` sequences with no baseline."""
    job = _job("remax", prompts, responses)
    job = replace(job, workflow=replace(job.workflow, greedy_baseline=False))
    cm = CostModel(job)
    n = cm.stage_batch("actor_gen")
    return cm.evaluate("actor_gen", [Candidate(layout, dp, n // dp, 1)])


@pytest.mark.parametrize("responses", [1, 2])
@pytest.mark.parametrize("layout,dp", [(Layout(1, 1), 8), (Layout(2, 1), 4), (Layout(2, 2), 2)])
def test_the_greedy_baseline_is_a_second_run_after_the_sampled_one(responses, layout, dp):
    prompts = 256
    cm = CostModel(_job("remax", prompts, responses))
    n = cm.stage_batch("actor_gen")
    assert n == prompts * responses + prompts
    ev = cm.evaluate("actor_gen", [Candidate(layout, dp, n // dp, 1)])
    sampled = _alone(prompts, responses, layout, dp)
    greedy = _alone(prompts, 1, layout, dp)  # one greedy response per prompt
    # in series: the two runs' latencies add up, each with its own prefill and decode
    assert float(ev.latency[0]) == pytest.approx(
        float(sampled.latency[0]) + float(greedy.latency[0]), rel=1e-9)
    # one run's KV cache at a time: the peak is the larger run's (the sampled one), no sum
    assert float(ev.peak[0]) == pytest.approx(float(sampled.peak[0]), rel=1e-12)
    assert float(ev.peak[0]) >= float(greedy.peak[0])
    est = cm.estimate("actor_gen", Candidate(layout, dp, n // dp, 1))
    names = [o.name for o in est.ops]
    assert "greedy baseline: prefill GEMMs" in names and "prefill GEMMs" in names
    assert any("greedy baseline" in note for note in est.notes)


def test_the_reviewers_case_costs_twice_the_sampled_run():
    cm = CostModel(_job("remax", 256))
    ev = cm.evaluate("actor_gen", [Candidate(Layout(1, 1), 8, 64, 1)])
    alone = _alone(256, 1, Layout(1, 1), 8)
    assert float(ev.latency[0]) == pytest.approx(2 * float(alone.latency[0]), rel=1e-9)


def test_other_algorithms_generate_in_one_run():
    for algo, responses in (("ppo", 1), ("grpo", 4)):
        cm = CostModel(_job(algo, 64, responses))
        n = cm.stage_batch("actor_gen")
        assert n == 64 * responses
        est = cm.estimate("actor_gen", Candidate(Layout(1, 1), 8, n // 8, 1))
        assert not any("greedy" in o.name for o in est.ops)
        assert not any("greedy" in note for note in est.notes)
        assert np.isfinite(est.latency_s) and est.latency_s > 0
