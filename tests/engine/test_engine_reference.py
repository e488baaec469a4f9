"""At tp = pp = dp = 1 the engine computes what ``transformers`` computes with the same weights:
logits, log-probs, values, one Adam step with clipping, and greedy generation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.engine.batch import Batch
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.losses import weighted_nll
from nereus.engine.model import ParallelModel
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import Output, forward_pipeline, micro_inputs
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.errors import InputError
from nereus.spec.model import MODEL_PRESETS, Head, ModelSpec, RopeScaling

from engine_testlib import logical_state, on_replica, shards_for

MODELS = ["tiny-llama", "tiny-qwen3", "tiny-qwen2"]
# scaled RoPE on the tiny Llama; llama3 with an original window of 32 tokens, so its 16-wide
# heads have wavelengths below (kept), inside (blended) and above (divided) the band
SCALED = {"llama3": RopeScaling("llama3", 8.0, 1.0, 4.0, 32), "linear": RopeScaling("linear", 2.0)}


def scaled(kind: str) -> ModelSpec:
    return replace(MODEL_PRESETS["tiny-llama"], name=f"tiny-llama-{kind}",
                   rope_scaling=SCALED[kind])


def spec_named(name: str) -> ModelSpec:
    """A preset; ``rope-<kind>``: the tiny Llama with a scaled RoPE; ``mistral``: the tiny
    Llama as a Mistral without a sliding window (Mistral v0.3: Llama's layer)."""
    if name.startswith("rope-"):
        return scaled(name[5:])
    if name == "mistral":
        return replace(MODEL_PRESETS["tiny-llama"], name="tiny-mistral", model_type="mistral")
    return MODEL_PRESETS[name]


def hf_model(spec: ModelSpec, full: dict[str, torch.Tensor], head: Head = Head.LM
             ) -> torch.nn.Module:
    cfg = transformers.AutoConfig.for_model(**spec.to_hf_dict())
    if head is Head.SCALAR:  # a critic as verl builds one: a token classifier, one label
        cfg.num_labels = 1
        cfg.pad_token_id = 0
        m = transformers.AutoModelForTokenClassification.from_config(cfg)
    else:
        m = transformers.AutoModelForCausalLM.from_config(cfg)
    m.load_state_dict(full, strict=False)
    return m.float().eval()


def engine(spec: ModelSpec, full: dict[str, torch.Tensor], head: Head = Head.LM,
           adam: AdamConfig | None = None) -> StageEngine:
    shards = shards_for(full, spec, head, 1, 1, 0, 0)
    return StageEngine(spec, head, Position(), shards, None,
                       AdamState.zeros(shards) if adam else None, adam)


def batch(spec: ModelSpec, n: int, s: int, seed: int, left_pad: list[int] | None = None) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, spec.vocab_size, (n, s), generator=g)
    am = None
    if left_pad:
        am = torch.ones(n, s, dtype=torch.long)
        for i, k in enumerate(left_pad):
            am[i, :k] = 0
    return Batch(ids, am)


