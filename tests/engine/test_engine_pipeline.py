"""The 1F1B order: every micro-batch forward then backward once, at most pp - pp_rank in flight
on a block, and an order in which no block waits on a message that is never sent; and the
tensors a block keeps for its sends in flight, which must not grow with the micro-batches."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.engine import generate as generate_mod
from nereus.engine import pipeline as pipeline_mod
from nereus.engine.batch import Batch
from nereus.engine.generate import Generator
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.losses import weighted_nll
from nereus.engine.model import ParallelModel
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import one_f_one_b
from nereus.engine.sampling import SamplingParams
from nereus.engine.train import TrainStep
from nereus.errors import InputError
from nereus.spec.model import MODEL_PRESETS, Head

from engine_testlib import in_threads, logical_state, shards_for


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


# ---------------------------------------------------------------- sends held by a real pipeline
# Every block of one replica runs in a thread of this process over in-process gloo groups (a
# HashStore rendezvous): the real schedules and point-to-point calls, no worker processes.


SPEC = MODEL_PRESETS["tiny-llama"]
SEQ = 8
ACT = SEQ * SPEC.hidden_size * 4   # bytes of one sequence's hidden states (fp32)
GLOO_TIMEOUT_S = 30.0   # a block that waits on a message never sent fails after this


class _Recorded:
    """A process group that records its point-to-point calls (op, peer, tag) in order."""

    def __init__(self, pg: Any, log: list[tuple[str, int, int]]):
        self._pg, self.log = pg, log

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        self.log.append(("send", dst, tag))
        return self._pg.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        self.log.append(("recv", src, tag))
        return self._pg.recv(tensors, src, tag)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pg, name)


# point-to-point calls by (communicator, pp_rank) of the last ``_on_blocks`` run
P2P: dict[tuple[str, int], list[tuple[str, int, int]]] = {}


def _on_blocks(pp: int, fn: Callable[[ParallelModel], Any], spec: Any = SPEC) -> dict[int, Any]:
    """``fn(model)`` on every block of a (tp=1, pp) replica of a seeded ``spec``, one thread
    per block; results by pp_rank. The first block's error is raised. Each block has the two
    PP communicators the runtime gives it (activations, gradients), recorded in ``P2P``."""
    store = dist.HashStore()
    full = logical_state(spec, Head.LM, seed=1)
    P2P.clear()

    def group(prefix: str, r: int) -> Any:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=GLOO_TIMEOUT_S)
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        pg = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), r, pp, opts)
        return _Recorded(pg, P2P.setdefault((prefix, r), []))

    def block(r: int) -> Any:
        groups = ParallelGroups(pp=group("pp/", r), pp_grad=group("ppg/", r),
                                stage=group("stage/", r))
        shards = shards_for(full, spec, Head.LM, 1, pp, 0, r)
        return fn(ParallelModel(spec, Head.LM, Position(pp=pp, pp_rank=r), shards, groups))

    # a hung block ends by the gloo timeout; daemon threads never block exit
    return in_threads(pp, block, GLOO_TIMEOUT_S)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Most bytes of sent tensors each block kept at once (by pp_rank), over the test."""
    peak: dict[int, int] = {}
    lock = threading.Lock()

    class Watched(pipeline_mod.PipeLinks):
        def send(self, t: torch.Tensor, dst: int, tag: int) -> None:
            super().send(t, dst, tag)
            kept = self.pending   # (work, tensor) per send kept, by tag or in a list
            entries = kept.values() if isinstance(kept, dict) else kept
            now = sum(x.numel() * x.element_size() for _, x in entries)
            with lock:
                r = self.model.pos.pp_rank
                peak[r] = max(peak.get(r, 0), now)

    monkeypatch.setattr(pipeline_mod, "PipeLinks", Watched)
    monkeypatch.setattr(generate_mod, "PipeLinks", Watched)
    return peak


def _batch(n: int) -> Batch:
    ids = torch.randint(0, SPEC.vocab_size, (n, SEQ), generator=torch.Generator().manual_seed(2))
    return Batch(ids, None, {"weight": torch.full((n, SEQ - 1), 1.0 / (n * (SEQ - 1)))})


