"""What a stage really cost on one worker: wall time per op class and peak memory held.

The calibrator learns one efficiency per op class (``nereus.cost.ops``), so the engine times its
work by the same classes: every matmul (forward in a span, backward through hooks on its autograd
node) is ``gemm``, attention ``attention``, decode iterations ``decode``, the Adam update
``optimizer``, each collective its kind on its link. Whatever falls outside a span (norms, rotary,
softmax of the loss, Python) is reported as ``other``. Time spent blocked on a peer (a pipeline
block waiting for its neighbour's compute, the bubble, the skew before a collective whose members
arrive at different times) is ``wait``: like ``other`` it is no op class, so it never reaches
the calibrator, which would read it as a slow link (``nereus.engine.comm``). Spans do not
overlap in what they count: a span opened inside an open backward span (the forward that
activation recompute reruns inside a layer's first backward node) is taken out of it, so the
classes add up to the time the spans cover.

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
WAIT = "wait"    # blocked on a peer (pipeline bubble, collective skew): not an op class either
T = TypeVar("T")


def _now(device: torch.device) -> Any:
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


class _Frame:
    """An open span: its name (None for a recompute region, which counts as no class), where
    it began, and whether it is a forward span (a span inside one is not counted apart)."""

    __slots__ = ("forward", "name", "parent", "start")

    def __init__(self, name: str | None, start: Any, forward: bool, parent: _Frame | None
                 ) -> None:
        self.name, self.start, self.forward, self.parent = name, start, forward, parent


class Recorder:
    """Accumulates wall time per op class on one worker (not thread-safe; one per worker).

    ``decode`` mode maps compute classes (gemm, attention) to ``decode``: a decode iteration
    reads every weight and the KV cache for one token per sequence, which the cost model prices
    as one memory-bound op class.

    Spans nest in two ways. A forward span inside another forward span counts under the outer
    one only (one kernel, one class). Any other span opened while a span is open is counted
    under its own class and taken out of the open one: a backward node's span is open from its
    pre-hook to its hook, and when activation recompute reruns a layer's forward inside it
    (``recomputing``), that forward's spans would otherwise count twice, once as their own
    class and once as the backward node's.
    """

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True) -> None:
        self.device = torch.device(device)
        self.enabled = enabled
        self.decode = False
        # (name, start, end, sign): a closed span (+1), or a nested span taken out of its
        # enclosing one (-1); differences are taken at the end (CUDA events)
        self._spans: list[tuple[str, Any, Any, int]] = []
        self._stack: list[_Frame] = []          # open spans, innermost last
        self._open: dict[int, _Frame] = {}      # open backward spans by autograd node

    def _cls(self, cls: OpClass) -> str:
        if self.decode and cls in (OpClass.GEMM, OpClass.ATTENTION):
            return OpClass.DECODE.value
        return cls.value

    def _push(self, name: str | None, forward: bool) -> _Frame:
        f = _Frame(name, _now(self.device), forward, self._stack[-1] if self._stack else None)
        self._stack.append(f)
        return f

    def _pop(self, f: _Frame) -> None:
        end = _now(self.device)
        if self._stack and self._stack[-1] is f:
            self._stack.pop()
        elif f in self._stack:
            self._stack.remove(f)
        if f.name is not None:
            self._spans.append((f.name, f.start, end, 1))
        if f.parent is not None and f.parent.name is not None:
            self._spans.append((f.parent.name, f.start, end, -1))

    def _inside_forward(self) -> bool:
        return bool(self._stack) and self._stack[-1].forward

    @contextmanager
    def _frame(self, name: str | None, forward: bool) -> Iterator[None]:
        if not self.enabled or self._inside_forward():
            yield
            return
        f = self._push(name, forward)
        try:
            yield
        finally:
            self._pop(f)

    def span(self, cls: OpClass) -> Any:
        """Time the enclosed work as ``cls``; a span inside a forward span is not counted
        twice (see the class docstring for spans inside backward spans)."""
        return self._frame(self._cls(cls), forward=True)

    def waiting(self) -> Any:
        """Time the enclosed wait for a peer as ``WAIT`` (no op class)."""
        return self._frame(WAIT, forward=True)

    def recomputing(self) -> Any:
        """A region that reruns forward work inside a backward span (activation recompute):
        its time leaves the enclosing span; its own spans count as their classes and the rest
        of it as ``other``, as in a forward pass."""
        return self._frame(None, forward=False)

    def time_backward(self, out: torch.Tensor, cls: OpClass) -> torch.Tensor:
        """Time the backward of the autograd node that produced ``out`` as ``cls``."""
        node = out.grad_fn
        if not self.enabled or node is None:
            return out
        name = self._cls(cls)
        key = id(node)

        def pre(_grad_outputs: Any) -> None:
            self._open[key] = self._push(name, forward=False)

        def post(_grad_inputs: Any, _grad_outputs: Any) -> None:
            opened = self._open.pop(key, None)
            if opened is not None:
                self._pop(opened)

        node.register_prehook(pre)
        node.register_hook(post)
        return out

    def totals(self) -> dict[str, float]:
        """Seconds per op class (and ``WAIT``) since the last reset (synchronizes a CUDA
        device)."""
        if self.device.type == "cuda" and self._spans:
            torch.cuda.synchronize(self.device)
        out: dict[str, float] = {}
        for name, start, end, sign in self._spans:
            dt = start.elapsed_time(end) / 1e3 if self.device.type == "cuda" else end - start
            out[name] = out.get(name, 0.0) + sign * dt
        # a class whose time was all taken out of it ends at 0 up to rounding, never below
        return {name: max(0.0, secs) for name, secs in out.items()}

    def reset(self) -> None:
        self._spans.clear()
        self._stack.clear()
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
    ``peak_mem_bytes`` the largest over workers. ``profiled``: a CPU memory run, whose times
    include the profiler's overhead.

    ``op_s`` per class is the largest over workers: the time the worker busiest with that
    class spent in it. Across replicas and TP ranks, which do the same work, that is its
    slowest copy. Pipeline blocks do different work (the first embeds, the last runs the head
    and the loss, a middle block receives in both directions), so the maxima of different
    classes may come from different blocks: each class reads the block that does the most of
    it (one efficiency per class is fitted from them), and the classes need not add up to
    ``wall_s`` or to any one worker's time. What makes blocks differ in wall time but is no
    work of theirs, waiting for a neighbour (the bubble, a late peer), is ``WAIT`` and in no
    class, so no block's idle time is read as a slow class. ``OTHER`` and ``WAIT`` are maxima
    too; the telemetry keeps op classes only.
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
