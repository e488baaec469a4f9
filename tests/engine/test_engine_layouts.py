"""Every layout computes what tp = pp = dp = 1 computes: logits, log-probs, values, generated
tokens, and one training step's loss, gradient norm and updated state (parameters, Adam moments,
counters), on the runtime's workers and state.

The default run covers a representative set of layouts (TP with replicated KV heads, PP with the
tied LM-head copy, DP, and all three together); ``-m slow`` sweeps every layout of up to 8
workers with tp, pp, dp in {1, 2, 4}.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from nereus.engine.batch import Batch
from nereus.engine.groups import Position
from nereus.engine.losses import weighted_mse, weighted_nll
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.runner import StageRunner
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.errors import InputError
from nereus.runtime.comm import Rendezvous
from nereus.runtime.loading import seeded_shard
from nereus.runtime.state import EXP_AVG, EXP_AVG_SQ, PARAM, LogicalState, StateSpec
from nereus.runtime.workers import WorkerPool
from nereus.spec.model import MODEL_PRESETS, Head
from nereus.spec.sharding import layout_problem

from engine_testlib import drop_units, gather_unit, layout_emus, place_seeded_units, worker_session

WORKERS = 8
SEED = 11
ADAM = AdamConfig(lr=1e-3, weight_decay=0.01, max_grad_norm=0.05)  # the clip bites
SAMPLING = SamplingParams(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=5, stop_tokens=(7,))

ALL_LAYOUTS = [(tp, pp, dp) for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2, 4)
               if tp * pp * dp <= WORKERS]
FAST = {  # representative: TP (replicated KV at tp=4), PP (tied copy), DP, all three
    "tiny-llama": [(4, 1, 1), (1, 2, 2), (2, 2, 2)],
    "tiny-qwen3": [(2, 1, 2), (1, 4, 1), (4, 2, 1)],
    "tiny-qwen2": [(4, 2, 1)],  # q/k/v biases, on replicated KV heads
}


def cases() -> Iterator[Any]:
    for name, fast in FAST.items():
        for lay in ALL_LAYOUTS:
            if layout_problem(MODEL_PRESETS[name], lay[0], lay[1]) or lay == (1, 1, 1):
                continue
            marks = () if lay in fast else (pytest.mark.slow,)
            yield pytest.param(name, lay, id=f"{name}-tp{lay[0]}pp{lay[1]}dp{lay[2]}",
                               marks=marks)


@pytest.fixture(scope="module")
def runtime() -> Iterator[tuple[WorkerPool, Rendezvous]]:
    with worker_session(WORKERS) as got:
        yield got


def lm_batch(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(3)
    n, s = 8, 12
    ids = torch.randint(0, vocab, (n, s), generator=g)
    am = torch.ones(n, s, dtype=torch.long)
    am[0, :3] = 0
    am[5, :1] = 0
    w = torch.rand(n, s - 1, generator=g) / (n * (s - 1)) * am[:, :-1]
    target = torch.randn(n, s, generator=g)
    return Batch(ids, am, {"weight": w, "value_weight": am / am.sum(), "target": target})


def prompts_of(b: Batch) -> Batch:
    return Batch(b.input_ids[:, :6], b.attention_mask[:, :6])  # type: ignore[index]


@dataclass(frozen=True)
class Ref:
    logits: torch.Tensor
    logprobs: torch.Tensor
    tokens: torch.Tensor
    loss: float
    grad_norm: float
    state: LogicalState


def _reference(name: str) -> Ref:
    """tp = pp = dp = 1 in this process, on the same seeded state the workers build."""
    spec = MODEL_PRESETS[name]
    sspec = StateSpec(spec, Head.LM)
    st = seeded_shard(sspec, 1, 1, 0, 0, SEED)
    eng = StageEngine(spec, Head.LM, Position(), st.params, None,
                      AdamState(st.exp_avg, st.exp_avg_sq, {}, st.meta.adam_step), ADAM)
    b = lm_batch(spec.vocab_size)
    m = eng.model
    from nereus.engine.pipeline import micro_inputs
    with torch.no_grad():
        # the ids the workers read: padded positions' ids are never read (Batch.tokens)
        logits = m.full_logits(m.stage_forward(b.tokens(), micro_inputs(m, b)))
    lp = eng.forward(b, 2).result.logprobs  # type: ignore[union-attr]
    toks = eng.generate(prompts_of(b).rows(0, 8), SAMPLING, 4).result.tokens  # type: ignore
    res = eng.train_step(b, weighted_nll, 2).result
    from dataclasses import replace

    from nereus.runtime.state import gather
    st.meta = replace(st.meta, adam_step=eng.adam_state.step,  # type: ignore[union-attr]
                      update_count=st.meta.update_count + 1)
    return Ref(logits, lp, toks, res.loss, res.grad_norm, gather([st]))  # type: ignore


_REFS: dict[str, Ref] = {}


def reference(name: str) -> Ref:
    if name not in _REFS:
        _REFS[name] = _reference(name)
    return _REFS[name]


def assert_state_close(got: LogicalState, want: LogicalState) -> None:
    """Parameters within 2 % of one step (Adam turns reduction-order noise in a near-zero
    gradient into up to lr x noise / eps), moments within float tolerance, counters exact."""
    assert got.meta == want.meta
    for (kind, name), t in want.tensors.items():
        atol = {PARAM: 0.02 * ADAM.lr, EXP_AVG: 1e-6, EXP_AVG_SQ: 1e-8}[kind]
        torch.testing.assert_close(got.tensors[(kind, name)], t, atol=atol, rtol=1e-4,
                                   msg=f"{kind}:{name}")


@pytest.mark.parametrize("name,lay", list(cases()))
def test_layout_equals_single_worker(runtime: tuple[WorkerPool, Rendezvous], name: str,
                                     lay: tuple[int, int, int]) -> None:
    pool, rv = runtime
    tp, pp, dp = lay
    spec = MODEL_PRESETS[name]
    ref = reference(name)
    emus = layout_emus("actor_train", tp, pp, dp, f"t{tp}{pp}{dp}", trainable=True)
    place_seeded_units(pool, emus, StateSpec(spec, Head.LM), SEED)
    try:
        b = lm_batch(spec.vocab_size)
        with StageRunner(pool, emus, rv, ADAM) as run:
            torch.testing.assert_close(run.full_logits(b), ref.logits, atol=1e-5, rtol=0)
            out, meas = run.forward(b, micro_batch=8 // dp // 2 or 1)
            torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
            assert meas.source == "measured" and len(meas.workers) == tp * pp * dp
            gen, gmeas = run.generate(prompts_of(b), SAMPLING, micro_batch=4 // dp or 1)
            assert torch.equal(gen.tokens, ref.tokens)
            assert "decode" in gmeas.op_s and ("allgather.intra" in gmeas.op_s) == (tp > 1)
            res, meas = run.train_step(b, weighted_nll, micro_batch=max(1, 4 // dp))
            assert res.loss == pytest.approx(ref.loss, rel=1e-5)
            assert res.grad_norm == pytest.approx(ref.grad_norm, rel=1e-5)
            assert meas.op_s.get("gemm", 0) > 0 and meas.op_s.get("optimizer", 0) > 0
            assert ("allreduce.intra" in meas.op_s) == (lay != (1, 1, 1))  # PP: the norm
            assert ("p2p.intra" in meas.op_s) == (pp > 1)
        for e in emus:   # every replica holds the same updated state
            assert_state_close(gather_unit(pool, e), ref.state)
    finally:
        drop_units(pool, emus)


@pytest.mark.parametrize("lay", [(2, 2, 2), pytest.param((4, 1, 2), marks=pytest.mark.slow)])
def test_critic_layout_equals_single_worker(runtime: tuple[WorkerPool, Rendezvous],
                                            lay: tuple[int, int, int]) -> None:
    """The scalar head (values, and a value-regression step) in a sharded layout."""
    pool, rv = runtime
    spec = MODEL_PRESETS["tiny-llama"]
    sspec = StateSpec(spec, Head.SCALAR)
    b = lm_batch(spec.vocab_size)
    b = Batch(b.input_ids, b.attention_mask, {"target": b.extra["target"],
                                              "weight": b.extra["value_weight"]})
    st = seeded_shard(sspec, 1, 1, 0, 0, SEED)
    eng = StageEngine(spec, Head.SCALAR, Position(), st.params, None,
                      AdamState(st.exp_avg, st.exp_avg_sq, {}, st.meta.adam_step), ADAM)
    want_v = eng.forward(b, 4).result.values  # type: ignore[union-attr]
    want = eng.train_step(b, weighted_mse, 4).result
    emus = layout_emus("critic_train", *lay, tag="c", trainable=True)
    place_seeded_units(pool, emus, sspec, SEED)
    try:
        with StageRunner(pool, emus, rv, ADAM) as run:
            out, _ = run.forward(b, micro_batch=2)
            torch.testing.assert_close(out.values, want_v, atol=1e-5, rtol=0)
            res, _ = run.train_step(b, weighted_mse, micro_batch=2)
        assert res.loss == pytest.approx(want.loss, rel=1e-5)
        assert res.grad_norm == pytest.approx(want.grad_norm, rel=1e-5)
        got = gather_unit(pool, emus[0])
        for name, t in st.params.items():
            torch.testing.assert_close(got.tensors[(PARAM, name)], t, atol=0.02 * ADAM.lr,
                                       rtol=1e-4, msg=name)
    finally:
        drop_units(pool, emus)


def test_uneven_dp_forward_and_generation_equal_single_worker(
        runtime: tuple[WorkerPool, Rendezvous]) -> None:
    """8 sequences over dp = 3 (3, 3 and 2 of them, as the planner may place a generation or
    forward stage on a pool whose replicas divide no power of two): the same log-probs, full
    logits and tokens as one worker; micro-batches of 3 leave the last replica a short one.
    Training refuses the split before any worker starts."""
    pool, rv = runtime
    spec = MODEL_PRESETS["tiny-llama"]
    ref = reference("tiny-llama")
    emus = layout_emus("actor_train", 1, 2, 3, "uneven", trainable=True)
    place_seeded_units(pool, emus, StateSpec(spec, Head.LM), SEED)
    try:
        b = lm_batch(spec.vocab_size)
        with StageRunner(pool, emus, rv, ADAM) as run:
            torch.testing.assert_close(run.full_logits(b), ref.logits, atol=1e-5, rtol=0)
            out, meas = run.forward(b, micro_batch=3)
            torch.testing.assert_close(out.logprobs, ref.logprobs, atol=1e-5, rtol=0)
            assert (meas.dp, meas.micro_batch, meas.grad_accum) == (3, 3, 1)
            gen, _ = run.generate(prompts_of(b), SAMPLING, micro_batch=3)
            assert torch.equal(gen.tokens, ref.tokens)
            with pytest.raises(InputError, match="equal shares") as e:
                run.train_step(b, weighted_nll, micro_batch=1)
            assert e.value.field == "batch"
            with pytest.raises(InputError, match="largest replica's 3") as e:
                run.forward(b, micro_batch=2)
            assert e.value.field == "micro_batch"
    finally:
        drop_units(pool, emus)


def test_bad_micro_batch_fails_before_dispatch(runtime: tuple[WorkerPool, Rendezvous]) -> None:
    pool, rv = runtime
    spec = MODEL_PRESETS["tiny-llama"]
    emus = layout_emus("actor_train", 1, 1, 2, "bad", trainable=True)
    place_seeded_units(pool, emus, StateSpec(spec, Head.LM), SEED)
    try:
        with StageRunner(pool, emus, rv, ADAM) as run:
            with pytest.raises(InputError, match="micro_batch"):
                run.train_step(lm_batch(spec.vocab_size), weighted_nll, micro_batch=3)
            groups = dict(run.groups)
        held = pool.run({d: (lambda ctx: list(ctx.groups), ()) for d in range(2)})
        assert not any(set(groups) & set(h) for h in held.values())   # closed with the runner
    finally:
        drop_units(pool, emus)


def _plan(tp: int, pp: int, replicas: list[tuple[int, ...]]) -> Any:
    from nereus.cost.candidate import Candidate, Layout
    from nereus.plan.types import Plan, StagePlan

    return Plan((StagePlan("actor_train", Candidate(Layout(tp, pp), len(replicas), 1, 1),
                           tuple(replicas)),))


@pytest.mark.parametrize("moves", [
    # (tp=2, dp=2) -> (pp=2, dp=2) on the same GPUs (Split, Merge), then onto 4 more (Extend)
    [(1, 2, [(0, 1), (2, 3)]), (2, 2, [(0, 1, 2, 3), (4, 5, 6, 7)])],
])
def test_transition_between_steps_keeps_the_losses(runtime: tuple[WorkerPool, Rendezvous],
                                                   moves: list[Any]) -> None:
    """Train a step, move the state with the runtime's executor, train the next step in the
    new layout, and so on: the losses are those of a run that never moved (tp=pp=dp=1)."""
    from nereus.runtime.executor import Executor, state_specs
    from nereus.spec.job import parse_job
    from nereus.transition.emu import phi
    from nereus.transition.planner import plan_transition

    pool, rv = runtime
    # fp32 without a master copy: the state the engine's reference below trains (sspec)
    job = parse_job({"model": "tiny-llama", "gpus": WORKERS, "cluster": {"device": "cpu"},
                     "workload": {"param_dtype": "fp32"}})
    spec, sspec = job.model, StateSpec(job.model, Head.LM)
    assert state_specs(job)["actor_train"] == sspec
    steps = len(moves) + 1
    g = torch.Generator().manual_seed(21)
    batches = []
    for _ in range(steps):
        ids = torch.randint(0, spec.vocab_size, (8, 10), generator=g)
        batches.append(Batch(ids, None, {"weight": torch.full((8, 9), 1.0 / 72)}))

    st = seeded_shard(sspec, 1, 1, 0, 0, SEED)
    ref = StageEngine(spec, Head.LM, Position(), st.params, None,
                      AdamState(st.exp_avg, st.exp_avg_sq, {}, st.meta.adam_step), ADAM)
    want = [ref.train_step(b, weighted_nll, 2).result.loss for b in batches]

    plan = _plan(2, 1, [(0, 1), (2, 3)])
    emus = list(phi(job, plan)["actor_train"])
    place_seeded_units(pool, emus, sspec, SEED)
    executor = Executor(pool, state_specs(job))
    got = []
    try:
        for k, b in enumerate(batches):
            with StageRunner(pool, emus, rv, ADAM) as run:
                got.append(run.train_step(b, weighted_nll, micro_batch=2)[0].loss)
            if k < len(moves):
                target = _plan(*moves[k])
                report = executor.run(plan_transition(job, plan, target))
                assert report.within_capacity()
                plan, emus = target, list(report.units["actor_train"])
        assert got == pytest.approx(want, rel=1e-5)
        final = gather_unit(pool, emus[0])
        assert ref.adam_state is not None
        assert final.meta.adam_step == ref.adam_state.step == st.meta.adam_step + steps
        for name, t in st.params.items():
            torch.testing.assert_close(final.tensors[(PARAM, name)], t, atol=0.05 * ADAM.lr,
                                       rtol=1e-4, msg=name)
    finally:
        drop_units(pool, emus)


@pytest.mark.parametrize("name,tp", [("tiny-qwen3", 2), ("tiny-qwen2", 4)])
def test_weights_from_a_transformers_checkpoint(runtime: tuple[WorkerPool, Rendezvous],
                                                tmp_path: Any, name: str, tp: int) -> None:
    """A checkpoint ``transformers`` wrote (tied embeddings, a vocabulary that needs padding;
    Qwen2's q/k/v biases, over replicated KV heads at tp=4), loaded by the runtime into a
    (tp, pp=2) unit, gives transformers' logits."""
    import transformers

    from nereus.runtime.movement import place_safetensors

    pool, rv = runtime
    spec = MODEL_PRESETS[name]
    cfg = transformers.AutoConfig.for_model(**spec.to_hf_dict())
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # transformers starts biases at zero: a wrong slice would pass
        for name_, p in hf.named_parameters():
            if name_.endswith("bias"):
                p.normal_()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    emus = layout_emus("reference_infer", tp, 2, 1, "hf", trainable=False)
    sspec = StateSpec(spec, Head.LM, trainable=False)
    pool.run({dev: (place_safetensors, (e.id, str(tmp_path), sspec, (tp, 2), e.position(i)))
              for e in emus for i, dev in enumerate(e.gpus)})
    try:
        b = lm_batch(spec.vocab_size)
        with StageRunner(pool, emus, rv) as run:
            got = run.full_logits(Batch(b.input_ids))
        with torch.no_grad():
            want = hf(b.input_ids).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    finally:
        drop_units(pool, emus)
