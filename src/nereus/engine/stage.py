"""One worker's side of a model-stage: its model over its shards, its optimizer state, and the
three stage operations (train_step, forward, generate), each measured.

Every worker of a model-stage (all positions of all replicas) calls the same operation with its
replica's rows; results are complete on the last pipeline block (the loss, log-probs, values)
or on every worker (generated tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from nereus.engine.batch import Batch
from nereus.engine.generate import GenerationResult, Generator
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.measure import Recorder, WorkerMeasurement, measured, tensor_bytes
from nereus.engine.model import ParallelModel, check_temperature
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import LossFn, Output, forward_pipeline
from nereus.engine.sampling import SamplingParams
from nereus.engine.train import TrainResult, TrainStep
from nereus.errors import InputError
from nereus.spec.model import Head, ModelSpec


def check_batch(vocab_size: int | None, batch: Batch, field: str = "batch",
                temperature: float = 1.0) -> None:
    """What no worker may start on: no sequences, a real token id outside the vocabulary (a
    target too: the next position's id; not checked where ``vocab_size`` is unknown), a
    temperature log-probs cannot take. The driver (``StageRunner``) and a stage engine both
    call it."""
    if batch.size == 0:
        raise InputError(field, "has no sequences", "at least one sequence")
    if vocab_size is not None:
        batch.check_tokens(vocab_size, field)
    check_temperature(temperature)


def forward(model: ParallelModel, batch: Batch, micro_batch: int, temperature: float = 1.0
            ) -> Output | None:
    """Log-probs at ``temperature`` (LM head) or values (scalar head) of whole sequences, on
    the last block."""
    check_batch(model.spec.vocab_size, batch, "batch", temperature)
    # a replica of an uneven DP split may end on a short micro-batch (``replica_rows``)
    micros = batch.to(model.device).split(micro_batch, short_last=True)
    outs = forward_pipeline(model, micros, temperature)
    return Output.cat(outs) if outs is not None else None


T = TypeVar("T")


@dataclass(frozen=True)
class Measured(Generic[T]):
    """An operation's result on this worker and what it cost here."""

    result: T
    measurement: WorkerMeasurement


class StageEngine:
    """The engine on one worker for one model-stage (one EMU position).

    ``resident_bytes()``: the bytes the worker holds besides the operation's transients (on a
    runtime worker, what its byte counter holds: this stage's state and any co-resident unit);
    a CPU peak is measured on top of it, as CUDA's allocator peak counts every tensor on the
    device. Default: this stage's own state."""

    def __init__(self, spec: ModelSpec, head: Head, pos: Position,
                 shards: Mapping[str, torch.Tensor], groups: ParallelGroups | None = None,
                 adam_state: AdamState | None = None, adam: AdamConfig | None = None,
                 resident_bytes: Callable[[], int] | None = None) -> None:
        device = next(iter(shards.values())).device
        self.rec = Recorder(device)
        self.model = ParallelModel(spec, head, pos, shards, groups, self.rec)
        self.adam_state = adam_state
        self.adam = adam or AdamConfig()
        self._resident = resident_bytes

    @property
    def pos(self) -> Position:
        return self.model.pos

    def state_bytes(self) -> int:
        """Bytes of the memory this stage's parameters and optimizer state live in."""
        tensors = list(self.model.params.values())
        if self.adam_state is not None:
            tensors += self.adam_state.tensors()
        return tensor_bytes(tensors)

    def resident_bytes(self) -> int:
        return self._resident() if self._resident is not None else self.state_bytes()

    def _measure(self, fn: Callable[[], T], track_memory: bool | None
                 ) -> tuple[T, WorkerMeasurement]:
        """``track_memory`` None: where it is free (CUDA's allocator statistics), not on CPU
        (the profiler it needs slows the run)."""
        dev = self.model.device
        if track_memory is None:
            track_memory = dev.type == "cuda"
        resident = self.resident_bytes()
        result, wall, op_s, peak = measured(fn, self.rec, dev, resident, track_memory)
        p = self.pos
        profiled = track_memory and dev.type == "cpu"
        return result, WorkerMeasurement(p.tp_rank, p.pp_rank, p.dp_rank, wall, op_s, peak,
                                         resident, profiled)

    # ---------------------------------------------------------------- operations
    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch: int,
                   adam: AdamConfig | None = None, track_memory: bool | None = None,
                   recompute: bool = False, temperature: float = 1.0
                   ) -> Measured[TrainResult]:
        """One update; ``temperature``: that of the log-probs ``loss_fn`` sees."""
        if self.adam_state is None:
            raise InputError("train_step", "this worker holds no optimizer state (a forward or "
                             "generation stage holds parameters only)")
        check_batch(self.model.spec.vocab_size, batch, "batch", temperature)
        step = TrainStep(self.model, self.adam_state, adam or self.adam, micro_batch, recompute)
        res, meas = self._measure(lambda: step(batch, loss_fn, temperature), track_memory)
        return Measured(res, meas)

    def forward(self, batch: Batch, micro_batch: int, track_memory: bool | None = None,
                temperature: float = 1.0) -> Measured[Output | None]:
        """Log-probs at ``temperature`` (LM head) or values (scalar head); ``forward``
        checks the batch."""
        res, meas = self._measure(lambda: forward(self.model, batch, micro_batch, temperature),
                                  track_memory)
        return Measured(res, meas)

    def generate(self, prompts: Batch, sampling: SamplingParams, micro_batch: int | None = None,
                 track_memory: bool | None = None) -> Measured[GenerationResult]:
        check_batch(self.model.spec.vocab_size, prompts, "prompts")
        gen = Generator(self.model)
        res, meas = self._measure(lambda: gen.generate(prompts, sampling, micro_batch),
                                  track_memory)
        return Measured(res, meas)


__all__ = ["StageEngine", "Measured", "forward", "GenerationResult", "TrainResult", "Output"]
