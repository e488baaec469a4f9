"""Input the engine refuses before it computes or changes anything: an empty batch, token ids
outside the vocabulary (alike at every TP size, on the worker and on the driver before any
worker starts), and parameters torch itself would refuse; and what it accepts: any id at a
padded position (a pad id of -1), which it never reads as a token."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from test_engine_runner_close import EMUS, _Pool, _Rendezvous

from nereus.engine import remote
from nereus.engine.batch import Batch
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.losses import weighted_nll
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.runner import StageRunner
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.engine.train import TrainStep
from nereus.errors import InputError
from nereus.spec.model import MODEL_PRESETS, Head

from engine_testlib import logical_state, on_replica, shards_for

LLAMA = MODEL_PRESETS["tiny-llama"]
QWEN = MODEL_PRESETS["tiny-qwen3"]   # vocabulary 250, padded to 256: 252 is a padding row


def _engine(spec: Any = LLAMA, seed: int = 1) -> tuple[StageEngine, dict[str, torch.Tensor]]:
    shards = shards_for(logical_state(spec, Head.LM, seed=seed), spec, Head.LM, 1, 1, 0, 0)
    return StageEngine(spec, Head.LM, Position(), shards, None, AdamState.zeros(shards),
                       AdamConfig(lr=1e-3, weight_decay=0.1)), shards


def _unchanged(eng: StageEngine, before: dict[str, torch.Tensor]) -> bool:
    """No update ran: step 0, the parameters as ``before``, Adam's moments still zero."""
    st = eng.adam_state
    assert st is not None
    return (st.step == 0 and all(torch.equal(eng.model.params[k], v) for k, v in before.items())
            and not any(t.any() for t in (*st.exp_avg.values(), *st.exp_avg_sq.values())))


# ---------------------------------------------------------------- empty batches, failed steps
def test_an_empty_batch_is_refused_before_the_state_changes() -> None:
    eng, shards = _engine()
    before = {k: v.clone() for k, v in shards.items()}
    empty = Batch(torch.zeros(0, 8, dtype=torch.long), None, {"weight": torch.zeros(0, 7)})
    with pytest.raises(InputError, match=r"^batch: has no sequences"):
        eng.train_step(empty, weighted_nll, micro_batch=2)
    with pytest.raises(InputError, match=r"^batch: has no sequences"):
        empty.split(1)
    with pytest.raises(InputError, match=r"^batch: has no sequences"):
        TrainStep(eng.model, eng.adam_state, eng.adam, 1)(empty, weighted_nll)
    with pytest.raises(InputError, match=r"^prompts: has no sequences"):
        eng.generate(Batch(torch.zeros(0, 4, dtype=torch.long)), SamplingParams())
    assert _unchanged(eng, before)


def test_a_step_whose_loss_fails_leaves_parameters_and_optimizer_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's loss is summed before the update: when that fails, nothing has moved."""
    eng, shards = _engine()
    before = {k: v.clone() for k, v in shards.items()}

    def broken(self: TrainStep, losses: list[torch.Tensor]) -> float:
        raise RuntimeError("the loss all-reduce failed")

    monkeypatch.setattr(TrainStep, "_commit", broken)
    ids = torch.randint(0, LLAMA.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="loss all-reduce"):
        eng.train_step(Batch(ids, None, {"weight": torch.full((2, 7), 0.1)}), weighted_nll, 1)
    assert _unchanged(eng, before)


def test_a_step_with_a_non_finite_gradient_norm_skips_its_update() -> None:
    """A nan loss makes every gradient nan: the update would write nan into every parameter
    and moment. It is skipped instead, as verl skips it (every worker has the same norm, so
    all skip): the step says so and nothing has moved; the next step updates."""
    eng, shards = _engine()
    before = {k: v.clone() for k, v in shards.items()}

    def nan_loss(out: Any, mb: Batch) -> torch.Tensor:
        return weighted_nll(out, mb) * float("nan")

    ids = torch.randint(0, LLAMA.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, None, {"weight": torch.full((2, 7), 0.1)})
    res = eng.train_step(batch, nan_loss, 1).result
    assert res.skipped and math.isnan(res.grad_norm) and res.step == 0
    assert _unchanged(eng, before)
    res = eng.train_step(batch, weighted_nll, 1).result
    assert not res.skipped and res.step == 1


