"""What a stage really cost on one worker: wall time per op class and peak memory held.

The calibrator learns one efficiency per op class (``nereus.cost.ops``), so the engine times its
work by the same classes: every matmul (forward in a span, backward through hooks on its autograd
node) is ``gemm``, attention ``attention``, decode iterations ``decode``, the Adam update
``optimizer``, each collective its kind on its link. Whatever falls outside a span (norms, rotary,
softmax of the loss, Python) is reported as ``other``.

Time: ``time.perf_counter`` on CPU; CUDA events on a GPU, read once at the end of the stage so
timing does not serialize the stream. Memory: on CUDA the caching allocator's peak
(``torch.cuda.max_memory_allocated``: every tensor on the device, co-resident state included);
on CPU, where torch keeps no allocator statistics, the peak of the allocation events of the CPU
allocator recorded by ``torch.profiler`` (``profile_memory``), added to the bytes the worker
held when the stage began (its byte counter's count, ``StageEngine.resident_bytes``). The
profiler slows small ops, so on CPU memory is measured in a step of its own (``track_memory``):
its measurement says ``profiled``, and its times stay out of the telemetry
(``nereus.engine.telemetry``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from nereus.cost.ops import OpClass

OTHER = "other"  # wall time outside every op-class span
T = TypeVar("T")


def _now(device: torch.device) -> Any:
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


class Recorder:
    """Accumulates wall time per op class on one worker (not thread-safe; one per worker).

    ``decode`` mode maps compute classes (gemm, attention) to ``decode``: a decode iteration
    reads every weight and the KV cache for one token per sequence, which the cost model prices
    as one memory-bound op class.
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.device = torch.device(device)
        self.enabled = enabled
        self.decode = False
        self._spans: list[tuple[str, Any, Any]] = []
        self._open: dict[int, tuple[str, Any]] = {}
        self._depth = 0

    def _cls(self, cls: OpClass) -> str:
        if self.decode and cls in (OpClass.GEMM, OpClass.ATTENTION):
            return OpClass.DECODE.value
        return cls.value

    @contextmanager
    def span(self, cls: OpClass) -> Iterator[None]:
        """Time the enclosed work as ``cls``; a span inside another span is not counted twice."""
        if not self.enabled or self._depth:
            yield
            return
        name = self._cls(cls)
        self._depth += 1
        start = _now(self.device)
        try:
            yield
        finally:
            self._depth -= 1
            self._spans.append((name, start, _now(self.device)))

    def time_backward(self, out: torch.Tensor, cls: OpClass) -> torch.Tensor:
        """Time the backward of the autograd node that produced ``out`` as ``cls``."""
        node = out.grad_fn
        if not self.enabled or node is None:
            return out
        name = self._cls(cls)
        key = id(node)

        def pre(_grad_outputs: Any) -> None:
            self._open[key] = (name, _now(self.device))

        def post(_grad_inputs: Any, _grad_outputs: Any) -> None:
            opened = self._open.pop(key, None)
            if opened is not None:
                self._spans.append((opened[0], opened[1], _now(self.device)))

        node.register_prehook(pre)
        node.register_hook(post)
        return out

    def totals(self) -> dict[str, float]:
        """Seconds per op class since the last reset (synchronizes a CUDA device)."""
        if self.device.type == "cuda" and self._spans:
            torch.cuda.synchronize(self.device)
        out: dict[str, float] = {}
        for name, start, end in self._spans:
            dt = start.elapsed_time(end) / 1e3 if self.device.type == "cuda" else end - start
            out[name] = out.get(name, 0.0) + dt
        return out

    def reset(self) -> None:
        self._spans.clear()
        self._open.clear()


@dataclass(frozen=True)
class WorkerMeasurement:
    """One worker's share of one stage operation. ``source`` is always ``measured``."""

    tp_rank: int
    pp_rank: int
    dp_rank: int
    wall_s: float
    op_s: Mapping[str, float]          # op class value (or "other") -> seconds
    peak_mem_bytes: int | None         # None when memory was not tracked
    state_bytes: int                   # bytes the worker held when the operation began
    profiled: bool = False             # CPU memory run: times include the profiler's overhead
    source: str = "measured"


@dataclass(frozen=True)
class StageMeasurement:
    """A model-stage operation measured on its workers: what the controller's telemetry and the
    cost model's calibrator consume.

    ``wall_s`` is the slowest worker's wall time (the stage ends when its last worker does);
    ``op_s`` per class is the largest over workers (the critical replica's share of each class);
    ``peak_mem_bytes`` the largest over workers. ``profiled``: a CPU memory run, whose times
    include the profiler's overhead.
    """

    stage: str
    kind: str                           # "train", "forward" or "generate"
    device: str                         # "cpu" or the CUDA device name
    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    sequences: int                      # sequences processed by all replicas
    tokens: int                         # tokens processed (prompt + generated for generation)
    wall_s: float
    op_s: Mapping[str, float]
    peak_mem_bytes: int | None
    workers: tuple[WorkerMeasurement, ...] = field(default=(), repr=False)
    profiled: bool = False
    source: str = "measured"

    @classmethod
    def combine(cls, workers: tuple[WorkerMeasurement, ...], **info: Any) -> StageMeasurement:
        classes = sorted({c for w in workers for c in w.op_s})
        op_s = {c: max(w.op_s.get(c, 0.0) for w in workers) for c in classes}
        peaks = [w.peak_mem_bytes for w in workers if w.peak_mem_bytes is not None]
        return cls(wall_s=max(w.wall_s for w in workers), op_s=op_s,
                   peak_mem_bytes=max(peaks) if peaks else None, workers=workers,
                   profiled=any(w.profiled for w in workers), **info)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "kind": self.kind, "device": self.device, "tp": self.tp,
                "pp": self.pp, "dp": self.dp, "micro_batch": self.micro_batch,
                "grad_accum": self.grad_accum, "sequences": self.sequences,
                "tokens": self.tokens, "wall_s": self.wall_s, "op_s": dict(self.op_s),
                "peak_mem_bytes": self.peak_mem_bytes, "profiled": self.profiled,
                "source": self.source}


def tensor_bytes(tensors: Mapping[str, torch.Tensor] | list[torch.Tensor]) -> int:
    """Bytes of distinct storages among ``tensors`` (views and shared storages counted once)."""
    seen: dict[int, int] = {}
    items = tensors.values() if isinstance(tensors, Mapping) else tensors
    for t in items:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def measured(fn: Callable[[], T], recorder: Recorder, device: torch.device, state_bytes: int,
             track_memory: bool) -> tuple[T, float, dict[str, float], int | None]:
    """Run ``fn`` and return (result, wall_s, seconds per class, peak bytes or None).

    On CPU with ``track_memory`` the profiler records allocations; times of that run are inflated
    by the profiler, so callers report them as memory-run times (see module docstring).
    """
    recorder.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    if track_memory and device.type == "cpu":
        result, peak_delta = _cpu_peak(fn)
    else:
        result, peak_delta = fn(), None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    op_s = recorder.totals()
    op_s[OTHER] = max(0.0, wall - sum(op_s.values()))
    peak: int | None
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device)) if track_memory else None
    else:
        peak = state_bytes + peak_delta if peak_delta is not None else None
    return result, wall, op_s, peak


def _cpu_peak(fn: Callable[[], T]) -> tuple[T, int]:
    """Peak bytes allocated on top of what was live when ``fn`` began (CPU allocator events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = prof.profiler.kineto_results.events() if prof.profiler else []
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in deltas:
        live += nbytes
        peak = max(peak, live)
    return result, peak
