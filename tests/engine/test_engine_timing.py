"""Which class the recorder puts time under: waiting on a peer (the pipeline bubble, the skew
before a collective) is ``wait``, no op class, never p2p or allreduce or broadcast; the forward
that activation recompute reruns inside a backward node counts once.

Times here come from a fake clock that moves only where a test moves it (one side of an
exchange "computes" a fixed number of ticks), so every assertion is exact: it checks where the
ticks landed, not how long anything took.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from nereus.cost.ops import OpClass
from nereus.engine import comm, measure
from nereus.engine import generate as generate_mod
from nereus.engine import pipeline as pipeline_mod
from nereus.engine.batch import Batch
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.layers import matmul
from nereus.engine.losses import weighted_nll
from nereus.engine.measure import OTHER, WAIT, Recorder, StageMeasurement, measured
from nereus.engine.model import ParallelModel
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.engine.telemetry import telemetry
from nereus.engine.train import TrainStep
from nereus.spec.model import MODEL_PRESETS, Head

from engine_testlib import (
    FirstCalls,
    Tapped,
    gloo_group,
    in_threads,
    logical_state,
    on_replica,
    shards_for,
)

SPEC = MODEL_PRESETS["tiny-llama"]
P2P, ALLREDUCE, BROADCAST = "p2p.intra", "allreduce.intra", "broadcast.intra"


class Clock:
    """A shared clock that moves only by ``tick``."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def tick(self, n: float) -> None:
        with self._lock:
            self.now += n

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The recorder's and ``measured``'s clock, replaced by a fake one."""
    c = Clock()
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=c))
    return c


def _pair(fn: Callable[[int, Any], Any]) -> dict[int, Any]:
    """``fn(rank, group)`` on both members of an in-process gloo group of two."""
    import torch.distributed as dist

    store = dist.HashStore()
    return in_threads(2, lambda r: fn(r, gloo_group(store, "pair/", r, 2)))


# ---------------------------------------------------------------- collectives alone
def test_a_blocked_receive_waits_as_wait_and_only_the_transfer_is_p2p(clock: Clock) -> None:
    """The receiver posts first; the sender computes 10 ticks, then sends. Those 10 ticks are
    the receiver's wait for its peer, not a slow link."""
    calls = FirstCalls()

    def run(rank: int, pg: Any) -> dict[str, float]:
        rec = Recorder("cpu")
        if rank == 1:
            t = comm.recv(torch.zeros(4), 0, Tapped(pg, calls), rec, tag=3)
            assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
        else:
            assert calls.event("recv").wait(30)     # the receiver is waiting
            clock.tick(10)       # the sender's compute, while the receiver waits
            comm.send(torch.tensor([1.0, 2.0, 3.0, 4.0]), 1, pg, tag=3).wait()
        return rec.totals()

    got = _pair(run)[1]
    assert got.get(P2P, 0.0) == 0.0 and got.get(WAIT) == 10


@pytest.mark.parametrize("kind", ["allreduce", "broadcast"])
def test_a_collective_reached_late_by_a_peer_times_the_skew_as_wait(clock: Clock,
                                                                    kind: str) -> None:
    calls = FirstCalls()

    def run(rank: int, pg: Any) -> dict[str, float]:
        rec = Recorder("cpu")
        t = torch.full((3,), float(rank + 1))
        if rank == 1:
            pg = Tapped(pg, calls)
        else:
            assert calls.event("collective").wait(30)   # the other member is in
            clock.tick(10)       # the late member's compute
        if kind == "allreduce":
            comm.all_reduce(t, pg, rec, wait_peers=True)
            assert t.tolist() == [3.0, 3.0, 3.0]
        else:
            comm.broadcast(t, 0, pg, rec, wait_peers=True)
            assert t.tolist() == [1.0, 1.0, 1.0]
        return rec.totals()

    got = _pair(run)[1]
    assert got.get(WAIT) == 10
    assert got.get(ALLREDUCE if kind == "allreduce" else BROADCAST, 0.0) == 0.0


