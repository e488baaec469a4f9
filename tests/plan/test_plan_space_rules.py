"""Checks a mutation audit of ``nereus.plan`` found missing: each fails on a small deliberate
change of the planner that the other plan tests let through, against values derived by hand.
Several guard rules the search and the brute force share (``enumerate_candidates``), which a
search-vs-brute-force comparison cannot see."""

from dataclasses import replace

import pytest

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel
from nereus.plan.candidates import enumerate_candidates
from nereus.plan.evaluate import evaluate_plan, layout_spec_from_data
from nereus.plan.frameworks import verl_keep
from nereus.plan.search import GroupChoice, Planner, Point, SearchResult
from nereus.spec import parse_job
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import Phase, StageKind


def _mha12_job(devices_per_node: int):
    """A 12-layer model of 12 attention heads and 12 KV heads (no grouped-query attention):
    TP 3 and 6 shard it, as do PP 3 and 6, but none of them is a power of two."""
    job = parse_job({"model": "small-llama", "gpus": 16,
                     "cluster": {"devices_per_node": devices_per_node}})
    model = replace(job.model, name="mha-12", hidden_size=768, num_heads=12, num_kv_heads=12,
                    head_dim=64, intermediate_size=3072, num_layers=12)
    return replace(job, model=model)


@pytest.mark.parametrize("devices_per_node", [8, 6])
def test_tp_and_pp_are_powers_of_two_and_tp_stays_inside_a_node(devices_per_node):
    job = _mha12_job(devices_per_node)
    assert all(layout_problem(job.model, d, 1) is None for d in (3, 6))  # they do shard it
    assert all(layout_problem(job.model, 1, d) is None for d in (3, 6))
    cost = CostModel(job)
    for st in job.workflow.stages:
        cands = enumerate_candidates(cost, st, job.pool.size)
        # powers of two that divide 12 heads (and fit a node of 6 or 8): 1, 2, 4; powers of
        # two that divide 12 layers: 1, 2, 4
        assert {c.tp for c in cands} == {1, 2, 4}, st.name
        assert {c.pp for c in cands} == {1, 2, 4}, st.name


def test_verl_rollout_runs_without_a_pipeline():
    """verl's rollout takes its TP alone (PP = 1); its other stages take Megatron's PP."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "execution": "sync", "gpus": 16,
                     "workload": {"response_len": 4096, "prompts_per_step": 512}})
    keep = verl_keep(job)
    gen = job.workflow.stage("actor_gen")
    train = job.workflow.stage("actor_train")
    assert gen.kind is StageKind.GENERATE
    batch = CostModel(job).stage_batch(gen)
    assert batch % 4 == 0
    # 16 GPUs each, dp 4 dividing the batch: only the pipeline differs
    assert keep(gen, Candidate(Layout(4, 1), 4, batch // 4, 1))
    assert not keep(gen, Candidate(Layout(2, 2), 4, batch // 4, 1))
    tb = CostModel(job).stage_batch(train)
    assert keep(train, Candidate(Layout(2, 2), 4, 1, tb // 4))


def test_evaluate_completes_a_layout_with_its_fastest_fitting_micro_batch_and_recompute():
    """Without micro_batch and recompute, a training stage takes the fastest of the choices
    that fit memory: no slower than any of them scored one at a time."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
                     "workload": {"response_len": 4096}})
    layout = {"actor_gen": {"tp": 2, "pp": 1, "dp": 8},
              "reference_infer": {"tp": 1, "pp": 1, "dp": 16},
              "reward_infer": {"tp": 1, "pp": 1, "dp": 16},
              "critic_infer": {"tp": 1, "pp": 1, "dp": 16},
              "actor_train": {"tp": 4, "pp": 2, "dp": 2},
              "critic_train": {"tp": 4, "pp": 2, "dp": 2}}
    free = evaluate_plan(job, layout_spec_from_data(layout)).stage("actor_train")
    cap = HEADROOM * job.cluster.device.memory_bytes
    per = CostModel(job).stage_batch(job.workflow.stage("actor_train")) // 2
    seen = []
    for b in (1, 2, 4, 8, 16):
        if per % b:
            continue
        for rc in (False, True):
            fixed = {**layout, "actor_train": {**layout["actor_train"], "micro_batch": b,
                                               "recompute": rc}}
            sp = evaluate_plan(job, layout_spec_from_data(fixed)).stage("actor_train")
            if sp.peak_mem_bytes <= cap:
                seen.append(sp.latency_s)
    assert len(set(seen)) > 1  # the choice matters
    assert free.peak_mem_bytes <= cap
    assert free.latency_s == min(seen)


def _point(gpus: int, name: str) -> Point:
    c = Candidate(Layout(1, 1), gpus, 1, 1)
    return Point(gpus, 1.0, (GroupChoice((name,), (c,), (1.0,)),))


def test_asynchronous_generation_fits_beside_the_larger_of_inference_and_training():
    """Asynchronous generation holds GPUs of its own; inference and training take turns on
    the rest: generation + max(inference, training) <= the pool (16 here)."""
    job = parse_job({"model": "llama-3.1-8b", "algo": "remax", "execution": "async",
                     "gpus": 16, "workload": {"response_len": 2048}})
    planner = Planner(job)
    res = SearchResult(1.0, {Phase.GENERATION: _point(8, "actor_gen"),
                             Phase.INFERENCE: _point(4, "reference_infer"),
                             Phase.TRAINING: _point(8, "actor_train")}, 0.0, None)
    assert planner._fits(res, Phase.TRAINING, 8)        # 8 + max(4, 8) = 16
    assert planner._fits(res, Phase.INFERENCE, 8)       # 8 + max(8, 8) = 16
    assert not planner._fits(res, Phase.TRAINING, 9)    # 8 + 9 = 17
    assert not planner._fits(res, Phase.GENERATION, 9)  # 9 + 8 = 17
    assert planner._fits(res, Phase.GENERATION, 4)