def test_a_last_all_reduce_that_did_not_count_every_worker_updates_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The step reads, on the host, how many workers its last all-reduce summed before it
    updates (on NCCL an aborted all-reduce would otherwise let the queued update run): a
    count short of the stage's workers fails the step with the state as it was."""
    from nereus.engine import train as train_mod

    eng, shards = _engine()
    before = {k: v.clone() for k, v in shards.items()}
    reduce = train_mod.all_reduce

    def short(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = reduce(t, *args, **kwargs)
        if t.dtype == torch.float64 and t.numel() == 2:  # the commit: (loss, workers)
            out[1] -= 1
        return out

    monkeypatch.setattr(train_mod, "all_reduce", short)
    ids = torch.randint(0, LLAMA.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match=r"last all-reduce counted 0 of 1 workers: update "
                                           r"skipped"):
        eng.train_step(Batch(ids, None, {"weight": torch.full((2, 7), 0.1)}), weighted_nll, 1)
    assert _unchanged(eng, before)


def test_the_driver_refuses_an_empty_batch_before_any_worker_starts() -> None:
    runner = StageRunner(_Pool(), EMUS, _Rendezvous())
    with pytest.raises(InputError, match=r"^batch: has no sequences"):
        runner.forward(Batch(torch.zeros(0, 4, dtype=torch.long)), micro_batch=1)
    assert runner.pool.called(remote.forward) == set()
    runner.close()


# ---------------------------------------------------------------- token ids
@pytest.mark.parametrize("bad", [252, 250, -1, 10**6])
@pytest.mark.parametrize("tp", [1, 2])
def test_a_token_id_outside_the_vocabulary_is_refused_at_every_tp(bad: int, tp: int) -> None:
    """At tp = 1 such an id failed inside the embedding (IndexError), at tp = 2 no rank owned
    it and it embedded as zeros; a target out of range picked a padding logit (-inf) or
    another rank's nothing. Both layouts now refuse it alike, naming the field."""
    for where in (2, 4):    # an input (and target) id; the last one: a target only too
        ids = torch.tensor([[1, 2, 3, 4, 5]])
        ids[0, where] = bad

        def run(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups,
                ids: torch.Tensor = ids) -> Any:
            eng = StageEngine(QWEN, Head.LM, pos, shards, groups, AdamState.zeros(shards),
                              AdamConfig())
            with pytest.raises(InputError, match=r"^batch\.input_ids: token id") as info:
                eng.forward(Batch(ids), 1)
            with pytest.raises(InputError, match=r"^batch\.input_ids"):
                eng.train_step(Batch(ids, None, {"weight": torch.ones(1, 4)}), weighted_nll, 1)
            with pytest.raises(InputError, match=r"^prompts\.input_ids"):
                eng.generate(Batch(ids), SamplingParams(max_new_tokens=1))
            return str(info.value)

        got = on_replica(QWEN, Head.LM, tp, 1, run)
        assert all(f"token id {bad} " in msg and "0..249" in msg for msg in got.values())


@pytest.mark.parametrize("tp", [1, 2])
def test_a_padded_position_may_hold_any_id_and_is_never_read(tp: int) -> None:
    """Pad ids (-1, or anything) at attention_mask 0 are legal: the outputs are those of the
    same batch with 0 there, bitwise, at every TP size."""
    ids = torch.tensor([[7, 8, 9, 10, 11, 12], [3, 4, 5, 6, 7, 8]])
    am = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])   # left and right padding

    def with_pad(pad: int) -> Batch:
        return Batch(ids.masked_fill(am == 0, pad), am)

    def run(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> Any:
        eng = StageEngine(QWEN, Head.LM, pos, shards, groups)
        return [eng.forward(with_pad(p), 1).result for p in (0, -1, 10**6)]

    got = on_replica(QWEN, Head.LM, tp, 1, run)[(0, 0)]
    zero = got[0].logprobs
    assert zero is not None and torch.isfinite(zero).all()
    for out in got[1:]:
        assert torch.equal(out.logprobs, zero)


def test_a_finished_sequence_never_feeds_its_pad_token_back() -> None:
    """Generation goes on for the rows still running; a finished row's next input is a token
    it drew, not ``pad_token`` (-1 is no token: at tp = 1 it failed in the embedding)."""
    eng, _ = _engine(LLAMA, seed=16)
    prompts = Batch(torch.randint(0, LLAMA.vocab_size, (2, 5),
                                  generator=torch.Generator().manual_seed(17)))
    free = eng.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0), 2).result
    row0, row1 = free.tokens.tolist()
    stop = next(t for t in row0 if t not in row1)     # ends row 0 only
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, stop_tokens=(stop,), pad_token=-1)
    got = eng.generate(prompts, sp, 2).result
    n = row0.index(stop) + 1
    assert got.lengths.tolist() == [n, 6]
    assert got.tokens[0, :n].tolist() == row0[:n] and bool((got.tokens[0, n:] == -1).all())
    assert got.tokens[1].tolist() == row1