@pytest.mark.parametrize("name", MODELS + [f"rope-{k}" for k in SCALED] + ["mistral"])
def test_logits_equal_transformers(name: str) -> None:
    spec = spec_named(name)
    full = logical_state(spec, Head.LM, seed=1)
    ref = hf_model(spec, full)
    eng = engine(spec, full)
    b = batch(spec, 3, 17, seed=2)
    m = eng.model
    with torch.no_grad():
        h = m.stage_forward(b.input_ids, micro_inputs(m, b))
        logits = m.full_logits(h)
        want = ref(b.input_ids).logits
    assert logits.shape == want.shape
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)
    out = eng.forward(b, micro_batch=1).result
    assert isinstance(out, Output) and out.logprobs is not None
    want_lp = torch.log_softmax(want[:, :-1], -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(out.logprobs, want_lp, atol=1e-5, rtol=0)


@settings(max_examples=8, deadline=None, derandomize=True)
@given(pads=st.lists(st.integers(0, 6), min_size=1, max_size=4), s=st.integers(8, 20),
       name=st.sampled_from(MODELS))
def test_left_padded_logprobs_equal_transformers(pads: list[int], s: int, name: str) -> None:
    spec = MODEL_PRESETS[name]
    full = logical_state(spec, Head.LM, seed=3)
    ref = hf_model(spec, full)
    b = batch(spec, len(pads), s, seed=4, left_pad=pads)
    out = engine(spec, full).forward(b, micro_batch=1).result
    assert isinstance(out, Output) and out.logprobs is not None
    with torch.no_grad():
        want = ref(b.input_ids, attention_mask=b.attention_mask,
                   position_ids=b.positions()).logits
    want_lp = torch.log_softmax(want[:, :-1], -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    real = b.attention_mask[:, :-1].bool()   # positions whose own token is real
    torch.testing.assert_close(out.logprobs[real], want_lp[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_logprobs_at_a_temperature_equal_transformers(tp: int) -> None:
    """Log-probs under the distribution a rollout was sampled from at T = 2, as verl computes
    them (logits / T before the log-softmax), at tp = 1 and vocab-parallel at tp = 2; and a
    training step on them: its loss and its gradient (norm) are those of torch on HF."""
    spec = MODEL_PRESETS["tiny-qwen3"]     # vocabulary padded: the padding must stay at -inf
    full = logical_state(spec, Head.LM, seed=18)
    ref = hf_model(spec, full)    # eval mode (no dropout); gradients flow all the same
    b = batch(spec, 4, 9, seed=19, left_pad=[0, 2, 0, 3])
    w = torch.rand(4, 8, generator=torch.Generator().manual_seed(20)) / 32
    w = w * b.attention_mask[:, :-1]
    b = Batch(b.input_ids, b.attention_mask, {"weight": w})
    logits = ref(b.input_ids, attention_mask=b.attention_mask, position_ids=b.positions()).logits
    want = torch.log_softmax(logits[:, :-1] / 2.0, -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    loss = -(want * w).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), math.inf)
    real = b.attention_mask[:, :-1].bool()

    def run(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> object:
        eng = StageEngine(spec, Head.LM, pos, shards, groups, AdamState.zeros(shards),
                          AdamConfig(lr=1e-3))
        out = eng.forward(b, 2, temperature=2.0).result
        plain = eng.forward(b, 2).result
        res = eng.train_step(b, weighted_nll, 2, temperature=2.0).result
        return out, plain, res

    out, plain, res = on_replica(spec, Head.LM, tp, 1, run, seed=18)[(0, 0)]
    torch.testing.assert_close(out.logprobs[real], want[real].detach(), atol=1e-5, rtol=0)
    assert not torch.allclose(plain.logprobs[real], out.logprobs[real])   # T = 1 differs
    assert res.loss == pytest.approx(loss.item(), rel=1e-5)
    assert res.grad_norm == pytest.approx(float(norm), rel=1e-5)


@pytest.mark.parametrize("t", [0.0, -1.0, math.nan, math.inf])
def test_logprobs_refuse_a_temperature_they_cannot_divide_by(t: float) -> None:
    spec = MODEL_PRESETS["tiny-llama"]
    eng = engine(spec, logical_state(spec, Head.LM, seed=1))
    with pytest.raises(InputError, match="^temperature:"):
        eng.forward(batch(spec, 2, 5, seed=1), 1, temperature=t)


def test_logprobs_take_a_numpy_temperature() -> None:
    """As sampling does: a temperature read from a numpy array is a number."""
    import numpy as np

    spec = MODEL_PRESETS["tiny-llama"]
    eng = engine(spec, logical_state(spec, Head.LM, seed=1))
    b = batch(spec, 2, 5, seed=1)
    got = eng.forward(b, 1, temperature=np.float32(2.0)).result.logprobs
    torch.testing.assert_close(got, eng.forward(b, 1, temperature=2.0).result.logprobs)


@pytest.mark.parametrize("kind", SCALED)
def test_scaled_rope_changes_the_logits(kind: str) -> None:
    """The scaled-RoPE checks above can fail: unscaled, the same weights give other logits."""
    spec = scaled(kind)
    full = logical_state(spec, Head.LM, seed=1)
    ref = hf_model(spec, full)
    plain = engine(replace(spec, rope_scaling=None), full).model
    b = batch(spec, 3, 17, seed=2)
    with torch.no_grad():
        got = plain.full_logits(plain.stage_forward(b.input_ids, micro_inputs(plain, b)))
        want = ref(b.input_ids).logits
    assert (got - want).abs().max() > 1e-3


def test_rope_variants_the_engine_does_not_compute_are_refused() -> None:
    spec = replace(MODEL_PRESETS["tiny-llama"], rope_scaling=RopeScaling("yarn", 4.0, None, None,
                                                                         32))
    full = logical_state(spec, Head.LM, seed=1)
    with pytest.raises(InputError) as e:
        engine(spec, full)
    assert e.value.field == "model.rope_scaling" and "yarn" in str(e.value)


def test_scalar_head_equals_token_classifier() -> None:
    """Per-token values, score bias included, as transformers' token classifier gives them."""
    spec = MODEL_PRESETS["tiny-llama"]
    full = logical_state(spec, Head.SCALAR, seed=5)
    ref = hf_model(spec, full, Head.SCALAR)
    assert set(ref.state_dict()) == set(full)  # every tensor loaded, the bias too
    b = Batch(batch(spec, 2, 9, seed=6).input_ids)
    out = engine(spec, full, Head.SCALAR).forward(b, micro_batch=2).result
    assert isinstance(out, Output) and out.values is not None
    with torch.no_grad():
        want = ref(b.input_ids).logits[..., 0]
    torch.testing.assert_close(out.values, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", MODELS)
def test_train_step_equals_torch_adam_with_clipping(name: str) -> None:
    """Two micro-batches, global-norm clipping that bites, AdamW: same as torch on HF."""
    spec = MODEL_PRESETS[name]
    full = logical_state(spec, Head.LM, seed=7)
    ref = hf_model(spec, full).train()
    cfg = AdamConfig(lr=1e-3, weight_decay=0.01, max_grad_norm=0.1)
    eng = engine(spec, full, adam=cfg)
    b = batch(spec, 4, 11, seed=8, left_pad=[0, 2, 0, 1])
    w = torch.rand(4, 10, generator=torch.Generator().manual_seed(9)) / 40
    w = w * b.attention_mask[:, :-1]     # predictions made from padding carry no weight
    b = Batch(b.input_ids, b.attention_mask, {"w": w})

    def loss_fn(out: Output, mb: Batch) -> torch.Tensor:
        assert out.logprobs is not None
        return -(out.logprobs * mb.extra["w"]).sum()

    res = eng.train_step(b, loss_fn, micro_batch=2).result
    logits = ref(b.input_ids, attention_mask=b.attention_mask, position_ids=b.positions()).logits
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    loss = -(lp * w).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), cfg.max_grad_norm)
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                            eps=cfg.eps, weight_decay=cfg.weight_decay)
    opt.step()
    assert res.loss == pytest.approx(loss.item(), rel=1e-5)
    assert res.grad_norm == pytest.approx(float(norm), rel=1e-5)
    assert res.clip_coef < 1.0
    got = eng.model.params
    for name_, p in ref.state_dict().items():
        if name_ in got:
            mine = got[name_][:p.shape[0]]      # padded vocabulary rows are not logical
            torch.testing.assert_close(mine, p, atol=2e-5, rtol=0, msg=name_)
    assert all(not p.requires_grad and p.grad is None for p in got.values())


@pytest.mark.parametrize("name", MODELS + ["rope-llama3"])
def test_greedy_generation_equals_transformers(name: str) -> None:
    spec = spec_named(name)
    full = logical_state(spec, Head.LM, seed=10)
    ref = hf_model(spec, full)
    b = batch(spec, 4, 7, seed=11, left_pad=[2, 0, 4, 1])
    sp = SamplingParams(max_new_tokens=9, temperature=0.0)
    res = engine(spec, full).generate(b, sp, micro_batch=2).result
    with torch.no_grad():
        want = ref.generate(b.input_ids, attention_mask=b.attention_mask, do_sample=False,
                            max_new_tokens=9, min_new_tokens=9, pad_token_id=0)[:, 7:]
    assert torch.equal(res.tokens, want)
    assert res.lengths.tolist() == [9, 9, 9, 9]


def test_forward_does_not_depend_on_micro_batch() -> None:
    spec = MODEL_PRESETS["tiny-qwen3"]
    full = logical_state(spec, Head.LM, seed=12)
    b = batch(spec, 4, 10, seed=13, left_pad=[1, 0, 3, 0])
    m = ParallelModel(spec, Head.LM, Position(), shards_for(full, spec, Head.LM, 1, 1, 0, 0))
    one = Output.cat(forward_pipeline(m, b.split(1)) or [])
    four = Output.cat(forward_pipeline(m, b.split(4)) or [])
    assert one.logprobs is not None and four.logprobs is not None
    torch.testing.assert_close(one.logprobs, four.logprobs, atol=1e-6, rtol=0)


def _seeded_engine(spec: ModelSpec, param_dtype: str, master: bool, cfg: AdamConfig
                   ) -> tuple[StageEngine, object]:
    from nereus.runtime.loading import seeded_shard
    from nereus.runtime.state import MASTER, StateSpec

    sspec = StateSpec(spec, Head.LM, True, param_dtype, master)
    st = seeded_shard(sspec, 1, 1, 0, 0, seed=14)
    state = AdamState(st.exp_avg, st.exp_avg_sq, st.kind(MASTER) if master else {},
                      st.meta.adam_step)
    return StageEngine(spec, Head.LM, Position(), st.params, None, state, cfg), st


def _nll_batch(spec: ModelSpec) -> Batch:
    b = batch(spec, 4, 10, seed=15)
    w = torch.full((4, 9), 1.0 / 36)
    return Batch(b.input_ids, None, {"weight": w})


def test_bf16_parameters_train_on_fp32_master_weights() -> None:
    """bf16 parameters (the GPU setting) update through an fp32 master copy and fp32 moments,
    and land on the master rounded to bf16; the step follows the fp32 one."""
    from nereus.engine.losses import weighted_nll

    spec = MODEL_PRESETS["tiny-qwen3"]
    cfg = AdamConfig(lr=1e-3, max_grad_norm=1.0)
    e16, _ = _seeded_engine(spec, "bf16", True, cfg)
    e32, _ = _seeded_engine(spec, "fp32", False, cfg)
    master0 = {n: t.clone() for n, t in e16.adam_state.master.items()}  # type: ignore[union-attr]
    b = _nll_batch(spec)
    r16 = e16.train_step(b, weighted_nll, micro_batch=2).result
    r32 = e32.train_step(b, weighted_nll, micro_batch=2).result
    assert r16.loss == pytest.approx(r32.loss, rel=2e-2)
    assert r16.grad_norm == pytest.approx(r32.grad_norm, rel=5e-2)
    moved = 0
    for name, p in e16.model.params.items():
        master = e16.adam_state.master[name]  # type: ignore[union-attr]
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert torch.equal(p, master.to(torch.bfloat16))
        moved += int((master != master0[name]).sum())
        assert e16.adam_state.exp_avg[name].dtype == torch.float32  # type: ignore[union-attr]
    assert moved > 0.9 * sum(p.numel() for p in e16.model.params.values())


def test_recompute_gives_the_same_step() -> None:
    from nereus.engine.losses import weighted_nll

    spec = MODEL_PRESETS["tiny-llama"]
    cfg = AdamConfig(lr=1e-3)
    a, _ = _seeded_engine(spec, "fp32", False, cfg)
    b, _ = _seeded_engine(spec, "fp32", False, cfg)
    data = _nll_batch(spec)
    ra = a.train_step(data, weighted_nll, micro_batch=2).result
    rb = b.train_step(data, weighted_nll, micro_batch=2, recompute=True).result
    assert ra.loss == rb.loss and ra.grad_norm == rb.grad_norm
    for name, p in a.model.params.items():
        assert torch.equal(p, b.model.params[name]), name


def test_stop_tokens_end_a_sequence_and_pad_the_rest() -> None:
    spec = MODEL_PRESETS["tiny-llama"]
    full = logical_state(spec, Head.LM, seed=16)
    eng = engine(spec, full)
    b = batch(spec, 3, 5, seed=17)
    free = eng.generate(b, SamplingParams(max_new_tokens=6, temperature=0.0), 3).result
    stop = int(free.tokens[0, 2])
    ends = [int((row == stop).nonzero()[0]) + 1 if bool((row == stop).any()) else 6
            for row in free.tokens]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, stop_tokens=(stop,), pad_token=-1)
    got = eng.generate(b, sp, 1).result
    assert got.lengths.tolist() == ends and ends[0] <= 3
    for row, n, want in zip(got.tokens, ends, free.tokens):
        assert torch.equal(row[:n], want[:n]) and bool((row[n:] == -1).all())


def test_reward_scores_read_the_last_real_token() -> None:
    values = torch.arange(12.0).view(3, 4)
    am = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 1, 0]])
    assert Output(values=values).scores(am).tolist() == [3.0, 5.0, 10.0]
    assert Output(values=values).scores(None).tolist() == [3.0, 7.0, 11.0]


def test_the_engine_refuses_a_family_whose_layer_it_does_not_compute() -> None:
    """A Gemma model has Llama's parameter names, so its state loads and moves; the engine's
    SiLU MLP, plain norms and unscaled embedding would compute another function on it. A
    sliding window (Mistral v0.1) is refused too: the engine attends to the whole sequence."""
    spec = MODEL_PRESETS["tiny-llama"]
    full = logical_state(spec, Head.LM, seed=12)
    shards = shards_for(full, spec, Head.LM, 1, 1, 0, 0)
    ParallelModel(spec, Head.LM, Position(), shards)
    ParallelModel(replace(spec, model_type="mistral"), Head.LM, Position(), shards)
    with pytest.raises(InputError, match=r"^model\.model_type: 'gemma' is planned, but the "
                                         r"engine computes Llama's layer only"):
        ParallelModel(replace(spec, model_type="gemma"), Head.LM, Position(), shards)
    with pytest.raises(InputError, match=r"^model\.sliding_window: 4096: the engine computes "
                                         r"attention over the whole sequence only"):
        ParallelModel(replace(spec, model_type="mistral", sliding_window=4096), Head.LM,
                      Position(), shards)
