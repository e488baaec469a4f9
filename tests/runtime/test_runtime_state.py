"""Sharded state in one process: arenas, seeded init, gather, local re-slicing, safetensors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.cost.candidate import Layout
from nereus.cost.state import emu_state_bytes
from nereus.errors import InputError
from nereus.plan.search import best_plan
from nereus.runtime.executor import state_specs
from nereus.runtime.loading import (
    load_safetensors,
    save_safetensors,
    seeded_logical,
    seeded_meta,
    seeded_shard,
)
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
    position_bytes,
)
from nereus.spec.job import parse_job
from nereus.spec.model import MODEL_PRESETS, Head
from nereus.spec.sharding import EMBED, LM_HEAD, layout_problem
from nereus.spec.workload import Workload
from nereus.transition.emu import phi
from nereus.transition.sizes import StateSizes

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


@pytest.mark.parametrize("model", TINY)
@pytest.mark.parametrize("device", ["cpu", "h100-sxm-80gb"])
@pytest.mark.parametrize("dtypes", [{}, {"param_dtype": "fp32"}, {"master_weights": False},
                                    {"optimizer": "sgd"},
                                    {"optimizer": "sgd", "param_dtype": "fp32"}])
def test_every_stage_of_a_job_holds_what_its_transition_plan_sizes(model: str, device: str,
                                                                   dtypes: dict) -> None:
    """The state a job's stages hold on workers of any kind (``state_specs``) is, unit by unit
    and position by position, what the transition planner sizes for that job: with the
    workload's dtypes (bf16 and an fp32 master copy by default), CPU workers included."""
    job = parse_job({"model": model, "algo": "ppo", "gpus": 8,
                     "cluster": {"device": device}, "workload": {"prompts_per_step": 8, **dtypes}})
    specs = state_specs(job)
    sizes = StateSizes(job)
    for units in phi(job, best_plan(job)).values():
        for e in units:
            held = [position_bytes(specs[e.stage], e.layout.tp, e.layout.pp, *e.position(i))
                    for i in range(len(e.gpus))]
            assert tuple(held) == sizes.of(e), e


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


@settings(max_examples=15)
@given(st.sampled_from(TINY), st.sampled_from(LAYOUTS), st.sampled_from([(1, 1), (2, 1), (1, 2),
                                                                         (2, 2)]),
       st.sampled_from([512, 1 << 20]))
