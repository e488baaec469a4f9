"""Sampling noise is a function of (seed, sequence index, step) alone; top-p and temperature
select from the full-vocabulary distribution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.engine.sampling import SamplingParams, sample, uniform
from nereus.errors import InputError


def test_uniform_is_pure_and_spread() -> None:
    draws = [uniform(3, i, s) for i in range(50) for s in range(20)]
    assert draws == [uniform(3, i, s) for i in range(50) for s in range(20)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert 0.45 < sum(draws) / len(draws) < 0.55
    assert uniform(3, 1, 2) != uniform(4, 1, 2) != uniform(3, 2, 1)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(n=st.integers(2, 6), v=st.integers(2, 40), step=st.integers(0, 100),
       seed=st.integers(0, 2**31), top_p=st.floats(0.05, 1.0))
def test_a_row_does_not_depend_on_its_batch(n: int, v: int, step: int, seed: int,
                                            top_p: float) -> None:
    """What a sequence draws depends on its own logits and index, not on the other rows or
    on where it sits in the batch (so DP splits and micro-batches do not change it)."""
    g = torch.Generator().manual_seed(seed % 1000)
    logits = torch.randn(n, v, generator=g)
    index = torch.randperm(1000, generator=g)[:n]
    sp = SamplingParams(seed=seed, top_p=top_p)
    together = sample(logits, index, step, sp)
    perm = torch.randperm(n, generator=g)
    shuffled = sample(logits[perm], index[perm], step, sp)
    assert torch.equal(shuffled, together[perm])
    alone = torch.stack([sample(logits[i:i + 1], index[i:i + 1], step, sp)[0]
                         for i in range(n)])
    assert torch.equal(alone, together)


def test_top_p_keeps_the_nucleus_only() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sp = SamplingParams(top_p=0.7, seed=1)
    seen = {int(sample(logits, torch.tensor([i]), 0, sp)[0]) for i in range(300)}
    assert seen == {0, 1}


def test_frequencies_follow_the_distribution() -> None:
    p = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(p)[None].expand(4000, 3)
    toks = sample(logits, torch.arange(4000), 7, SamplingParams(seed=2))
    freq = torch.bincount(toks, minlength=3).double() / 4000
    torch.testing.assert_close(freq, p.double(), atol=0.03, rtol=0)


def test_temperature_zero_is_greedy_and_low_temperature_sharpens() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 2.9]])
    assert sample(logits, torch.arange(2), 0, SamplingParams(temperature=0.0)).tolist() == [1, 0]
    cold = SamplingParams(temperature=0.05, seed=9)
    toks = [sample(logits[:1], torch.tensor([i]), 0, cold)[0].item() for i in range(100)]
    assert set(toks) == {1}


def test_padding_columns_are_never_drawn() -> None:
    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]]).expand(500, 4)
    toks = sample(logits, torch.arange(500), 3, SamplingParams(seed=4, top_p=0.99))
    assert int(toks.max()) <= 1


@pytest.mark.parametrize("field,kwargs", [("max_new_tokens", {"max_new_tokens": 0}),
                                          ("temperature", {"temperature": -1.0}),
                                          ("top_p", {"top_p": 0.0})])
def test_bad_sampling_names_the_field(field: str, kwargs: dict) -> None:
    with pytest.raises(InputError, match=f"sampling.{field}"):
        SamplingParams(**kwargs)
