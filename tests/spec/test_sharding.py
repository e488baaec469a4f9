"""The sharding format: shards tile each logical tensor; layouts nest (Split/Merge stay local)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.errors import InputError
from nereus.spec import MODEL_PRESETS, Head
from nereus.spec.sharding import (
    LM_HEAD,
    check_layout,
    layout_problem,
    layout_sizes,
    logical_params,
    padded_vocab,
    shard_plan,
)

MODELS = ["tiny-llama", "tiny-qwen3"]


def layouts(model):
    m = MODEL_PRESETS[model]
    return [(tp, pp) for tp, pp in itertools.product((1, 2, 4, 8), (1, 2, 4))
            if layout_problem(m, tp, pp) is None]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("head", [Head.LM, Head.SCALAR])
def test_shards_cover_every_logical_element(model, head):
    m = MODEL_PRESETS[model]
    for tp, pp in layouts(model):
        covered = {p.name: np.zeros(p.shape[p.split_dim] if p.split_dim is not None else 1, bool)
                   for p in logical_params(m, head)}
        for t, r in itertools.product(range(tp), range(pp)):
            for s in shard_plan(m, head, tp, pp, t, r):
                if s.split_dim is None:
                    covered[s.logical][:] = True
                else:
                    covered[s.logical][s.start:s.start + s.valid_len] = True
        assert all(v.all() for v in covered.values()), (tp, pp)


@given(st.sampled_from(MODELS), st.data())
@settings(max_examples=40)
def test_sub_layout_shards_contain_the_layout_shards(model, data):
    """Under the contracts' nesting map, a T_sub position holds every T shard it becomes."""
    m = MODEL_PRESETS[model]
    tp, pp = data.draw(st.sampled_from(layouts(model)))
    subs = [(a, b) for a, b in layouts(model) if tp % a == 0 and pp % b == 0]
    tps, pps = data.draw(st.sampled_from(subs))
    mt, mp = tp // tps, pp // pps
    for t, r in itertools.product(range(tp), range(pp)):
        sub = {s.logical: s for s in shard_plan(m, Head.LM, tps, pps, t // mt, r // mp)}
        for s in shard_plan(m, Head.LM, tp, pp, t, r):
            owner = sub[s.logical]
            if s.split_dim is not None:
                assert owner.start <= s.start and s.stop <= owner.stop, (s, owner)


def test_vocab_padding_and_tied_copy_on_last_block():
    m = MODEL_PRESETS["tiny-qwen3"]  # vocab 250, tied embeddings
    assert padded_vocab(m, 4) == 256
    last = shard_plan(m, Head.LM, 2, 2, 1, 1)
    assert any(s.name == LM_HEAD and s.logical == "model.embed_tokens.weight" for s in last)
    assert not any(s.name == LM_HEAD for s in shard_plan(m, Head.LM, 2, 1, 0, 0))


def test_kv_heads_replicate_beyond_their_count():
    m = MODEL_PRESETS["tiny-llama"]  # 2 KV heads
    ks = [next(s for s in shard_plan(m, Head.LM, 4, 1, t, 0)
               if s.name.endswith("0.self_attn.k_proj.weight"))
          for t in range(4)]
    assert [k.start for k in ks] == [0, 0, m.head_dim, m.head_dim]


@pytest.mark.parametrize("model", MODELS)
def test_max_shard_numel_is_the_fullest_position(model):
    from nereus.spec.sharding import max_shard_numel, shard_numel
    m = MODEL_PRESETS[model]
    for head in (Head.LM, Head.SCALAR):
        for tp, pp in layouts(model):
            full = max(shard_numel(m, head, tp, pp, t, r) for t in range(tp) for r in range(pp))
            assert max_shard_numel(m, head, tp, pp) == full


@pytest.mark.parametrize("model,sizes", [
    ("tiny-llama", "tp in 1, 2, 4; pp in 1, 2, 4"),
    # 40 heads stop tp at 8; 40 layers allow pp = 5
    ("qwen3-14b", "tp in 1, 2, 4, 8; pp in 1, 2, 4, 5, 8, 10, 20, 40"),
    ("llama-3.3-70b", "tp in 1, 2, 4, 8, 16, 32, 64; pp in 1, 2, 4, 5, 8, 10, 16, 20, 40, 80"),
])
def test_the_sizes_an_error_allows_are_exactly_those_that_shard(model, sizes):
    """Every tp and pp listed shards the model, and no other size up to the heads and layers
    does."""
    m = MODEL_PRESETS[model]
    assert layout_sizes(m) == sizes
    tps, pps = (part.split(" in ")[1].split(", ") for part in sizes.split("; "))
    assert [int(t) for t in tps] == [t for t in range(1, m.num_heads + 1)
                                     if layout_problem(m, t, 1) is None]
    assert [int(p) for p in pps] == [p for p in range(1, m.num_layers + 1)
                                     if layout_problem(m, 1, p) is None]
    with pytest.raises(InputError) as info:
        check_layout(m, 3, 1)
    assert info.value.allowed == sizes