# ---------------------------------------------------------------- in the pipeline
def test_a_pipeline_step_reports_its_bubble_as_wait_not_as_communication(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """pp = 2. The first block computes 10 ticks before its first forward (the last block
    waits in its first receive: the fill bubble) and 100 before the gradient-norm all-reduce
    (the last block ended its backward first and waits there: the drain). Every one of those
    ticks is the last block's waiting: none is p2p or allreduce, none reaches the telemetry
    the calibrator learns from."""
    calls = FirstCalls()
    norm = TrainStep._global_norm

    def late_norm(self: TrainStep, grads: dict[str, torch.Tensor]) -> float:
        if self.model.pos.first:
            assert calls.event("pp", 1, "allreduce").wait(30)
            clock.tick(100)
        return norm(self, grads)

    monkeypatch.setattr(TrainStep, "_global_norm", late_norm)
    n, s = 4, 8
    ids = torch.randint(0, SPEC.vocab_size, (n, s), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, None, {"weight": torch.full((n, s - 1), 1.0 / (n * (s - 1)))})

    def block(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> Any:
        eng = StageEngine(SPEC, Head.LM, pos, shards, groups, AdamState.zeros(shards),
                          AdamConfig())
        if pos.first:
            forward = eng.model.stage_forward
            first = [True]

            def late_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
                if first[0]:
                    first[0] = False
                    assert calls.event("pp", 1, "recv").wait(30)
                    clock.tick(10)
                return forward(*args, **kwargs)

            eng.model.stage_forward = late_forward  # type: ignore[method-assign]
        return eng.train_step(batch, weighted_nll, micro_batch=1).measurement

    got = on_replica(SPEC, Head.LM, 1, 2, block, tap=calls)
    first, last = got[(0, 0)], got[(1, 0)]
    assert last.op_s.get(P2P, 0.0) == 0.0 and last.op_s.get(ALLREDUCE, 0.0) == 0.0
    assert last.op_s[WAIT] == 110 and last.wall_s == 110
    assert first.op_s[OTHER] == 110 and first.op_s.get(WAIT, 0.0) == 0.0
    both = StageMeasurement.combine((first, last), stage="actor_train", kind="train",
                                    device="cpu", tp=1, pp=2, dp=1, micro_batch=1, grad_accum=4,
                                    sequences=n, tokens=n * s)
    assert both.op_s[WAIT] == 110 and both.op_s.get(P2P, 0.0) == 0.0
    tel = telemetry(0, [both], [0, 1], 1.0, 1)
    assert tel.op_time_s.get("actor_train", {}) == {}   # no op class took a tick


def test_a_late_replica_is_wait_in_the_dp_all_reduce_not_a_slow_link(clock: Clock) -> None:
    """dp = 2. Replica 1 computes 10 ticks in its loss while replica 0, done with its backward,
    waits in the DP gradient all-reduce: those ticks are replica 0's wait for a peer, none of
    them the all-reduce's transfer."""
    import torch.distributed as dist

    calls = FirstCalls()
    n, s = 4, 8
    ids = torch.randint(0, SPEC.vocab_size, (n, s), generator=torch.Generator().manual_seed(0))
    weight = torch.full((n, s - 1), 1.0 / (n * (s - 1)))
    full = logical_state(SPEC, Head.LM, seed=1)
    store = dist.HashStore()

    def late_loss(out: Any, mb: Batch) -> torch.Tensor:
        if mb.index is not None and int(mb.index[0]) >= n // 2:   # replica 1's rows
            assert calls.event("collective").wait(30)   # replica 0 is in the all-reduce
            clock.tick(10)
        return weighted_nll(out, mb)

    def replica(d: int) -> Any:
        dp = gloo_group(store, "dp/", d, 2)
        groups = ParallelGroups(dp=Tapped(dp, calls) if d == 0 else dp,
                                stage=gloo_group(store, "stage/", d, 2))
        shards = shards_for(full, SPEC, Head.LM, 1, 1, 0, 0)
        eng = StageEngine(SPEC, Head.LM, Position(dp=2, dp_rank=d), shards, groups,
                          AdamState.zeros(shards), AdamConfig())
        rows = slice(d * n // 2, (d + 1) * n // 2)
        part = Batch(ids[rows], None, {"weight": weight[rows]}, torch.arange(n)[rows])
        return eng.train_step(part, late_loss, micro_batch=2).measurement

    early = in_threads(2, replica)[0]
    assert early.op_s.get(WAIT) == 10 and early.op_s.get(ALLREDUCE, 0.0) == 0.0


def test_a_send_kept_until_a_slow_next_block_takes_it_is_wait(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """pp = 2 forward: the last block computes 10 ticks in its first micro-batch's head while
    the first block, having sent micro-batch 2, waits for it to take micro-batch 1 (gloo ends
    a send only once its receive is posted, which the last block does after that head). The
    first block's ticks are waiting, not its own work (``other``)."""
    calls = FirstCalls()
    settling = threading.local()
    wait = comm.Sent.wait

    class Links(pipeline_mod.PipeLinks):
        def settle(self, tag: int) -> None:
            settling.tag = tag
            super().settle(tag)

    def watched(self: comm.Sent) -> None:
        if getattr(settling, "tag", None) == 2:   # micro-batch 1's send (tag 2 i + forward)
            calls.event("settle").set()   # inside the first block's waiting span
        wait(self)

    monkeypatch.setattr(pipeline_mod, "PipeLinks", Links)
    monkeypatch.setattr(comm.Sent, "wait", watched)
    head = pipeline_mod.head_output
    slow = [True]

    def slow_head(*args: Any, **kwargs: Any) -> Any:
        if slow[0]:
            slow[0] = False
            assert calls.event("settle").wait(30)
            clock.tick(10)
        return head(*args, **kwargs)

    monkeypatch.setattr(pipeline_mod, "head_output", slow_head)
    ids = torch.randint(0, SPEC.vocab_size, (4, 6), generator=torch.Generator().manual_seed(0))

    def block(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> Any:
        return StageEngine(SPEC, Head.LM, pos, shards, groups).forward(Batch(ids), 1).measurement

    first = on_replica(SPEC, Head.LM, 1, 2, block)[(0, 0)]
    assert first.op_s.get(WAIT) == 10 and first.op_s.get(OTHER, 0.0) == 0.0


def test_the_tied_embedding_exchange_is_timed_as_the_all_reduce_the_cost_model_prices(
        ) -> None:
    """tiny-qwen3 ties its embedding: at pp = 2 the first and last blocks add each other's
    gradient with a send and a receive, which the cost model prices as a two-member
    all-reduce; the transfer is timed under that class, so the calibrator compares like
    with like."""
    spec = MODEL_PRESETS["tiny-qwen3"]
    assert spec.tie_embeddings

    def block(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> Any:
        m = ParallelModel(spec, Head.LM, pos, shards, groups)
        seen: list[str] = []
        span = m.rec.span

        def spy(cls: Any) -> Any:
            seen.append(str(getattr(cls, "value", cls)))
            return span(cls)

        m.rec.span = spy  # type: ignore[method-assign]
        step = TrainStep(m, AdamState.zeros(m.params), AdamConfig(), micro_batch=1)
        step._sync_tied({n: torch.ones_like(p, dtype=torch.float32)
                         for n, p in m.params.items()})
        return seen

    got = on_replica(spec, Head.LM, 1, 2, block)
    assert got == {(0, 0): [ALLREDUCE], (1, 0): [ALLREDUCE]}


def test_generation_times_the_wait_for_the_sampled_tokens_as_wait(
        clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """pp = 2: the last block samples for 10 ticks while the first waits for the tokens."""
    calls = FirstCalls()
    sample = generate_mod.sample

    def slow_sample(*args: Any) -> torch.Tensor:
        assert calls.event("pp", 0, "collective").wait(30)   # the first block waits for it
        clock.tick(10)
        return sample(*args)

    monkeypatch.setattr(generate_mod, "sample", slow_sample)
    prompts = Batch(torch.randint(0, SPEC.vocab_size, (2, 5),
                                  generator=torch.Generator().manual_seed(1)))

    def block(pos: Position, shards: dict[str, torch.Tensor], groups: ParallelGroups) -> Any:
        eng = StageEngine(SPEC, Head.LM, pos, shards, groups)
        sp = SamplingParams(max_new_tokens=1, temperature=0.0)
        return eng.generate(prompts, sp).measurement

    first = on_replica(SPEC, Head.LM, 1, 2, block, tap=calls)[(0, 0)]
    assert first.op_s.get(BROADCAST, 0.0) == 0.0 and first.op_s[WAIT] == 10


# ---------------------------------------------------------------- nested spans
def test_a_span_inside_an_open_backward_span_is_taken_out_of_it(clock: Clock) -> None:
    """Work that runs inside a backward node (here: an attention span the unpacking of a saved
    tensor opens, as recompute does) counts under its own class only."""
    rec = Recorder("cpu")
    x = torch.randn(8, 4, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)

    def unpack(t: torch.Tensor) -> torch.Tensor:
        with rec.span(OpClass.ATTENTION):
            clock.tick(1)
        return t

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
        y = matmul(x, w, rec)
    y.sum().backward()
    got = rec.totals()
    assert got[OpClass.ATTENTION.value] == 2       # x and w unpacked inside the gemm node
    assert got[OpClass.GEMM.value] == 0


class _GemmTicks(Recorder):
    """A recorder under which every forward GEMM takes one tick of the fake clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__("cpu")
        self.clock = clock

    def span(self, cls: OpClass) -> Any:
        inner = super().span(cls)

        @contextmanager
        def ticking() -> Iterator[None]:
            with inner:
                if cls is OpClass.GEMM:
                    self.clock.tick(1)
                yield
        return ticking()


def test_recompute_counts_the_rerun_forward_once(clock: Clock) -> None:
    """With recompute, each layer's forward reruns inside its first backward node: its GEMMs
    count once, as GEMM, and the classes add up to the wall time (here all of it is GEMM)."""
    full = logical_state(SPEC, Head.LM, seed=1)
    ids = torch.randint(0, SPEC.vocab_size, (4, 8), generator=torch.Generator().manual_seed(0))
    batch = Batch(ids, None, {"weight": torch.full((4, 7), 1.0 / 28)})
    got = {}
    for recompute in (False, True):
        shards = shards_for(full, SPEC, Head.LM, 1, 1, 0, 0)
        m = ParallelModel(SPEC, Head.LM, Position(), shards, recorder=_GemmTicks(clock))
        step = TrainStep(m, AdamState.zeros(shards), AdamConfig(), 2, recompute=recompute)
        _, wall, op_s, _ = measured(lambda step=step: step(batch, weighted_nll), m.rec,
                                    torch.device("cpu"), 0, track_memory=False)
        assert op_s[OpClass.GEMM.value] == wall and op_s[OTHER] == 0
        assert sum(op_s.values()) == wall
        got[recompute] = op_s[OpClass.GEMM.value]
    # the rerun: 7 GEMMs per layer (q, k, v, o, gate, up, down) per micro-batch
    assert got[True] - got[False] == 7 * SPEC.num_layers * 2
