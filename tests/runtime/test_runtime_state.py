"""Sharded state in one process: arenas, seeded init, gather, local re-slicing, safetensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Layout
from nereus.cost.state import emu_state_bytes
from nereus.runtime.loading import (
    load_safetensors,
    save_safetensors,
    seeded_logical,
    seeded_meta,
    seeded_shard,
)
from nereus.runtime.movement import bucket_ranges
from nereus.runtime.state import (
    EXP_AVG,
    PARAM,
    ShardedState,
    StateMeta,
    StateMismatch,
    StateSpec,
    arena_layout,
    assemble,
    gather,
)
from nereus.spec.model import MODEL_PRESETS, Head
from nereus.spec.sharding import EMBED, LM_HEAD, layout_problem
from nereus.spec.workload import Workload

TINY = ("tiny-llama", "tiny-qwen3")
LAYOUTS = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4)]


def _spec(model: str, head: Head = Head.LM, trainable: bool = True, dtype: str = "fp32",
          master: bool = False) -> StateSpec:
    return StateSpec(MODEL_PRESETS[model], head, trainable, dtype, master)


def _ok(model: str, tp: int, pp: int) -> bool:
    return layout_problem(MODEL_PRESETS[model], tp, pp) is None


def _unit(spec: StateSpec, tp: int, pp: int, seed: int) -> list[ShardedState]:
    return [seeded_shard(spec, tp, pp, t, r, seed) for r in range(pp) for t in range(tp)]


@pytest.mark.parametrize("model", TINY)
@pytest.mark.parametrize("dtype,master,trainable", [("fp32", False, True), ("bf16", True, True),
                                                    ("bf16", False, False)])
def test_arena_bytes_equal_the_planners_count(model: str, dtype: str, master: bool,
                                              trainable: bool) -> None:
    """The runtime holds exactly the bytes the transition planner counts per position."""
    wl = Workload(param_dtype=dtype, master_weights=master)
    spec = _spec(model, Head.LM, trainable, dtype, master)
    for tp, pp in LAYOUTS:
        if not _ok(model, tp, pp):
            continue
        for t in range(tp):
            for r in range(pp):
                want = emu_state_bytes(spec.model, Head.LM, Layout(tp, pp), trainable, wl, t, r)
                assert arena_layout(spec, tp, pp, t, r).nbytes == want


@settings(max_examples=12)
@given(st.sampled_from(TINY), st.sampled_from([Head.LM, Head.SCALAR]),
       st.sampled_from(LAYOUTS), st.integers(0, 3))
def test_seeded_state_does_not_depend_on_layout(model: str, head: Head,
                                                layout: tuple[int, int], seed: int) -> None:
    tp, pp = layout
    if not _ok(model, tp, pp):
        return
    spec = _spec(model, head)
    got = gather(_unit(spec, tp, pp, seed))
    assert got.first_difference(seeded_logical(spec, seed)) is None


@settings(max_examples=12)
@given(st.sampled_from(TINY), st.sampled_from(LAYOUTS), st.sampled_from([(1, 1), (2, 1), (1, 2),
                                                                         (2, 2), (4, 1)]))
def test_assemble_cuts_any_nested_layout_out_of_a_replica(model: str, big: tuple[int, int],
                                                          sub: tuple[int, int]) -> None:
    """Merge's local slicing: every position of T out of a full replica of T_sub, bitwise."""
    tp, pp = big
    if not _ok(model, tp, pp) or tp % sub[0] or pp % sub[1] or not _ok(model, *sub):
        return
    spec = _spec(model, dtype="bf16", master=True)
    source = _unit(spec, *sub, seed=5)
    out = []
    for r in range(pp):
        for t in range(tp):
            tgt = ShardedState.empty(spec, tp, pp, t, r, source[0].meta)
            assemble(tgt, source)
            out.append(tgt)
    assert gather(out).first_difference(seeded_logical(spec, 5)) is None


