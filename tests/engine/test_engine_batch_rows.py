"""How a global batch splits over DP replicas (``batch.replica_rows``)."""

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.engine.batch import replica_rows
from nereus.errors import InputError


def test_an_uneven_split_gives_the_first_replicas_one_row_more():
    assert [replica_rows(512, 3, d, uneven=True) for d in range(3)] == [
        (0, 171), (171, 342), (342, 512)]
    assert [replica_rows(10, 4, d, uneven=True) for d in range(4)] == [
        (0, 3), (3, 6), (6, 8), (8, 10)]


def test_training_keeps_equal_shares():
    assert [replica_rows(8, 4, d) for d in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(InputError, match="10 sequences do not split over dp=4") as e:
        replica_rows(10, 4, 0)
    assert e.value.field == "batch" and e.value.allowed == "a multiple of 4"
    with pytest.raises(InputError) as e:  # more replicas than rows leaves one without any
        replica_rows(2, 3, 0, uneven=True)
    assert e.value.field == "batch"


@given(st.integers(1, 2000), st.data())
def test_the_blocks_tile_the_batch_in_rank_order(n, data):
    dp = data.draw(st.integers(1, n))
    rows = [replica_rows(n, dp, d, uneven=True) for d in range(dp)]
    assert rows[0][0] == 0 and rows[-1][1] == n
    assert all(a[1] == b[0] for a, b in pairwise(rows))
    sizes = [stop - start for start, stop in rows]
    assert max(sizes) == -(-n // dp) and min(sizes) == n // dp
    assert sizes == sorted(sizes, reverse=True)
    if n % dp == 0:
        assert rows == [replica_rows(n, dp, d) for d in range(dp)]
