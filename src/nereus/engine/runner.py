"""Driver side of a model-stage: its EMUs' workers, their process groups, and the stage
operations over a global batch.

For each EMU (one DP replica) the runner makes one TP group per pipeline block and one PP group
per TP rank; for each (tp_rank, pp_rank) position one DP group across the replicas, ordered as
the EMUs are given. Replica ``d`` takes rows ``replica_rows(n, dp, d)`` of the global batch, so
``dp x b x a`` stays the batch whatever the layout; generation and forward passes may split it
unevenly (the first ``n % dp`` replicas take one sequence more). Groups are the runtime's
communicators and are closed with the runner (a layout change makes a new runner).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nereus.engine import remote
from nereus.engine.batch import Batch, replica_rows
from nereus.engine.generate import GenerationResult
from nereus.engine.groups import Position
from nereus.engine.measure import StageMeasurement, WorkerMeasurement
from nereus.engine.optim import AdamConfig
from nereus.engine.pipeline import LossFn, Output
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import check_batch
from nereus.engine.train import TrainResult
from nereus.errors import InputError, first_line
from nereus.runtime.comm import Rendezvous, close_groups, open_groups
from nereus.runtime.workers import WorkerCallsFailed, WorkerPool
from nereus.spec.workload import largest_share
from nereus.transition.emu import Emu, Holds

if TYPE_CHECKING:
    from typing_extensions import Self

# Seconds an operation may take on the workers before the runner gives up on it (a peer that
# stopped answering must not hang the job; the runtime's collectives time out after 120 s).
DEFAULT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Placement:
    """Where a worker sits: its device id, position and group names."""

    device: int
    unit_id: str
    pos: Position
    names: remote.GroupNames


def placements(emus: Sequence[Emu], key: str, same_node: Any = None) -> list[Placement]:
    """Positions and group names of every worker of ``emus`` (DP order = the given order).

    ``same_node(ids) -> bool`` says whether devices share a node (default: all do). EMUs that
    hold optimizer state (a training stage) of more than one worker get a stage-wide group too
    (``ParallelGroups.stage``)."""
    if not emus:
        raise InputError("emus", "a model-stage needs at least one EMU")
    layout = emus[0].layout
    if any(e.layout != layout for e in emus):
        raise InputError("emus", "every replica of a model-stage has the same layout",
                         [str(e) for e in emus])
    tp, pp, dp = layout.tp, layout.pp, len(emus)
    intra = same_node or (lambda ids: True)
    every = tuple(g for e in emus for g in e.gpus)
    stage = (f"{key}/stage" if len(every) > 1 and emus[0].holds is Holds.THETA_OMEGA
             else None)
    out = []
    for d, e in enumerate(emus):
        for i, dev in enumerate(e.gpus):
            t, r = e.position(i)
            tp_m = tuple(e.gpus[r * tp + k] for k in range(tp))
            pp_m = tuple(e.gpus[k * tp + t] for k in range(pp))
            dp_m = tuple(x.gpus[i] for x in emus)
            names = remote.GroupNames(
                f"{key}/tp/{d}/{r}" if tp > 1 else None, f"{key}/pp/{d}/{t}" if pp > 1 else None,
                f"{key}/dp/{t}/{r}" if dp > 1 else None, intra(tp_m), intra(pp_m), intra(dp_m),
                f"{key}/ppg/{d}/{t}" if pp > 1 else None, stage, intra(every))
            out.append(Placement(dev, e.id, Position(tp, pp, dp, t, r, d), names))
    return out


class RunnerFailed(RuntimeError):
    """An operation of this runner failed earlier: its communicators cannot be trusted."""


class StageRunner:
    """Runs train_step / forward / generate of one model-stage on its EMUs' workers.

    Every call waits at most ``timeout_s`` for the workers (``WorkerCallsFailed`` after).
    ``rv`` must stay open while the runner runs: on NCCL a pipeline's point-to-point
    communicators are made at their first send, through the rendezvous store.

    An operation that fails on any worker ends the runner's use: a replica that raised left
    its peers inside a collective, which would fail only at the communicators' timeout. So
    the runner does not wait for it: as each worker's call ends after the failure, that
    worker leaves this runner's groups, which makes the peers' collectives with it fail at
    once; the operation raises the first failure within seconds, every worker free again.
    Every later operation is refused (``RunnerFailed``, naming the first failure) until the
    caller closes this runner and makes a new one. The state is unchanged by a failed step
    and stays on the workers."""

    def __init__(self, pool: WorkerPool, emus: Sequence[Emu], rv: Rendezvous,
                 adam: AdamConfig | None = None, stage: str | None = None,
                 timeout_s: float | None = DEFAULT_TIMEOUT_S) -> None:
        self.pool, self.emus = pool, tuple(emus)
        self.timeout_s = timeout_s
        self.stage = stage or self.emus[0].stage
        self.key = f"engine/{self.stage}/{uuid.uuid4().hex[:8]}"
        infos = pool.infos()
        node = {d: infos[d].node_id for d in infos}
        self.places = placements(self.emus, self.key,
                                 lambda ids: len({node[i] for i in ids}) == 1)
        self.device = str(infos[self.places[0].device].device)
        self.groups = self._members()
        # what frees each worker's peers after a failed call (``_call``): its leaving this
        # runner's groups, which are fixed from here on
        self._release = {p.device: (remote.release, (self.key, tuple(
            n for n, m in self.groups.items() if p.device in m))) for p in self.places}
        self.setup_s: dict[str, float] = {}
        self.failed: str | None = None  # the first failed operation's error, one line
        try:  # a failure partway (a member that never joined) closes what was opened
            if self.groups:
                self.setup_s = open_groups(pool, self.groups, rv)
            vocab = pool.run({p.device: (remote.attach, (self.key, p.unit_id, p.pos, p.names,
                                                         adam))
                              for p in self.places}, timeout_s)
        except BaseException as e:
            self._close_after(e)
            raise
        # token ids are checked here, before any worker starts: a replica refusing its rows on
        # the worker would leave the others waiting in the DP all-reduce
        sizes = {v for v in vocab.values() if isinstance(v, int)}
        self.vocab_size: int | None = sizes.pop() if len(sizes) == 1 else None

    def _members(self) -> dict[str, tuple[int, ...]]:
        """Each group's device ids in group-rank order."""
        members: dict[str, dict[int, int]] = {}
        for p in self.places:
            for name, rank in ((p.names.tp, p.pos.tp_rank), (p.names.pp, p.pos.pp_rank),
                               (p.names.pp_grad, p.pos.pp_rank), (p.names.dp, p.pos.dp_rank),
                               (p.names.stage, p.pos.stage_rank)):
                if name is not None:
                    members.setdefault(name, {})[rank] = p.device
        return {n: tuple(m[r] for r in sorted(m)) for n, m in members.items()}

    @property
    def tp(self) -> int:
        return self.emus[0].layout.tp

    @property
    def pp(self) -> int:
        return self.emus[0].layout.pp

    @property
    def dp(self) -> int:
        return len(self.emus)

    def close(self) -> None:
        """Forget the engines and close the groups (the state stays on the workers).

        Workers that died or left the pool are skipped (their engines and groups went with
        them), as are workers whose detach failed (a worker still stuck in an operation would
        only queue the leave behind it); every other worker leaves its groups whatever failed
        before. Then the first failure of a live worker is raised (``WorkerCallsFailed``)."""
        present = set(self.pool.device_ids)
        skip = {p.device for p in self.places} - present
        first: BaseException | None = None
        try:
            self.pool.run({p.device: (remote.detach, (self.key,)) for p in self.places
                           if p.device in present}, self.timeout_s)
        except WorkerCallsFailed as e:
            skip |= set(e.errors)
            first = e if set(e.errors) - e.dead else None
        except BaseException as e:  # noqa: BLE001 - the groups are closed first, then raised
            first = e
        groups, self.groups = self.groups, {}
        live = {n: tuple(d for d in m if d not in skip) for n, m in groups.items()}
        live = {n: m for n, m in live.items() if m}
        if live:
            try:
                close_groups(self.pool, live, self.timeout_s)
            except WorkerCallsFailed as e:
                if set(e.errors) - e.dead and first is None:  # one dying now has nothing left
                    first = e
            except BaseException as e:  # noqa: BLE001 - raised below unless one came first
                first = first or e
        if first is not None:
            raise first

    def _close_after(self, error: BaseException) -> None:
        """``close`` while ``error`` propagates: a failed clean-up is noted on ``error``
        instead of replacing it."""
        try:
            self.close()
        except Exception as e:  # noqa: BLE001 - the caller needs the first error
            note = f"StageRunner.close() failed as well: {type(e).__name__}: {e}"
            if sys.version_info >= (3, 11):
                error.add_note(note)
            else:  # no add_note before 3.11: keep the note where it would be (not printed);
                # setattr, as 3.10's BaseException declares no __notes__
                setattr(error, "__notes__", [*getattr(error, "__notes__", ()), note])  # noqa: B010

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is None:
            self.close()
        else:
            self._close_after(exc)

    # ---------------------------------------------------------------- operations
    def _rows(self, batch: Batch, micro_batch: int | None = None, field: str = "batch",
              temperature: float = 1.0, uneven: bool = False) -> list[Batch]:
        """Each replica's rows, checked here so bad input fails before any worker starts (a
        worker that refuses its rows would leave the others in a collective).

        Training splits the batch evenly. ``uneven`` (generation, forward passes) lets dp not
        divide it, as the planner prices such stages: the largest share, ceil(n / dp), is cut
        into micro-batches of ``micro_batch`` and a replica with one sequence fewer ends on a
        short one."""
        n, dp = batch.size, self.dp
        per = largest_share(n, dp)
        check_batch(self.vocab_size, batch, field, temperature)
        if uneven and dp > n:
            raise InputError(field, f"{n} sequences leave some of dp={dp} replicas without "
                             "one", f"at least {dp} sequences")
        if not uneven and n % dp:
            raise InputError(field, f"{n} sequences do not split over dp={dp} in equal "
                             "shares, as training needs", f"a multiple of {dp}")
        if micro_batch is not None and (micro_batch < 1 or per % micro_batch):
            share = "the largest replica's" if n % dp else "a replica's"
            raise InputError("micro_batch", f"{micro_batch} does not divide {share} {per} "
                             "sequences", [b for b in range(1, per + 1) if per % b == 0])
        if batch.index is None:
            batch = Batch(batch.input_ids, batch.attention_mask, batch.extra,
                          torch.arange(n))
        return [batch.rows(*replica_rows(n, dp, d, uneven)) for d in range(dp)]

    def _run(self, fn: Any, per_replica: list[Batch], *args: Any
             ) -> tuple[list[Any], tuple[WorkerMeasurement, ...]]:
        out = self._call(fn, {p.device: (fn, (self.key, per_replica[p.pos.dp_rank], *args))
                              for p in self.places})
        results: list[Any] = [None] * self.dp
        for p in self.places:
            res, _ = out[p.device]
            if res is not None:
                results[p.pos.dp_rank] = res
        return results, tuple(out[p.device][1] for p in self.places)

    def _call(self, fn: Any, calls: dict[int, tuple[Any, tuple[Any, ...]]]) -> dict[int, Any]:
        """Every operation's calls: refused after a failed one, and a failure marks it."""
        if self.failed is not None:
            raise RunnerFailed(f"{self.stage}: an earlier operation failed ({self.failed}), "
                               "which may have left peers inside a collective: close this "
                               "runner and make a new StageRunner")
        try:  # once a call fails, each worker leaves the groups as its own call ends
            return self.pool.run(calls, self.timeout_s, release=self._release)
        except BaseException as e:
            self.failed = f"{fn.__name__}: {first_line(e)}"
            raise

    def _measurement(self, kind: str, workers: tuple[WorkerMeasurement, ...], batch: Batch,
                     micro_batch: int, tokens: int) -> StageMeasurement:
        per_replica = largest_share(batch.size, self.dp)  # what the planner prices
        return StageMeasurement.combine(
            workers, stage=self.stage, kind=kind, device=self.device, tp=self.tp, pp=self.pp,
            dp=self.dp, micro_batch=micro_batch, grad_accum=per_replica // micro_batch,
            sequences=batch.size, tokens=tokens)

    def train_step(self, batch: Batch, loss_fn: LossFn, micro_batch: int,
                   adam: AdamConfig | None = None, track_memory: bool | None = None,
                   recompute: bool = False, temperature: float = 1.0
                   ) -> tuple[TrainResult, StageMeasurement]:
        """One optimizer update over the global ``batch`` (see ``nereus.engine.train`` for
        the loss convention); ``recompute`` reruns each layer's forward in backward;
        ``loss_fn`` sees log-probs at ``temperature``."""
        rows = self._rows(batch, micro_batch, temperature=temperature)
        results, workers = self._run(remote.train, rows, loss_fn, micro_batch, adam,
                                     track_memory, recompute, temperature)
        res: TrainResult = results[0]
        return res, self._measurement("train", workers, batch, micro_batch, batch.num_tokens())

    def forward(self, batch: Batch, micro_batch: int, track_memory: bool | None = None,
                temperature: float = 1.0) -> tuple[Output, StageMeasurement]:
        """Log-probs at ``temperature`` (LM head) or values (scalar head) of ``batch``."""
        rows = self._rows(batch, micro_batch, temperature=temperature, uneven=True)
        results, workers = self._run(remote.forward, rows, micro_batch, track_memory,
                                     temperature)
        return Output.cat(results), self._measurement("forward", workers, batch, micro_batch,
                                                      batch.num_tokens())

    def generate(self, prompts: Batch, sampling: SamplingParams, micro_batch: int | None = None,
                 track_memory: bool | None = None) -> tuple[GenerationResult, StageMeasurement]:
        rows = self._rows(prompts, micro_batch, field="prompts", uneven=True)
        mb = micro_batch or rows[0].size
        results, workers = self._run(remote.generate, rows, sampling, mb, track_memory)
        res = GenerationResult.cat(results)
        tokens = prompts.num_tokens() + int(res.lengths.sum())
        return res, self._measurement("generate", workers, prompts, mb, tokens)

    def full_logits(self, batch: Batch) -> torch.Tensor:
        """Full-vocabulary logits of the whole batch (checks only)."""
        rows = self._rows(batch, uneven=True)
        out = self._call(remote.full_logits, {
            p.device: (remote.full_logits, (self.key, rows[p.pos.dp_rank]))
            for p in self.places})
        parts: list[Any] = [None] * self.dp
        for p in self.places:
            if out[p.device] is not None:
                parts[p.pos.dp_rank] = out[p.device]
        return torch.cat(parts)