def test_split_segments_rebuild_every_target_position(model: str, big: tuple[int, int],
                                                      sub: tuple[int, int], bucket: int) -> None:
    """Replaying a Split group's segments (and local copies) byte by byte, as the workers do,
    rebuilds each T_sub position bitwise; pipeline-only splits need no staging."""
    from nereus.cost.candidate import Layout
    from nereus.runtime.splitting import split_segments
    from nereus.runtime.state import Coverage, copy_block
    from nereus.transition.nesting import gather_groups

    tp, pp = big
    if not _ok(model, tp, pp) or tp % sub[0] or pp % sub[1] or not _ok(model, *sub) \
            or (tp, pp) == sub:
        return
    spec = _spec(model, dtype="bf16", master=True)
    src = {(t, r): seeded_shard(spec, tp, pp, t, r, 3) for r in range(pp) for t in range(tp)}
    out = []
    for idx in gather_groups(Layout(tp, pp), Layout(*sub)):
        members = tuple((i % tp, i // tp) for i in idx)
        segs, local = split_segments(spec, tp, pp, members, sub, bucket)
        if sub[0] == tp:
            assert all(run.dst is not None for run in segs)
        segs = [sg for run in segs for sg in run.parts]
        m_tp, m_pp = tp // sub[0], pp // sub[1]
        t0, r0 = members[0]
        tgt = ShardedState.empty(spec, *sub, t0 // m_tp, r0 // m_pp, src[members[0]].meta)
        tgt.buffer.fill_(0xAB)  # garbage where nothing is written
        cov = Coverage()
        for i in local:
            et = tgt.layout.entries[i]
            mine = src[members[0]]
            em = next(e for e in mine.layout.entries
                      if (e.kind, e.shard.logical) == (et.kind, et.shard.logical))
            cov.add(et.key, copy_block(tgt.tensor(et.kind, et.shard.name), et.shard,
                                       mine.tensor(em.kind, em.shard.name), em.shard))
        for sg in segs:
            data = src[members[sg.root]].buffer[sg.src[0]:sg.src[1]]
            et = tgt.layout.entries[sg.entry]
            if sg.dst is not None:
                tgt.buffer[sg.dst[0]:sg.dst[1]].copy_(data)
            else:
                base = [et.shard.start if d == et.shard.split_dim else 0
                        for d in range(len(sg.box))]
                idx2 = tuple(slice(a - b, z - b) for (a, z), b in zip(sg.box, base))
                tgt.tensor(et.kind, et.shard.name)[idx2].copy_(
                    data.view(et.dtype).view(tuple(z - a for a, z in sg.box)))
            cov.add(et.key, sg.box)
        assert cov.missing(tgt.layout) == []
        tgt.zero_padding()
        out.append(tgt)
    want = gather(_unit(spec, *sub, seed=3))
    for tgt in out:
        ref = next(s for s in _unit(spec, *sub, seed=3) if s.position == tgt.position)
        for e in tgt.layout.entries:
            assert torch.equal(tgt.tensor(e.kind, e.shard.name), ref.tensor(e.kind, e.shard.name))
    assert want is not None


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


def test_a_checkpoint_with_parameters_the_format_lacks_is_refused(tmp_path) -> None:
    """Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj, which the sharding format
    has no place for: read past, they would be dropped from the state the runtime moves."""
    import transformers

    from nereus.spec.model import ModelSpec

    hf_cfg = {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": False,
              "max_position_embeddings": 512, "pad_token_id": 0}
    torch.manual_seed(0)
    transformers.Phi3ForCausalLM(transformers.Phi3Config(**hf_cfg)).save_pretrained(
        tmp_path, safe_serialization=True)
    spec = StateSpec(ModelSpec.from_hf_dict(hf_cfg, "tiny-phi3"))
    with pytest.raises(InputError, match=r"^checkpoint: .* holds 4 tensor\(s\) that tiny-phi3 "
                                         r"has no place for, such as 'model\.layers\.0\.mlp\."
                                         r"gate_up_proj\.weight'"):
        load_safetensors(tmp_path, spec, 1, 1, 0, 0)


def test_qwen2_biases_load_with_their_heads(tmp_path) -> None:
    """Qwen2's q/k/v biases are part of the state: each TP rank holds its heads' rows, and
    with more ranks than KV heads each KV head's bias sits on the ranks that share it."""
    import transformers

    from nereus.spec.model import MODEL_PRESETS

    m = MODEL_PRESETS["tiny-qwen2"]  # 4 heads, 2 KV heads, head_dim 16
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**m.to_hf_dict()))
    with torch.no_grad():  # transformers starts biases at zero: every slice would match
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    want = hf.state_dict()
    spec = StateSpec(m)
    for t in range(4):
        got = load_safetensors(tmp_path, spec, 4, 1, t, 0)
        for proj, rows in (("q", slice(16 * t, 16 * (t + 1))),
                           ("k", slice(16 * (t // 2), 16 * (t // 2 + 1)))):
            name = f"model.layers.1.self_attn.{proj}_proj.bias"
            assert torch.equal(got.tensor(PARAM, name), want[name][rows]), (t, proj)


@pytest.mark.parametrize("cls_name,has_bias", [("LlamaForTokenClassification", True),
                                               ("LlamaForSequenceClassification", False)])
def test_a_critic_or_reward_checkpoint_loads_with_its_score_bias(tmp_path, cls_name: str,
                                                                 has_bias: bool) -> None:
    """verl builds its critic as a token classifier, whose score head has a bias (it was
    refused, and before that dropped); a reward model's sequence classifier has none, which
    is a bias of zero."""
    import transformers

    from nereus.spec.sharding import SCORE, SCORE_BIAS

    spec = _spec("tiny-llama", head=Head.SCALAR, trainable=True)
    cfg = transformers.AutoConfig.for_model(**spec.model.to_hf_dict())
    cfg.num_labels, cfg.pad_token_id = 1, 0
    torch.manual_seed(0)
    hf = getattr(transformers, cls_name)(cfg)
    if has_bias:
        torch.nn.init.normal_(hf.score.bias)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    want = hf.state_dict()
    for tp, pp in [(1, 1), (2, 2)]:
        got = gather([load_safetensors(tmp_path, spec, tp, pp, t, r)
                      for r in range(pp) for t in range(tp)])
        assert torch.equal(got.tensors[(PARAM, SCORE)], want["score.weight"])
        bias = want["score.bias"] if has_bias else torch.zeros(1)
        assert torch.equal(got.tensors[(PARAM, SCORE_BIAS)], bias)
