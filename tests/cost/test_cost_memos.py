"""The memos cost models share (``nereus.cost.model``): what they serve equals what a cold
cost model computes, to the bit, whatever else was priced before."""

import itertools

import numpy as np
import pytest

from nereus.cost import model
from nereus.cost.calibrate import Calibrator
from nereus.cost.efficiency import Efficiencies, peak_bound
from nereus.cost.model import CostModel
from nereus.cost.ops import OpClass
from nereus.plan.search import best_plan
from nereus.plan.types import stage_estimate, stage_links, weight_sync_estimate
from nereus.spec import parse_job
from nereus.spec.workflow import StageKind


def job(mean=2048, longest=2048, gpus=16):
    return parse_job({"model": "llama-3.1-8b", "algo": "ppo", "gpus": gpus,
                      "workload": {"response_len": mean, "response_len_max": longest}})


def _forget() -> None:
    for memo in (model._IDEAL, model._ROWS, model._PARTS, model._SYNC):
        memo._items.clear()
        memo.size = 0
    model._read_links.cache_clear()


def _same(a, b) -> None:
    assert a.ops == b.ops and dict(a.memory) == dict(b.memory) and a.notes == b.notes
    assert a.resident_bytes == b.resident_bytes and a.latency_s == b.latency_s


EFFS = [Efficiencies(), Efficiencies({OpClass.GEMM: 0.61, OpClass.DECODE: 0.4,
                                      OpClass.ALLREDUCE_INTER: 0.33})]


@pytest.fixture(scope="module")
def plans():
    j = job(gpus=24)
    return j, best_plan(j), best_plan(j, spread=True)


def test_estimates_served_by_the_memos_equal_cold_ones(plans):
    """Jobs that differ only in the longest response share training and forward ops; every
    job, scale and efficiency pair is priced warm (after the others) and cold."""
    base, packed, spread = plans
    cases = [(base.with_workload(base.workload.with_response_len(mean, longest)), eff, scale)
             for mean, longest in ((1000, 1500), (1000, 4000), (3000, 3000))
             for eff in EFFS for scale in ({}, {StageKind.TRAIN: 1.2})]
    warm = []
    for j, eff, scale in cases:
        cost = CostModel(j, eff, scale)
        warm.append([(stage_estimate(cost, p, sp.stage),
                      weight_sync_estimate(cost, p.stage("actor_train"), p.stage("actor_gen")))
                     for p in (packed, spread) for sp in p.stages])
    for (j, eff, scale), got in zip(cases, warm):
        _forget()
        cost = CostModel(j, eff, scale)
        cold = [(stage_estimate(cost, p, sp.stage),
                 weight_sync_estimate(cost, p.stage("actor_train"), p.stage("actor_gen")))
                for p in (packed, spread) for sp in p.stages]
        for (a, sa), (b, sb) in zip(got, cold):
            _same(a, b)
            _same(sa, sb)


def test_a_placement_priced_as_sized_has_the_node_aligned_ops(plans):
    """``priced_as_sized`` holds exactly where a stage's estimate on its GPU ids has the ops
    of the estimate without them (the spread plan's training replicas sync across nodes)."""
    base, packed, spread = plans
    cost = CostModel(base)
    seen = set()
    for p in (packed, spread):
        for sp in p.stages:
            links = stage_links(cost, sp)
            placed = cost.estimate(sp.stage, sp.candidate, 0, links)
            sized = cost.estimate(sp.stage, sp.candidate, 0)
            same = cost.priced_as_sized(sp.stage, sp.candidate, links)
            seen.add(same)
            assert same == (placed.ops == sized.ops)
            if same:
                assert placed.latency_s == sized.latency_s
    assert seen == {True, False}


def test_link_keys_of_unused_groups_do_not_split_the_rows():
    """A forward stage runs no gradient all-reduce: where its replicas sit does not change
    its ops, so its placements across nodes share one evaluation."""
    j = job()
    cost = CostModel(j)
    plan = best_plan(j)
    sp = next(s for s in plan.stages if s.stage == "reference_infer")
    links = [cost.placed_links(sp.layout, reps)
             for reps in itertools.islice(itertools.permutations(sp.replicas), 4)]
    keys = {cost._link_key(j.workflow.stage(sp.stage), sp.candidate, lk) for lk in links}
    assert keys == {cost._link_key(j.workflow.stage(sp.stage), sp.candidate, None)}


def test_tokens_tell_jobs_apart_and_are_never_reused():
    a, b = job(1000, 1000), job(1000, 2000)
    ta, tb = model._token(a), model._token(b)
    assert ta != tb and model._token(job(1000, 1000)) == ta
    fresh = [model._token(job(1000 + i, 1000 + i)) for i in range(1, 4)]
    assert len(set(fresh) | {ta, tb}) == 5


def _reference_fit(cal: Calibrator) -> Efficiencies:
    """The fit as it was written before its rows were stacked as arrays: row by row."""
    rows = cal._rows
    classes = sorted({c for r in rows for c in r.ideal}, key=lambda c: c.value)
    x0 = np.array([1.0 / cal.prior[c] for c in classes])
    a_rows, b_rows = [], []
    for r in rows:
        w = np.sqrt(cal.forgetting ** (cal._step - r.step)) / r.measured_s
        a_rows.append([r.ideal.get(c, 0.0) * w for c in classes])
        b_rows.append(r.measured_s * w)
    a, b = np.array(a_rows), np.array(b_rows)
    seen = np.array([sum(1 for r in rows if c in r.ideal) for c in classes])
    lam = np.diag(np.sqrt(np.maximum(cal.ridge / (1.0 + seen), cal.ridge_floor)) / x0)
    x, *_ = np.linalg.lstsq(np.vstack([a, lam]), np.concatenate([b, lam @ x0]), rcond=None)
    low = np.array([max(1e-3, 1.0 / peak_bound(c, cal.prior.device)) for c in classes])
    x = np.clip(x, low, 1e6)
    return cal.prior.updated({c: float(1.0 / xi) for c, xi in zip(classes, x)})


def test_the_stacked_fit_equals_the_row_by_row_one():
    rng = np.random.default_rng(3)
    classes = [OpClass.GEMM, OpClass.ATTENTION, OpClass.DECODE, OpClass.ALLREDUCE_INTRA]
    cal = Calibrator()
    for step in range(40):
        for _ in range(3):
            picked = rng.choice(len(classes), size=int(rng.integers(1, 4)), replace=False)
            cal.observe_ideal({classes[i]: float(rng.uniform(0.1, 2.0)) for i in picked},
                              float(rng.uniform(0.5, 5.0)))
        if step == 20:
            cal.observe_op(OpClass.P2P_INTRA, 0.2, 0.5)  # a new class: the columns change
        assert cal.efficiencies().values == _reference_fit(cal).values
        cal.next_step()
