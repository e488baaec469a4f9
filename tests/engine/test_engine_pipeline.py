"""The 1F1B order: every micro-batch forward then backward once, at most pp - pp_rank in flight
on a block, and an order in which no block waits on a message that is never sent."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.engine.pipeline import one_f_one_b


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 12), pp=st.sampled_from([1, 2, 4, 8]))
def test_one_f_one_b_bounds_in_flight_micro_batches(n: int, pp: int) -> None:
    for rank in range(pp):
        order = one_f_one_b(n, pp, rank)
        assert sorted(i for op, i in order if op == "F") == list(range(n))
        assert [i for op, i in order if op == "B"] == list(range(n))
        live = peak = 0
        for op, i in order:
            if op == "F":
                live += 1
            else:
                assert ("F", i) in order[:order.index(("B", i))]
                live -= 1
            peak = max(peak, live)
        assert peak <= min(n, pp - rank)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(n=st.integers(1, 10), pp=st.sampled_from([2, 4, 8]))
def test_one_f_one_b_runs_to_completion_with_blocking_receives(n: int, pp: int) -> None:
    """Simulate blocks that send asynchronously and receive blocking: all finish."""
    orders = [one_f_one_b(n, pp, r) for r in range(pp)]
    done: set[tuple[str, int, int]] = set()   # (op, micro, rank) finished
    pos = [0] * pp
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            if pos[r] == len(orders[r]):
                continue
            op, i = orders[r][pos[r]]
            ready = (op == "F" and (r == 0 or ("F", i, r - 1) in done)) or \
                    (op == "B" and (r == pp - 1 or ("B", i, r + 1) in done))
            if ready:
                done.add((op, i, r))
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(orders[r]) for r in range(pp))