class _VocabPool(_Pool):
    """The stand-in pool, its workers' attach answering the model's vocabulary size."""

    def run(self, calls: Any, timeout_s: float | None = None,
            release: Any = None) -> dict[int, Any]:
        out = super().run(calls, timeout_s, release)
        return {d: QWEN.vocab_size if calls[d][0] is remote.attach else r
                for d, r in out.items()}


def test_the_driver_refuses_token_ids_outside_the_vocabulary_before_any_worker_starts() -> None:
    """A replica refusing its rows on its workers would leave the other replicas in the DP
    all-reduce: the driver checks every replica's rows first."""
    runner = StageRunner(_VocabPool(), EMUS, _Rendezvous())
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    ids[1, 1] = 250                                   # in the second replica's rows
    for call in (lambda b: runner.forward(b, 1),
                 lambda b: runner.train_step(b, weighted_nll, 1),
                 lambda b: runner.generate(b, SamplingParams())):
        with pytest.raises(InputError, match=r"input_ids: token id 250 \(sequence 1"):
            call(Batch(ids))
    assert {remote.forward, remote.train, remote.generate}.isdisjoint(
        fn for fn, _, _ in runner.pool.calls)
    pad = Batch(ids, torch.tensor([[1, 1, 1], [1, 0, 1]]))   # the same id, padded: accepted
    assert [r.size for r in runner._rows(pad, 1)] == [1, 1]
    runner.close()


# ---------------------------------------------------------------- parameters
@pytest.mark.parametrize("field,kwargs", [
    ("seed", {"seed": 2**63}), ("seed", {"seed": -2**63 - 1}), ("seed", {"seed": 1.5}),
    ("temperature", {"temperature": math.nan}), ("temperature", {"temperature": math.inf}),
    ("max_new_tokens", {"max_new_tokens": 2.5}), ("max_new_tokens", {"max_new_tokens": True}),
    ("top_p", {"top_p": math.nan}), ("pad_token", {"pad_token": 0.5}),
    ("stop_tokens", {"stop_tokens": (1.5,)})])
def test_sampling_parameters_torch_or_the_noise_would_choke_on_are_refused(
        field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InputError, match=rf"^sampling\.{field}:"):
        SamplingParams(**kwargs)


def test_sampling_accepts_the_edges() -> None:
    SamplingParams(seed=2**63 - 1, temperature=0.0, max_new_tokens=1)
    SamplingParams(seed=-2**63, temperature=1e-3, pad_token=-1, stop_tokens=(0, 5))


@pytest.mark.parametrize("field,value", [
    ("lr", -1e-3), ("lr", math.inf), ("lr", math.nan),
    ("eps", -1.0), ("eps", math.nan), ("eps", math.inf),
    ("weight_decay", -0.5), ("weight_decay", math.inf), ("weight_decay", math.nan),
    ("beta1", 1.0), ("beta1", math.nan), ("beta2", -0.1), ("beta2", math.inf),
    ("lr", "1e-3"), ("beta1", True), ("max_grad_norm", 0.0), ("max_grad_norm", math.inf),
    ("max_grad_norm", "1.0")])
def test_adam_parameters_are_checked_as_torch_checks_them_and_finite(field: str,
                                                                       value: float) -> None:
    with pytest.raises(InputError, match=rf"^adam\.{field}:"):
        AdamConfig(**{field: value})


def test_numpy_numbers_are_numbers_to_adam_and_sampling() -> None:
    """Values read from an array (a sweep, a config loaded with numpy) pass like Python's."""
    cfg = AdamConfig(lr=np.float32(1e-3), beta1=np.float64(0.9), max_grad_norm=np.float64(1.0))
    assert cfg.lr == np.float32(1e-3)
    SamplingParams(max_new_tokens=np.int64(4), temperature=np.float32(0.7), top_p=np.float64(1),
                   seed=np.int32(3), pad_token=np.int64(-1), stop_tokens=(np.int16(2),))


def test_adam_accepts_what_torch_accepts_at_the_edges() -> None:
    cfg = AdamConfig(lr=0.0, eps=0.0, weight_decay=0.0, beta1=0.0, beta2=0.0)
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=cfg.lr, eps=cfg.eps,
                      weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2))
