"""What the engine reports as measured: time per op class (forward and backward) and peak
memory held, with where each number came from."""

from __future__ import annotations

import pytest
import torch

from nereus.cost.ops import OpClass
from nereus.engine.batch import Batch
from nereus.engine.groups import Position
from nereus.engine.layers import matmul
from nereus.engine.losses import weighted_nll
from nereus.engine.measure import (
    OTHER,
    Recorder,
    StageMeasurement,
    WorkerMeasurement,
    measured,
)
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.spec.model import MODEL_PRESETS, Head

from engine_testlib import logical_state, shards_for


def test_backward_of_a_timed_matmul_is_timed_too() -> None:
    torch.manual_seed(0)
    rec = Recorder("cpu")
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(48, 32, requires_grad=True)
    y = matmul(x, w, rec)
    assert len(rec._spans) == 1
    y.sum().backward()
    assert len(rec._spans) == 2 and rec.totals()[OpClass.GEMM.value] > 0


def test_nested_spans_count_once_and_decode_mode_maps_compute() -> None:
    rec = Recorder("cpu")
    with rec.span(OpClass.GEMM), rec.span(OpClass.ATTENTION):
        pass
    assert set(rec.totals()) == {"gemm"}
    rec.reset()
    rec.decode = True
    with rec.span(OpClass.ATTENTION):
        pass
    with rec.span(OpClass.ALLREDUCE_INTRA):
        pass
    assert set(rec.totals()) == {"decode", "allreduce.intra"}


def test_other_is_the_rest_of_the_wall_time() -> None:
    rec = Recorder("cpu")

    torch.manual_seed(0)

    def work() -> int:
        with rec.span(OpClass.GEMM):
            torch.randn(200, 200) @ torch.randn(200, 200)
        sum(range(20000))
        return 3

    res, wall, op_s, peak = measured(work, rec, torch.device("cpu"), 0, track_memory=False)
    assert res == 3 and peak is None
    assert abs(sum(op_s.values()) - wall) < 1e-6 and op_s[OTHER] > 0


def _engine() -> tuple[StageEngine, Batch]:
    spec = MODEL_PRESETS["tiny-llama"]
    full = logical_state(spec, Head.LM, seed=1)
    shards = shards_for(full, spec, Head.LM, 1, 1, 0, 0)
    eng = StageEngine(spec, Head.LM, Position(), shards, None, AdamState.zeros(shards),
                      AdamConfig())
    ids = torch.randint(0, spec.vocab_size, (4, 32), generator=torch.Generator().manual_seed(0))
    return eng, Batch(ids, None, {"weight": torch.full((4, 31), 1 / 124)})


def test_cpu_peak_memory_comes_from_allocator_events() -> None:
    eng, b = _engine()
    state = eng.state_bytes()
    grads = sum(p.numel() * 4 for p in eng.model.params.values())
    train = eng.train_step(b, weighted_nll, 2, track_memory=True).measurement
    assert train.profiled and train.state_bytes == state
    assert train.peak_mem_bytes is not None and train.peak_mem_bytes >= state + grads
    fwd = eng.forward(b, 2, track_memory=True).measurement
    assert fwd.peak_mem_bytes is not None and state < fwd.peak_mem_bytes < train.peak_mem_bytes
    timed = eng.forward(b, 2).measurement
    assert timed.peak_mem_bytes is None and not timed.profiled


def test_generation_times_prefill_as_compute_and_decode_as_decode() -> None:
    eng, b = _engine()
    m = eng.generate(Batch(b.input_ids[:, :8]), SamplingParams(max_new_tokens=4), 2).measurement
    assert {"gemm", "attention", "decode", OTHER} <= set(m.op_s)
    t = eng.train_step(b, weighted_nll, 2).measurement
    assert {"gemm", "attention", "optimizer"} <= set(t.op_s)


def test_stage_measurement_takes_the_slowest_worker() -> None:
    a = WorkerMeasurement(0, 0, 0, 1.0, {"gemm": 0.5, OTHER: 0.5}, 100, 50)
    b = WorkerMeasurement(0, 1, 0, 2.0, {"gemm": 0.2, "p2p.intra": 1.0, OTHER: 0.8}, None, 60)
    s = StageMeasurement.combine((a, b), stage="actor_train", kind="train", device="cpu", tp=1,
                                 pp=2, dp=1, micro_batch=1, grad_accum=2, sequences=2, tokens=8)
    assert s.wall_s == 2.0 and s.op_s == {"gemm": 0.5, "p2p.intra": 1.0, OTHER: 0.8}
    assert s.peak_mem_bytes == 100 and s.source == "measured"
    assert s.to_dict()["op_s"]["p2p.intra"] == 1.0