def test_gather_detects_a_corrupt_replica_and_a_missing_position() -> None:
    spec = _spec("tiny-llama")
    shards = _unit(spec, 4, 1, seed=1)  # tp=4 > 2 KV heads: each KV head on two ranks
    name = "model.layers.0.self_attn.k_proj.weight"
    shards[1].tensor(PARAM, name).add_(1.0)
    with pytest.raises(StateMismatch):
        gather(shards)
    with pytest.raises(ValueError):
        gather(_unit(spec, 2, 1, seed=1)[:1])


def test_padding_rows_are_zero_and_tied_copy_matches_embedding() -> None:
    spec = _spec("tiny-qwen3")  # vocab 250 -> padded to 256; tied embeddings
    last = seeded_shard(spec, 2, 2, 1, 1, seed=2)
    first = seeded_shard(spec, 2, 2, 1, 0, seed=2)
    head = last.tensor(PARAM, LM_HEAD)
    assert torch.equal(head, first.tensor(PARAM, EMBED))
    assert torch.equal(last.tensor(EXP_AVG, LM_HEAD), first.tensor(EXP_AVG, EMBED))
    assert head.shape[0] == 128 and bool((head[250 - 128:] == 0).all())


def test_meta_roundtrip_and_warm_state_is_not_trivial() -> None:
    m = seeded_meta(9)
    assert StateMeta.from_bytes(m.to_bytes()) == m
    assert m.adam_step > 0 and m.minibatch_pos > 0 and len(m.rng_state) > 1000
    g0, g1 = m.generator(0), m.generator(1)
    assert not torch.equal(torch.rand(4, generator=g0), torch.rand(4, generator=g1))


@pytest.mark.parametrize("bucket", [256, 4096, 1 << 20])
def test_bucket_ranges_cover_the_arena_at_row_boundaries(bucket: int) -> None:
    spec = _spec("tiny-qwen3")
    lay = arena_layout(spec, 2, 2, 0, 1)
    spans = bucket_ranges(lay, bucket)
    assert spans[0][0] == 0 and spans[-1][1] == lay.nbytes
    assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
    cuts = {b for _, b in spans}
    for e in lay.entries:
        row = e.nbytes // (e.shard.local_shape[0] if e.shard.local_shape else 1)
        assert all((c - e.offset) % row == 0 for c in cuts if e.offset < c < e.offset + e.nbytes)


@pytest.mark.parametrize("model,cls_name", [("tiny-llama", "LlamaForCausalLM"),
                                            ("tiny-qwen3", "Qwen3ForCausalLM")])
def test_safetensors_from_transformers_load_in_any_layout(tmp_path, model: str,
                                                          cls_name: str) -> None:
    """A checkpoint written by transformers' own save_pretrained loads into sharded state."""
    import transformers

    spec = _spec(model, trainable=True)
    cfg_cls = transformers.AutoConfig.for_model(**spec.model.to_hf_dict())
    torch.manual_seed(0)
    hf = getattr(transformers, cls_name)(cfg_cls)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    want = {k: v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    for tp, pp in [(1, 1), (2, 2), (4, 1)]:
        if not _ok(model, tp, pp):
            continue
        shards = [load_safetensors(tmp_path, spec, tp, pp, t, r)
                  for r in range(pp) for t in range(tp)]
        got = gather(shards)
        for name, t in want.items():
            if name == LM_HEAD and spec.model.tie_embeddings:
                continue
            assert torch.equal(got.tensors[(PARAM, name)], t), name
        assert not got.tensors[(EXP_AVG, EMBED)].any()


def test_save_and_load_safetensors_roundtrip(tmp_path) -> None:
    spec = _spec("tiny-llama", dtype="bf16", master=True)
    ref = seeded_logical(spec, 4)
    save_safetensors(ref, tmp_path / "ckpt")
    got = gather([load_safetensors(tmp_path / "ckpt", spec, 2, 1, t, 0) for t in range(2)])
    assert torch.equal(got.tensors[(PARAM, EMBED)], ref.tensors[(PARAM, EMBED)])
