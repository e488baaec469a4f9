"""Worker-side entry points: module-level functions the runtime's ``WorkerPool.call`` runs as
``fn(ctx, ...)`` inside a worker.

The engine computes on the ``ShardedState`` the worker already holds (``ctx.units[unit_id]``):
its parameter views are the model's weights and its moment (and master) views are Adam's state,
so a training step updates in place exactly the bytes a transition moves. Per-worker engine
objects live in ``ctx.scratch`` under a key the driver chooses.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nereus.engine.batch import Batch
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.measure import WorkerMeasurement
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import LossFn
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.errors import InputError


@dataclass(frozen=True)
class GroupNames:
    """Names of this worker's groups in ``ctx.groups`` (None where the dimension is 1) and
    whether each group stays inside one node."""

    tp: str | None = None
    pp: str | None = None
    dp: str | None = None
    tp_intra: bool = True
    pp_intra: bool = True
    dp_intra: bool = True
    pp_grad: str | None = None  # the PP members again: the gradients' communicator
    stage: str | None = None    # every worker of the model-stage (a training step's last
    stage_intra: bool = True    # collective): None where it has one worker, or never trains


@dataclass
class _Attached:
    engine: StageEngine
    unit_id: str
    state: Any  # the ``ShardedState`` whose views the engine computes on


def _attached(ctx: Any, key: str) -> _Attached:
    """The engine under ``key``, refused once its unit is no longer the one held under its id
    (dropped, or replaced by a transition): its views would compute on, and train, bytes that
    no unit holds any more."""
    att = ctx.scratch.get(key)
    if not isinstance(att, _Attached):
        raise KeyError(f"worker {ctx.device_id}: no engine attached under {key!r}")
    if ctx.units.get(att.unit_id) is not att.state:
        raise RuntimeError(f"worker {ctx.device_id}: engine {key!r} computes on unit "
                           f"{att.unit_id}, which this worker no longer holds as it was "
                           "(dropped or moved by a transition); attach again")
    return att


def _backend(ctx: Any, name: str | None) -> Any:
    if name is None:
        return None
    g = ctx.groups[name]
    return getattr(g, "backend", g)  # the runtime's Group wraps the torch ProcessGroup


def attach(ctx: Any, key: str, unit_id: str, pos: Position, names: GroupNames,
           adam: AdamConfig | None) -> int:
    """Build this worker's engine over unit ``unit_id``; returns the model's vocabulary size
    (the driver checks token ids against it before it hands a batch to any worker)."""
    from nereus.runtime.state import MASTER

    if unit_id in getattr(ctx, "offloaded", ()):  # a transition left it in host memory
        ctx.load(unit_id)
    st = ctx.units[unit_id]
    spec = st.spec
    if (st.tp, st.pp) != (pos.tp, pos.pp) or st.position != (pos.tp_rank, pos.pp_rank):
        raise ValueError(f"unit {unit_id} holds position {st.position} of tp={st.tp} "
                         f"pp={st.pp}, the engine expected {pos}")
    state = None
    if spec.trainable and not spec.moments:
        raise InputError("workload.optimizer", f"unit {unit_id} holds SGD state (no Adam "
                         "moments); the engine's optimizer is Adam", "adam for a job the "
                         "engine trains")
    if spec.trainable:
        state = AdamState(st.exp_avg, st.exp_avg_sq, st.kind(MASTER) if spec.master else {},
                          st.meta.adam_step)
    groups = ParallelGroups(_backend(ctx, names.tp), _backend(ctx, names.pp),
                            _backend(ctx, names.dp), names.tp_intra, names.pp_intra,
                            names.dp_intra, _backend(ctx, names.pp_grad),
                            _backend(ctx, names.stage), names.stage_intra)
    eng = StageEngine(spec.model, spec.head, pos, st.params, groups, state, adam,
                      resident_bytes=lambda: ctx.memory.stats().held)
    ctx.scratch[key] = _Attached(eng, unit_id, st)
    ctx.in_use[key] = unit_id  # the runtime does not offload it under the engine
    return int(spec.model.vocab_size)


def detach(ctx: Any, key: str) -> None:
    ctx.scratch.pop(key, None)
    ctx.in_use.pop(key, None)


def release(ctx: Any, key: str, names: tuple[str, ...]) -> None:
    """Detach and close this worker's groups ``names`` at once, after an operation failed
    here or on a peer (``WorkerPool.run``'s ``release``). Neither gloo's ``abort`` nor its
    ``shutdown`` wakes a peer blocked on this worker; destroying the backend does: its sockets
    close and the peer's operation fails at once. The engine holds the backends, as does the
    failed call's traceback (in reference cycles), hence the collection."""
    import gc

    from nereus.runtime.comm import leave_group

    ctx.scratch.pop(key, None)
    ctx.in_use.pop(key, None)
    for name in names:
        leave_group(ctx, name)
    gc.collect()


def _reports(eng: StageEngine) -> bool:
    """The worker whose results stand for its replica: last block, tp_rank 0."""
    return eng.pos.last and eng.pos.tp_rank == 0


def train(ctx: Any, key: str, batch: Batch, loss_fn: LossFn, micro_batch: int,
          adam: AdamConfig | None = None, track_memory: bool | None = None,
          recompute: bool = False, temperature: float = 1.0) -> tuple[Any, WorkerMeasurement]:
    att = _attached(ctx, key)
    eng = att.engine
    out = eng.train_step(batch, loss_fn, micro_batch, adam, track_memory, recompute,
                         temperature)
    st = att.state
    assert eng.adam_state is not None
    st.meta = replace(st.meta, adam_step=eng.adam_state.step,
                      update_count=st.meta.update_count + 1)
    return (out.result if _reports(eng) else None), out.measurement


def forward(ctx: Any, key: str, batch: Batch, micro_batch: int, track_memory: bool | None = None,
            temperature: float = 1.0) -> tuple[Any, WorkerMeasurement]:
    eng = _attached(ctx, key).engine
    out = eng.forward(batch, micro_batch, track_memory, temperature)
    if not _reports(eng):
        return None, out.measurement
    assert out.result is not None  # the last block has the outputs
    return out.result.cpu(), out.measurement


def generate(ctx: Any, key: str, prompts: Batch, sampling: SamplingParams,
             micro_batch: int | None, track_memory: bool | None = None
             ) -> tuple[Any, WorkerMeasurement]:
    eng = _attached(ctx, key).engine
    out = eng.generate(prompts, sampling, micro_batch, track_memory)
    return (out.result if _reports(eng) else None), out.measurement


def full_logits(ctx: Any, key: str, batch: Batch) -> Any:
    """Full-vocabulary logits of a batch (checks only: training never gathers them)."""
    import torch

    from nereus.engine.pipeline import PipeLinks, forward_step, micro_inputs

    eng = _attached(ctx, key).engine
    m = eng.model
    b = batch.to(m.device)
    links = PipeLinks(m)
    with torch.no_grad():
        h = forward_step(m, links, b.tokens(), micro_inputs(m, b),
                         m.hidden_shape(b.size, b.seq_len), tag=0)
        links.finish()
        if h is None:
            return None
        logits = m.full_logits(h)   # every TP rank takes part in the gather
    return logits.cpu() if _reports(eng) else None
