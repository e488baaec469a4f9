"""The simulator's ground truth prices a plan the same whatever it priced before, and draws its
noise from (seed, step, stage) alone (simulated)."""

import pytest

from nereus.cost.efficiency import Efficiencies
from nereus.plan.search import best_plan
from nereus.sim.scenarios import DEFAULT_JOB, HIDDEN_EFFICIENCY
from nereus.sim.traces import DriftTrace
from nereus.sim.truth import Truth
from nereus.spec.job import parse_job


def test_a_cached_cost_model_is_not_reused_for_a_pool_that_spans_more_nodes():
    """Asynchronous weight sync crosses the network unless the whole pool sits in one node, so
    a pool of 8 GPUs in one node and one of 9 over two nodes (both 8 in their largest node)
    price it differently; the truth's model cache must not hand one the other's model."""
    job = parse_job({**DEFAULT_JOB, "execution": "async"})
    eff = Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name)
    one, two = tuple(range(8)), tuple(range(9))
    warm = Truth(job, eff, DriftTrace(), 0.0)
    plan = best_plan(warm.job_at(one, 1000, 1500), eff)
    alone = warm.price(plan, one, 0, 1000, 1500)
    after = warm.price(plan, two, 0, 1000, 1500)
    fresh = Truth(job, eff, DriftTrace(), 0.0).price(plan, two, 0, 1000, 1500)
    assert after == fresh
    assert fresh.sync_s > alone.sync_s  # over the network, not NVLink


def test_the_truth_prices_the_weight_sync_as_placed_on_each_pool():
    """A synchronous sync into generation GPUs beyond training's is priced by where they sit:
    on a node with training GPUs (NVLink) or not (network). Pools of 12 with 4 and 8 GPUs per
    node and with 4, 4 and 4 both span nodes and keep every 4-GPU replica inside one, yet 12
    generation GPUs laid over 8 training ones all share training's nodes in the first and not
    in the second: the truth's model cache must tell the pools apart, and price the plan's GPU
    ids."""
    from nereus.cost.model import CostModel
    from nereus.plan.evaluate import StageLayoutSpec, evaluate_plan
    from nereus.plan.types import weight_sync_estimate

    workload = {**DEFAULT_JOB["workload"], "prompts_per_step": 768}  # DP 3 divides the batch
    job = parse_job({**DEFAULT_JOB, "gpus": 32, "workload": workload})
    eff = Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name)
    even = (*range(4), *range(8, 16))
    ragged = (*range(4), *range(8, 12), *range(16, 20))
    truth = Truth(job, eff, DriftTrace(), 0.0)
    wide, narrow = StageLayoutSpec(4, 1, 3), StageLayoutSpec(4, 1, 2)
    specs = {s.name: narrow if s.phase.value == "training" else wide
             for s in job.workflow.stages}
    got = []
    for pool in (even, ragged):
        at = truth.job_at(pool, 1000, 1500)
        cost = CostModel(at, eff)
        plan = evaluate_plan(at, specs, cost)
        got.append(truth.price(plan, pool, 0, 1000, 1500))
        t, g = plan.stage("actor_train"), plan.stage("actor_gen")
        rec = cost.placed_sync_receivers(t.replicas, g.replicas)
        assert rec is not None and sum(rec) == 12 and rec.colocated == 8
        assert got[-1].sync_s == weight_sync_estimate(cost, t, g).latency_s
    first, second = got
    assert second.sync_s > first.sync_s  # 1 of the 4 extra GPUs receives over the network


def test_a_weight_sync_the_gpus_cannot_hold_does_not_fit_the_truth(monkeypatch):
    """The simulated device runs out of memory during the sync, not only in a stage's peak."""
    from nereus.cost.model import CostModel

    job = parse_job(DEFAULT_JOB)
    eff = Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name)
    pool = tuple(range(16))
    truth = Truth(job, eff, DriftTrace(), 0.0)
    plan = best_plan(truth.job_at(pool, 1000, 1500), eff)
    got = truth.price(plan, pool, 0, 1000, 1500)
    assert truth.fits(got) and 0 < got.sync_peak_bytes < job.cluster.device.memory_bytes
    real = CostModel.weight_sync_memory
    monkeypatch.setattr(CostModel, "weight_sync_memory",
                        lambda self, t, g: {**real(self, t, g), "gather buffer": 2**40})
    over = Truth(job, eff, DriftTrace(), 0.0).price(plan, pool, 0, 1000, 1500)
    assert over.peak_bytes == got.peak_bytes and not truth.fits(over)


def _noisy(noise, seed=0):
    job = parse_job(DEFAULT_JOB)
    eff = Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name)
    return Truth(job, eff, DriftTrace(), noise, seed)


def test_with_noise_a_plans_stage_times_differ_from_step_to_step():
    """Every stage of a plan run at the same lengths takes its noise-free time times
    exp(N(0, σ)), a new draw each step: the times differ between steps, within a few σ of the
    noise-free time, and their log-ratios spread by about σ."""
    import math

    import numpy as np

    quiet, noisy = _noisy(0.0), _noisy(0.05)
    pool = tuple(range(16))
    plan = best_plan(quiet.job_at(pool, 1000, 1500), quiet.hidden)
    base = quiet.price(plan, pool, 0, 1000, 1500)
    logs = {s: [] for s in base.stage_s}
    for k in range(40):
        stage = quiet.run_step(plan, pool, k, 1000, 1500)[1]
        assert stage == dict(base.stage_s)  # no noise: the same every step
        stage = noisy.run_step(plan, pool, k, 1000, 1500)[1]
        for s, v in stage.items():
            logs[s].append(math.log(v / base.stage_s[s]))
    for s, xs in logs.items():
        assert len(set(xs)) == len(xs), s
        assert max(abs(x) for x in xs) < 5 * 0.05, s
        assert 0.03 < float(np.std(xs)) < 0.07, s
    # the stages of one step draw apart: a stage is not one step-wide factor
    assert len({round(v[0], 12) for v in logs.values()}) == len(logs)


def test_the_noise_is_drawn_from_seed_step_and_stage_alone():
    """Two policies running plans side by side must meet the same noise on the same stage of
    the same step, whatever either priced before: the factor comes from (seed, step, stage),
    not from a stream the calls share. Another seed draws other noise."""
    one, two, other = _noisy(0.05, seed=3), _noisy(0.05, seed=3), _noisy(0.05, seed=4)
    pool = tuple(range(16))
    plan = best_plan(one.job_at(pool, 1000, 1500), one.hidden)
    small = best_plan(one.job_at(tuple(range(8)), 1000, 1500), one.hidden)
    forward = [one.run_step(plan, pool, k, 1000, 1500)[1] for k in range(5)]
    two.run_step(small, tuple(range(8)), 2, 1000, 1500)  # another plan priced first
    backward = [two.run_step(plan, pool, k, 1000, 1500)[1] for k in reversed(range(5))]
    assert forward == backward[::-1]
    assert other.run_step(plan, pool, 0, 1000, 1500)[1] != forward[0]
    # a stage's factor is the same whatever plan runs it
    for k in range(5):
        a = one.run_step(small, tuple(range(8)), k, 1000, 1500)[1]
        q = one.price(small, tuple(range(8)), k, 1000, 1500).stage_s
        for s, v in a.items():
            assert v == q[s] * one.factor(k, s)
            assert forward[k][s] / one.price(plan, pool, k, 1000, 1500).stage_s[s] \
                == pytest.approx(one.factor(k, s), rel=1e-12)