def _train(n: int, pp: int, spec: Any = SPEC) -> dict[int, Any]:
    def step(m: ParallelModel) -> float | None:
        st = TrainStep(m, AdamState.zeros(m.params), AdamConfig(lr=1e-3), micro_batch=1)
        return st(_batch(n), weighted_nll).loss
    return _on_blocks(pp, step, spec)


@pytest.mark.parametrize("model,pp,n", [("tiny-llama", 2, 6), ("tiny-llama", 4, 9),
                                        ("tiny-qwen3", 2, 5), ("tiny-qwen3", 4, 3)])
def test_both_ends_of_a_pair_post_their_messages_in_the_same_order(model: str, pp: int,
                                                                     n: int) -> None:
    """NCCL matches a pair's sends and receives on one communicator in the order they were
    posted, tags ignored, and a send waits for its receive: so on each communicator, for each
    pair of blocks, one end's sends and receives must be the other end's receives and sends,
    message for message in the same order. A training step (1F1B, and the tied embedding's
    gradient exchange of tiny-qwen3) meets it; one communicator for both directions would
    not (an activation's send and a gradient's send cross in the steady state)."""
    _train(n, pp, MODEL_PRESETS[model])
    flip = {"send": "recv", "recv": "send"}
    pairs = 0
    for (prefix, r), log in P2P.items():
        for peer in {p for _, p, _ in log}:
            mine = [(op, tag) for op, p, tag in log if p == peer]
            theirs = [(flip[op], tag) for op, p, tag in P2P[(prefix, peer)] if p == r]
            assert mine == theirs, (prefix, r, peer, mine[:6], theirs[:6])
            pairs += 1
    assert pairs >= 4 * (pp - 1)   # each neighbouring pair, both ends, both communicators


@pytest.mark.parametrize("pp", [2, 4])
def test_1f1b_holds_a_bounded_number_of_sent_tensors(held: dict[int, int], pp: int) -> None:
    """A block keeps the tensors of the sends still in flight, not every tensor it sent in the
    step: the most it holds does not grow with the micro-batches and stays within pp of each
    direction. The step's loss is the one of a single block (pp = 1)."""
    want = _train(12, 1)[0]
    _train(2 * pp, pp)
    at_few = dict(held)
    held.clear()
    losses = _train(12, pp)
    assert held == at_few, "held bytes grew with the number of micro-batches"
    for r in range(pp):
        assert held[r] <= 2 * pp * ACT, (r, held[r])
    assert losses[pp - 1] == pytest.approx(want, rel=1e-5)


def test_forward_and_generation_hold_at_most_two_sends(held: dict[int, int]) -> None:
    """Inference keeps two micro-batches' sends at most; generation none past its step."""
    def run(m: ParallelModel) -> Any:
        out = pipeline_mod.forward_pipeline(m, _batch(10).split(1))
        toks = Generator(m).generate(Batch(_batch(2).input_ids),
                                     SamplingParams(max_new_tokens=6, temperature=0.0))
        return out, toks

    got = _on_blocks(2, run)
    assert len(got[1][0]) == 10 and torch.equal(got[0][1].tokens, got[1][1].tokens)
    assert set(held) == {0}   # the last block sends nothing
    assert held[0] <= 2 * ACT


class _FakeGroup:
    def __init__(self, backend: str, rank: int, size: int):
        self._backend, self._rank, self._size = backend, rank, size

    def name(self) -> str:
        return self._backend

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_an_nccl_pipeline_needs_its_gradient_communicator() -> None:
    pos = Position(pp=2, pp_rank=1)
    ParallelGroups(pp=_FakeGroup("gloo", 1, 2)).check(pos)  # gloo: gradients may share pp
    ParallelGroups(pp=_FakeGroup("nccl", 1, 2), pp_grad=_FakeGroup("nccl", 1, 2)).check(pos)
    with pytest.raises(InputError, match=r"groups\.pp_grad.*NCCL"):
        ParallelGroups(pp=_FakeGroup("nccl", 1, 2)).check(pos)
    with pytest.raises(InputError, match=r"groups\.pp_grad"):
        ParallelGroups(pp=_FakeGroup("gloo", 1, 2), pp_grad=_FakeGroup("gloo", 0, 2)).check(pos)
