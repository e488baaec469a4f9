import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Candidate, Layout
from nereus.plan.candidates import (
    PAIRWISE_ROWS,
    StageOptions,
    _dominated,
    dominance_mask,
    pareto_mask,
)
from nereus.plan.search import _fastest_within
from nereus.spec import parse_job


def naive(m: np.ndarray) -> np.ndarray:
    keep = np.ones(len(m), dtype=bool)
    for i in range(len(m)):
        for j in range(len(m)):
            if j != i and np.all(m[j] <= m[i]) and (np.any(m[j] < m[i]) or j < i):
                keep[i] = False
                break
    return keep


@given(st.integers(0, 10_000), st.integers(1, 200), st.integers(1, 4), st.integers(1, 70))
@settings(max_examples=60)
def test_blocked_pareto_equals_pairwise_definition(seed, n, k, block):
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 6, size=(n, k)).astype(float)  # many ties and equal rows
    got = pareto_mask([m[:, c] for c in range(k)], block=block)
    assert np.array_equal(got, naive(m))


@given(st.integers(0, 10_000), st.integers(1, 300), st.integers(1, 12))
@settings(max_examples=40)
def test_grouped_dominance_equals_one_pareto_mask_per_group(seed, n, groups):
    """``dominance_mask``'s one pass over every layout group keeps what ``pareto_mask`` keeps
    within each group."""
    rng = np.random.default_rng(seed)
    m = rng.integers(0, 5, size=(n, 4)).astype(float)
    m[rng.random(n) < 0.05, 1] = np.nan  # never dominates, never dominated
    label = rng.integers(0, groups, size=n)
    want = np.zeros(n, dtype=bool)
    for g in np.unique(label):
        idx = np.flatnonzero(label == g)
        want[idx[pareto_mask([m[idx, c] for c in range(4)])]] = True
    assert np.array_equal(~_dominated(m, label), want)


@given(st.integers(0, 10_000), st.integers(PAIRWISE_ROWS + 1, 3 * PAIRWISE_ROWS), st.booleans())
@settings(max_examples=20, deadline=None)
def test_dominance_over_many_candidates_equals_one_pareto_set_per_group(seed, n, by_gpus):
    """Past PAIRWISE_ROWS candidates, ``dominance_mask`` packs whole layout groups into
    passes of at most that many rows, and a larger group goes through ``pareto_mask`` alone:
    either way it keeps what each group's own pairwise pass keeps, ties included."""
    rng = np.random.default_rng(seed)
    layouts = [Layout(1, 1), Layout(2, 1), Layout(1, 2), Layout(4, 2), Layout(8, 1)]
    # most rows on one layout: from about 370 rows its group no longer fits one pass, and it
    # comes after two groups that share one (the first two rows are theirs)
    lay = rng.choice(len(layouts), n, p=[0.1, 0.1, 0.7, 0.05, 0.05])
    lay[:2] = [0, 1]
    cands = tuple(Candidate(layouts[k], int(dp), 1, 1)
                  for k, dp in zip(lay, rng.choice([1, 2, 3, 4], n)))
    gpus = np.array([c.gpus for c in cands])
    m = rng.integers(0, 5, size=(n, 3)).astype(float)  # many ties and equal rows
    opts = StageOptions(STAGE, cands, gpus, m[:, 0], m[:, 1], m[:, 2])
    key = [(c.layout, c.gpus) if by_gpus else c.layout for c in cands]
    want = np.zeros(n, dtype=bool)
    for k in set(key):
        idx = np.flatnonzero([x == k for x in key])
        want[idx] = ~_dominated(np.column_stack([gpus[idx], m[idx]]).astype(float))
    assert np.array_equal(dominance_mask(opts, by_layout=True, by_gpus=by_gpus), want)


STAGE = parse_job({"model": "tiny-llama", "algo": "ppo", "gpus": 1,
                   "cluster": {"device": "cpu"}}).workflow.stages[0]


@given(st.integers(0, 10_000), st.integers(1, 60))
@settings(max_examples=60)
def test_fastest_within_each_gpu_count_is_the_masked_argmin(seed, n):
    """``group_points`` reads each member's fastest option on at most ``c`` GPUs from one
    sort; it must pick what a masked ``np.argmin`` picks, ties (the first) included."""
    rng = np.random.default_rng(seed)
    gpus = rng.choice([1, 2, 3, 4, 8, 16], n)
    lat = rng.integers(0, 4, n).astype(float)  # many equal latencies
    counts, fastest = _fastest_within(lat, gpus)
    assert counts == sorted(set(gpus.tolist()))
    for c, i in zip(counts, fastest):
        assert i == int(np.argmin(np.where(gpus <= c, lat, np.inf)))
