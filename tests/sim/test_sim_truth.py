"""The simulator's ground truth prices a plan the same whatever it priced before (simulated)."""

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
