import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.plan.candidates import _dominated, pareto_mask
from nereus.plan.search import _fastest_within


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