def test_telemetry_sums_a_stage_runs_and_keeps_op_classes_only() -> None:
    from nereus.engine.generate import GenerationResult
    from nereus.engine.telemetry import response_lengths, telemetry

    def sm(stage: str, wall: float, peak: int | None, ops: dict[str, float]) -> StageMeasurement:
        w = WorkerMeasurement(0, 0, 0, wall, ops, peak, 10)
        return StageMeasurement.combine((w,), stage=stage, kind="train", device="cpu", tp=1,
                                        pp=1, dp=1, micro_batch=1, grad_accum=1, sequences=1,
                                        tokens=1)

    runs = [sm("actor_train", 1.0, 100, {"gemm": 0.6, OTHER: 0.4}),
            sm("actor_train", 2.0, 300, {"gemm": 1.0, "allreduce.intra": 0.5, OTHER: 0.5}),
            sm("actor_gen", 3.0, None, {"decode": 2.0, OTHER: 1.0})]
    gen = GenerationResult(torch.zeros(2, 5, dtype=torch.long), torch.tensor([3, 5]))
    mean, longest = response_lengths([gen])
    t = telemetry(4, runs, [1, 0], mean, longest)
    assert (t.step, t.pool, t.response_len_mean, t.response_len_max) == (4, (0, 1), 4.0, 5)
    assert t.latency_s == {"actor_train": 3.0, "actor_gen": 3.0}
    assert t.peak_mem_bytes == {"actor_train": 300}
    assert t.op_times("actor_train") == {OpClass.GEMM: 1.6, OpClass.ALLREDUCE_INTRA: 0.5}
    assert t.op_times("actor_gen") == {OpClass.DECODE: 2.0} and t.source == "measured"


def test_telemetry_keeps_a_profiled_runs_memory_but_not_its_times() -> None:
    """The CPU memory run's times include the profiler's overhead: the controller must not
    learn latencies or op-class efficiencies from them."""
    from nereus.engine.telemetry import telemetry

    def sm(wall: float, peak: int | None, profiled: bool) -> StageMeasurement:
        w = WorkerMeasurement(0, 0, 0, wall, {"gemm": wall / 2, OTHER: wall / 2}, peak, 10,
                              profiled)
        return StageMeasurement.combine((w,), stage="actor_train", kind="train", device="cpu",
                                        tp=1, pp=1, dp=1, micro_batch=1, grad_accum=1,
                                        sequences=1, tokens=1)

    timed, memory_run = sm(1.0, None, False), sm(9.0, 500, True)
    assert memory_run.profiled and not timed.profiled and memory_run.to_dict()["profiled"]
    t = telemetry(0, [timed, memory_run], [0], 1.0, 1)
    assert t.latency_s == {"actor_train": 1.0}
    assert t.op_times("actor_train") == {OpClass.GEMM: 0.5}
    assert t.peak_mem_bytes == {"actor_train": 500}


def test_cpu_peak_on_a_worker_counts_every_unit_it_holds() -> None:
    """On a runtime worker the CPU peak starts from what the worker's byte counter holds, a
    co-resident unit included, as CUDA's allocator peak counts every tensor on the device
    (the cost model's estimate counts co-resident state too)."""
    from nereus.engine import remote
    from nereus.runtime.movement import place_seeded
    from nereus.runtime.state import StateSpec
    from nereus.runtime.workers import WorkerContext

    spec = MODEL_PRESETS["tiny-llama"]
    ctx = WorkerContext(0, torch.device("cpu"), 1 << 30)
    own = place_seeded(ctx, "actor", StateSpec(spec, Head.LM), (1, 1), (0, 0), seed=3)
    other = place_seeded(ctx, "ref", StateSpec(spec, Head.LM, trainable=False), (1, 1), (0, 0),
                         seed=4)
    remote.attach(ctx, "k", "actor", Position(), remote.GroupNames(), AdamConfig())
    _, b = _engine()
    _, m = remote.train(ctx, "k", b, weighted_nll, 2, None, True)
    grads = sum(p.numel() * 4 for p in ctx.units["actor"].params.values())
    assert m.state_bytes == own + other == ctx.memory.stats().held
    assert m.profiled and m.peak_mem_bytes is not None
    assert m.peak_mem_bytes >= own + other + grads
    _, f = remote.forward(ctx, "k", b, 2)   # a timed run: no memory, and says so
    assert f.peak_mem_bytes is None and not f.profiled and f.state_bytes == own + other


def test_an_engine_whose_unit_was_dropped_is_refused_before_it_computes() -> None:
    """A transition dropped (or replaced) the unit an engine computes on: forward, generate
    and train refuse, naming the unit, instead of running on (and training) bytes no unit
    holds; the unit placed again under the same id is a new unit, refused too until attached
    again."""
    from nereus.engine import remote
    from nereus.engine.sampling import SamplingParams
    from nereus.runtime.movement import destroy_member, place_seeded
    from nereus.runtime.state import StateSpec
    from nereus.runtime.workers import WorkerContext

    spec = StateSpec(MODEL_PRESETS["tiny-llama"], Head.LM)
    ctx = WorkerContext(0, torch.device("cpu"), 1 << 30)
    place_seeded(ctx, "actor", spec, (1, 1), (0, 0), seed=3)
    remote.attach(ctx, "k", "actor", Position(), remote.GroupNames(), AdamConfig())
    _, b = _engine()
    remote.forward(ctx, "k", b, 2)  # attached: runs
    destroy_member(ctx, "actor")
    place_seeded(ctx, "actor", spec, (1, 1), (0, 0), seed=3)
    held, meta = ctx.memory.stats().held, ctx.units["actor"].meta
    for call in (lambda: remote.forward(ctx, "k", b, 2),
                 lambda: remote.train(ctx, "k", b, weighted_nll, 2),
                 lambda: remote.generate(ctx, "k", b, SamplingParams(max_new_tokens=2), None)):
        with pytest.raises(RuntimeError, match="unit actor, which this worker no longer holds"):
            call()
    assert ctx.memory.stats().held == held and ctx.units["actor"].meta == meta
    remote.attach(ctx, "k", "actor", Position(), remote.GroupNames(), AdamConfig())
    remote.forward(ctx, "k", b, 2)
    with pytest.raises(KeyError, match="no engine attached under 'nope'"):
        remote.forward(ctx, "nope", b, 2)
