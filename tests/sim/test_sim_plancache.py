"""The simulator's plan cache: reuse is weighed by each op class's share of the plan's time."""

import math

import pytest

from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.sim.plancache import MAJOR_SHARE, PlanCache, time_shares
from nereus.sim.scenarios import builtin

BASE = {OpClass.GEMM: 0.55, OpClass.ATTENTION: 0.40, OpClass.DECODE: 0.70,
        OpClass.OPTIMIZER: 0.65, OpClass.ALLREDUCE_INTRA: 0.75, OpClass.P2P_INTRA: 0.70}


@pytest.fixture(scope="module")
def setup():
    job = builtin("default", steps=10).job
    eff = Efficiencies(BASE, device=job.cluster.device.name)
    cache = PlanCache()
    plan = cache(job, CostModel(job, eff))
    shares = time_shares(CostModel(job, eff), plan)
    return job, eff, cache, plan, shares


def moved(eff: Efficiencies, cls: OpClass, factor: float) -> Efficiencies:
    return eff.updated({cls: eff[cls] * factor})


def test_time_shares_sum_to_one_and_gemm_leads(setup):
    _, _, _, _, shares = setup
    assert math.isclose(sum(shares.values()), 1.0)
    assert max(shares, key=shares.get) is OpClass.GEMM


def test_same_efficiencies_reuse_the_plan(setup):
    job, eff, cache, plan, _ = setup
    before = cache.searches
    assert cache(job, CostModel(job, eff)) is plan
    assert cache.searches == before


def test_a_major_class_moving_past_the_grid_searches_again(setup):
    job, eff, cache, _, shares = setup
    assert shares[OpClass.GEMM] >= MAJOR_SHARE
    before = cache.searches
    cache(job, CostModel(job, moved(eff, OpClass.GEMM, 1.06)))
    assert cache.searches == before + 1


def test_a_minor_class_may_move_further_in_proportion_to_its_share(setup):
    job, eff, cache, plan, shares = setup
    minor = min((c for c in BASE if 0 < shares.get(c, 0.0) < MAJOR_SHARE / 4),
                key=lambda c: shares[c])
    allowed = math.log(1.05) * MAJOR_SHARE / max(shares[minor], MAJOR_SHARE / 10)
    before = cache.searches
    assert cache(job, CostModel(job, moved(eff, minor, math.exp(0.9 * allowed)))) is plan
    assert cache.searches == before
    cache(job, CostModel(job, moved(eff, minor, math.exp(1.1 * allowed))))
    assert cache.searches == before + 1


def test_another_length_bucket_searches_again(setup):
    job, eff, cache, _, _ = setup
    w = job.workload
    longer = job.with_workload(w.with_response_len(w.response_len_mean * 2,
                                                   w.response_len_max * 2))
    before = cache.searches
    cache(longer, CostModel(longer, eff))
    assert cache.searches == before + 1


def test_the_spread_plan_a_packed_search_weighed_answers_the_spread_question():
    """The packed search of the 16-GPU job weighs the spread plan on the way (its sync
    crosses nodes); the controller then asks for the spread plan itself, where the packed one
    is exposed to node loss. That answer is kept, not searched again, and it is the plan a
    spread search gives."""
    job = builtin("default", steps=10).job
    cost = CostModel(job, Efficiencies(BASE, device=job.cluster.device.name))
    cache = PlanCache()
    cache(job, cost)
    searched = cache.searches
    spread = cache(job, cost, True)
    assert cache.searches == searched and cache.hits == 1
    fresh = PlanCache()
    assert spread == fresh(job, cost, True) and fresh.searches == 1


def test_a_larger_memory_scale_that_rounds_alike_gets_a_plan_that_fits_it():
    """The key holds the memory scale to two decimals, and 0.9951 and 1.0049 round alike; the
    plan searched under the first fills the device within 1 % (4 GPUs, both lengths at their
    buckets' edges), so under the second it is over the limit while another plan fits. The
    cache once returned it anyway: the controller then found no plan for the pool."""
    from nereus.control.targets import reprice
    from nereus.sim.plancache import bucket, edge
    from nereus.spec import GpuPool
    from nereus.spec.workflow import StageKind

    base = builtin("default", steps=10).job
    b = bucket(1157)
    job = base.with_pool(GpuPool(base.cluster, (0, 1, 2, 3))).with_workload(
        base.workload.with_response_len(edge(b - 7), edge(b)))
    lo = CostModel(job, None, dict.fromkeys(StageKind, 0.9951))
    hi = CostModel(job, None, dict.fromkeys(StageKind, 1.0049))
    cache = PlanCache()
    first = cache(job, lo)
    assert not reprice(job, hi, first).fits  # the case: the plan searched under lo
    assert reprice(job, hi, cache(job, hi)).fits
    assert cache(job, lo) is first  # a scale no larger still gets the cached plan
