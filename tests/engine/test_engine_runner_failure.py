"""A step that fails on one replica fails fast: its peers, left inside a collective with the
failed worker, are freed at once instead of at the communicators' timeout, and the runner
reports the first failure with every worker free, its state kept, and ready for a new runner.

The communicators' timeout here is ten minutes, far beyond the runner's own wait (a minute):
a runner that waited for its peers' collectives would report them as hung, and leave them
blocked, so the checks below would fail rather than hang.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from nereus.engine.batch import Batch
from nereus.engine.losses import weighted_nll
from nereus.engine.optim import AdamConfig
from nereus.engine.pipeline import LossFn, Output
from nereus.engine.runner import RunnerFailed, StageRunner
from nereus.runtime.comm import Rendezvous
from nereus.runtime.movement import destroy_member
from nereus.runtime.state import StateSpec
from nereus.runtime.workers import WorkerCallsFailed, WorkerHung, WorkerPool
from nereus.spec.model import MODEL_PRESETS, Head

from engine_testlib import gather_unit, layout_emus, place_seeded_units, worker_session

WORKERS = 4
SEED = 13
COMM_TIMEOUT_S = 600.0  # the collectives' own timeout: what the old runner waited out
RUNNER_TIMEOUT_S = 60.0
ADAM = AdamConfig(lr=1e-3)


@pytest.fixture(scope="module")
def runtime() -> Iterator[tuple[WorkerPool, Rendezvous]]:
    with worker_session(WORKERS, COMM_TIMEOUT_S) as got:
        yield got


def lm_batch(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(SEED)
    n, s = 8, 10
    ids = torch.randint(0, vocab, (n, s), generator=g)
    am = torch.ones(n, s, dtype=torch.long)
    w = torch.rand(n, s - 1, generator=g) / (n * (s - 1))
    return Batch(ids, am, {"weight": w})


def refusing_first_replica() -> LossFn:
    """``weighted_nll``, except that it raises on replica 0's rows (the global batch's first
    sequences): only that replica's last block fails, while its first block waits for the
    gradient and replica 1 waits in the DP all-reduce. A closure, so Ray ships it by value."""

    def loss(out: Output, batch: Batch) -> torch.Tensor:
        if batch.index is not None and int(batch.index.min()) == 0:
            raise ValueError("loss refused replica 0's rows")
        return weighted_nll(out, batch)

    return loss


def failing_before_the_update(replica: int) -> LossFn:
    """``weighted_nll``; on ``replica``'s last block it also makes that worker's step fail
    where the last collective before the update (the stage-wide all-reduce) would run: after
    every other collective of the step, which the replica's first block has passed. The
    patch is undone as it fires, so the worker is as before for later tests. A closure, so
    Ray ships it by value."""

    def loss(out: Output, batch: Batch) -> torch.Tensor:
        from nereus.engine.train import TrainStep

        per = batch.index is not None and int(batch.index.min()) // 4 == replica
        if per and "_kept" not in TrainStep.__dict__:
            kept = TrainStep.__dict__["_commit"]

            def fail(self: TrainStep, losses: list[torch.Tensor]) -> float:
                TrainStep._commit = kept  # type: ignore[method-assign]
                del TrainStep._kept  # type: ignore[attr-defined]
                raise RuntimeError("failed before the update")

            TrainStep._kept = kept  # type: ignore[attr-defined]
            TrainStep._commit = fail  # type: ignore[method-assign]
        return weighted_nll(out, batch)

    return loss


@contextmanager
def seeded_pp2_dp2(pool: WorkerPool, tag: str) -> Iterator[tuple[list[Any], list[Any]]]:
    """tiny-llama's actor_train at tp=1, pp=2, dp=2 on workers 0-3 (replica 0 on 0, its first
    block, and 1; replica 1 on 2, 3), seeded: (EMUs, each unit gathered before the test).
    Afterwards the units are dropped, bounded: workers still blocked fail the test, not hang
    it."""
    spec = MODEL_PRESETS["tiny-llama"]
    emus = layout_emus("actor_train", 1, 2, 2, tag, trainable=True)
    place_seeded_units(pool, emus, StateSpec(spec, Head.LM), SEED)
    try:
        yield emus, [gather_unit(pool, e) for e in emus]
    finally:
        pool.run({dev: (destroy_member, (e.id,)) for e in emus for dev in e.gpus},
                 timeout_s=RUNNER_TIMEOUT_S)


def held_units_and_groups() -> Any:
    """``fn(ctx, key)``: the units a worker holds and the groups of runner ``key`` it is
    still in (a closure, so Ray ships it by value)."""

    def held(ctx: Any, key: str) -> tuple[list[str], list[str]]:
        return sorted(ctx.units), sorted(n for n in ctx.groups if n.startswith(key))

    return held


def test_a_step_failing_on_one_replica_frees_every_peer_and_keeps_the_state(
        runtime: tuple[WorkerPool, Rendezvous]) -> None:
    pool, rv = runtime
    torch.manual_seed(SEED)
    held_by = held_units_and_groups()
    with seeded_pp2_dp2(pool, "fail") as (emus, before):
        b = lm_batch(MODEL_PRESETS["tiny-llama"].vocab_size)
        with StageRunner(pool, emus, rv, ADAM, timeout_s=RUNNER_TIMEOUT_S) as run:
            key = run.key
            with pytest.raises(WorkerCallsFailed) as info:
                run.train_step(b, refusing_first_replica(), micro_batch=2)
            # the failed worker comes first, named with its reason, in one line
            assert re.fullmatch(r"\d worker call\(s\) failed; worker 1: ValueError: loss "
                                r"refused replica 0's rows", str(info.value))
            # every peer's call returned (freed, not waited out): none is hung
            errors = info.value.errors
            assert set(errors) == {0, 1, 2, 3}
            assert not any(isinstance(e, WorkerHung) for e in errors.values()), errors
            # every worker answers at once, holds its unit and has left the runner's groups
            held = pool.run({d: (held_by, (key,)) for d in range(WORKERS)}, timeout_s=30.0)
            assert held == {d: ([emus[d // 2].id], []) for d in range(WORKERS)}
            with pytest.raises(RunnerFailed, match=r"\(train: \d worker call\(s\) failed; "
                               r"worker 1: ValueError: loss refused"):
                run.forward(b, micro_batch=2)
        for e, was in zip(emus, before):   # the failed step changed no state
            assert gather_unit(pool, e).first_difference(was) is None
        # the same workers run the next step on a new runner
        with StageRunner(pool, emus, rv, ADAM, timeout_s=RUNNER_TIMEOUT_S) as run:
            res, _ = run.train_step(b, weighted_nll, micro_batch=2)
        assert torch.isfinite(torch.tensor(res.loss))


def test_a_step_failing_after_its_other_collectives_updates_no_worker(
        runtime: tuple[WorkerPool, Rendezvous]) -> None:
    """tp=1, pp=2, dp=2: replica 1's last block fails after the gradient all-reduces and the
    norm's, which its first block has already passed. The stage-wide all-reduce that comes
    last fails on every worker, so none updates: each unit gathers whole and unchanged (a
    first block that had updated would leave its replica's positions with different step
    counters, and the gather would refuse it)."""
    pool, rv = runtime
    with seeded_pp2_dp2(pool, "torn") as (emus, before):
        b = lm_batch(MODEL_PRESETS["tiny-llama"].vocab_size)
        with (StageRunner(pool, emus, rv, ADAM, timeout_s=RUNNER_TIMEOUT_S) as run,
              pytest.raises(WorkerCallsFailed,
                            match=r"worker 3: RuntimeError: failed before the update")):
            run.train_step(b, failing_before_the_update(1), micro_batch=2)
        for e, was in zip(emus, before):
            assert gather_unit(pool, e).first_difference(was) is None
