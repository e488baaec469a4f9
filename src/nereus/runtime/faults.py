"""Faults during a transition: what survived, and how the job gets back onto a plan.

A unit is intact when every one of its positions sits on a live worker that holds it under the
unit's id: a primitive that failed half-way leaves its inputs partly consumed and its outputs
partly made, and neither counts. Arenas on live workers that belong to no intact unit are
dropped, so their bytes come back. No logical state is lost while a model-stage keeps one
intact unit (the transition layer destroys a unit only while another copy exists).

``recover`` replans from the intact units: per model-stage it keeps the intact units of one
layout (others are redundant copies and are destroyed), forms the plan they realize, asks the
transition layer for a schedule to the target plan of the surviving pool, runs it, and then
makes the model-stages that lost every copy in their target layout.

How a lost stage comes back follows from what changes between steps. A frozen model's weights
never do, so its lost stage is read back from the latest checkpoint (torch.distributed.
checkpoint) and nothing else moves. A trained model's state moves every step. A stage that
only holds a copy of its θ (generation, a critic's value inference) is rebuilt from the stage
that trains the model, where that one is intact: its θ is the newest there is, and giving it
to the copy is what the next weight sync would do, so no step is lost
(``Checkpointer.rebuild``). The training stage itself holds the optimizer state, which exists
nowhere else, and the checkpoint holds an older step: restoring it alone would pair an older θ
with the newer state of the model's other stages (generation sampling with a policy training
has moved past, or an actor a step ahead of its critic). So when a training stage loses its
last copy, the job rolls back: every stage of every trained model is restored from the
checkpoint, intact copies included, and the steps since are redone (a restart, which is how the
controller prices that loss, ``nereus.control.targets.survive``, and a lost copy of θ as this
rebuild: the training replica's write and the copy's read).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nereus.runtime import movement as mv
from nereus.runtime.workers import GRACE_S, WorkerCallsFailed, describe_error
from nereus.transition.emu import Emu

if TYPE_CHECKING:
    from nereus.plan.types import Plan
    from nereus.runtime.checkpoint import Checkpointer
    from nereus.runtime.executor import ExecutionReport, Executor
    from nereus.runtime.primitives import PrimitiveTiming
    from nereus.runtime.workers import WorkerPool
    from nereus.spec.job import JobSpec


@dataclass(frozen=True)
class FaultReport:
    """The state of the job after a failed transition."""

    dead: frozenset[int]                               # workers whose actor died (or hung)
    failed: Mapping[int, Mapping[int, str]]            # primitive index -> worker -> error
    intact: Mapping[str, tuple[Emu, ...]]              # model-stage -> complete units
    lost: tuple[Emu, ...]                              # units that are gone or incomplete
    timings: tuple[PrimitiveTiming, ...] = ()          # primitives that did complete
    dropped_bytes: Mapping[int, int] = field(default_factory=dict)  # orphan arenas freed
    tracebacks: Mapping[int, Mapping[int, str]] = field(default_factory=dict, repr=False)
    cause: str | None = None  # an error in the driver that stopped the run (no worker's)
    hung: frozenset[int] = frozenset()  # of ``dead``: alive, but a call never returned; stopped

    def lost_stages(self, stages: Sequence[str]) -> tuple[str, ...]:
        """Model-stages (of ``stages``) with no intact unit left: their last copy is lost."""
        return tuple(s for s in stages if not self.intact.get(s))

    def describe(self) -> str:
        dead = ", ".join(map(str, sorted(self.dead))) or "none"
        if self.hung:
            dead += (" (" + ", ".join(map(str, sorted(self.hung))) + " hung: a call never "
                     "returned, so the worker was stopped)")
        fails = "; ".join(f"#{i}: " + ", ".join(f"worker {d}: {e}" for d, e in errs.items())
                          for i, errs in sorted(self.failed.items()))
        keep = ", ".join(e.id for es in self.intact.values() for e in es) or "none"
        why = f"stopped by {self.cause}; " if self.cause else ""
        return f"{why}dead workers: {dead}; failed: {fails or 'none'}; intact units: {keep}"


class TransitionFailed(RuntimeError):
    """A transition stopped part-way; ``report`` says what survived."""

    def __init__(self, report: FaultReport):
        self.report = report
        super().__init__(f"transition failed ({report.describe()})")


def _drop_all(ctx: Any, ids: Sequence[str]) -> int:
    for i in ids:  # an unsettled new unit (its worker's settle call failed) goes with its
        ctx.pending.pop(i, None)  # host copy of the source
    return sum(ctx.drop(i) for i in ids)


def reconcile(pool: WorkerPool, candidates: Iterable[Emu], dead: set[int],
              failed: Mapping[int, Mapping[int, BaseException]],
              timings: tuple[PrimitiveTiming, ...] = (), cause: BaseException | None = None,
              hung: Iterable[int] = (), timeout_s: float = GRACE_S) -> FaultReport:
    """Which of ``candidates`` are intact on the live workers; drop every other arena there.
    ``cause``: the driver-side error that stopped the run, when no worker's call failed.
    ``hung``: workers whose calls never returned; they are stopped first (any call to them
    would queue behind the stuck one) and count as dead. Each call to a live worker here may
    take ``timeout_s``: one that does not answer by then is hung too, and stopped. Only a
    stopped or dead worker's units are lost: a worker that is merely slow to answer still
    holds its shards, and its partners' halves of them are kept."""
    candidates = list(candidates)
    gone = _Gone(pool, set(dead), set())
    gone.stop(set(hung))
    died, silent = pool.liveness(timeout_s)
    gone.dead |= died
    gone.stop(silent - gone.dead)
    live = [d for d in pool.device_ids if d not in gone.dead]
    listed = gone.ask({d: (mv.held_units, ()) for d in live}, timeout_s)
    held = {d: set(ids) for d, ids in listed.items()}
    intact, _ = _sort_out(candidates, held)
    keep = {(g, e.id) for es in intact.values() for e in es for g in e.gpus}
    orphans = {d: [u for u in ids if (d, u) not in keep] for d, ids in held.items()}
    todo = {d: (_drop_all, (ids,)) for d, ids in orphans.items() if ids}
    dropped = gone.ask(todo, timeout_s)
    # a worker lost while dropping takes its units with it
    intact, lost = _sort_out(candidates, {d: h for d, h in held.items() if d not in gone.dead})
    return FaultReport(frozenset(gone.dead),
                       {i: {d: describe_error(e) for d, e in errs.items()}
                        for i, errs in failed.items()},
                       {s: tuple(sorted(es, key=lambda e: e.id)) for s, es in intact.items()},
                       tuple(sorted(lost, key=lambda e: e.id)), timings, dropped,
                       {i: {d: str(e)[-4000:] for d, e in errs.items()}
                        for i, errs in failed.items()},
                       None if cause is None else describe_error(cause), frozenset(gone.hung))


@dataclass
class _Gone:
    """The workers ``reconcile`` has given up on: dead, and (of them) hung ones it stopped."""

    pool: WorkerPool
    dead: set[int]
    hung: set[int]

    def stop(self, ids: set[int]) -> None:
        if ids:
            self.pool.kill(ids)
        self.hung |= ids
        self.dead |= ids

    def ask(self, calls: Mapping[int, tuple[Callable[..., Any], tuple[Any, ...]]],
            timeout_s: float) -> dict[int, Any]:
        """Run ``calls``; the results of the workers that answered. A worker whose call
        failed is given up on (died while we looked); one that did not answer is stopped."""
        if not calls:
            return {}
        try:
            return self.pool.run(calls, timeout_s)
        except WorkerCallsFailed as e:
            self.stop(e.hung)
            self.dead |= set(e.errors)
            return e.results


def _sort_out(candidates: Iterable[Emu], held: Mapping[int, set[str]]
              ) -> tuple[dict[str, list[Emu]], list[Emu]]:
    """(intact units by model-stage, the others): intact when every worker of a unit holds
    it."""
    intact: dict[str, list[Emu]] = {}
    lost: list[Emu] = []
    for e in candidates:
        if all(g in held and e.id in held[g] for g in e.gpus):
            intact.setdefault(e.stage, []).append(e)
        else:
            lost.append(e)
    return intact, lost


@dataclass(frozen=True)
class Recovery:
    """How the job got back onto a plan after a fault."""

    plan: Plan                                      # the plan the job runs now
    destroyed: tuple[str, ...]                      # redundant intact units dropped first
    transition: ExecutionReport | None              # the replanned transition, if any
    restored: tuple[str, ...]                       # model-stages restored from a checkpoint
    checkpoint: str | None                          # where they came from
    units: Mapping[str, tuple[Emu, ...]]
    # a training stage lost its last copy: every trained model's stage was restored from
    # ``checkpoint``, and the steps since it was saved must be redone
    rolled_back: bool = False
    # copies of a trained model's θ that lost every unit, rebuilt from the stage training
    # that model (copy -> training stage): no step is lost
    rebuilt: Mapping[str, str] = field(default_factory=dict)


def _current_plan(job: JobSpec, intact: Mapping[str, tuple[Emu, ...]], target: Plan
                  ) -> tuple[Plan, list[Emu]]:
    """The plan the intact units realize (one layout per stage; the rest are returned to be
    destroyed). Stages without a copy take their target's entry (they are restored)."""
    from nereus.cost.candidate import Candidate
    from nereus.plan.types import Plan, StagePlan

    stages = []
    extra: list[Emu] = []
    for tsp in target.stages:
        units = list(intact.get(tsp.stage, ()))
        if not units:
            stages.append(tsp)
            continue
        by_layout: dict[Any, list[Emu]] = {}
        for e in units:
            by_layout.setdefault(e.layout, []).append(e)
        # keep the layout with the most copies; ties: the target's layout, then the larger
        best = max(by_layout, key=lambda lay: (len(by_layout[lay]), lay == tsp.layout,
                                               lay.size))
        keep = sorted(by_layout[best], key=lambda e: e.id)
        extra += [e for lay, es in by_layout.items() if lay != best for e in es]
        c = tsp.candidate
        cand = Candidate(best, len(keep), c.micro_batch, c.grad_accum, c.recompute)
        stages.append(StagePlan(tsp.stage, cand, tuple(e.gpus for e in keep)))
    return Plan(tuple(stages), source="intact units after a fault"), extra


def recover(pool: WorkerPool, executor: Executor, job: JobSpec, report: FaultReport,
            target_for: Callable[[Sequence[int]], Plan],
            checkpointer: Checkpointer | None = None) -> Recovery:
    """Get the job onto ``target_for(surviving device ids)`` from the intact units.

    Dead workers leave the pool. Model-stages with an intact copy are moved by a replanned
    transition; those without one come back in their target layout: a copy of a trained
    model's θ is rebuilt from that model's training stage where it is intact (``rebuilt``,
    through a scratch folder under ``checkpointer``'s root), any other stage is restored from
    ``checkpointer``'s latest checkpoint, and where that is a training stage, so is every
    stage of every trained model (``rolled_back``; see the module's docstring). The target
    must place every model-stage the job held, and ``checkpointer`` be there for what must be
    rebuilt and its checkpoint hold what must be restored: all are checked before anything is
    dropped or moved (``RuntimeError`` when they do not). A
    worker call here that does not return within ``GRACE_S`` (a checkpoint load: within
    ``Checkpointer.due_s``) fails it (``WorkerCallsFailed``) instead of hanging it.
    """
    from nereus.spec.cluster import GpuPool
    from nereus.transition.emu import phi
    from nereus.transition.planner import plan_transition

    pool.shrink(report.dead)
    target = target_for(pool.device_ids)
    held = {e.stage for es in report.intact.values() for e in es}
    held |= {e.stage for e in report.lost}
    unplaced = sorted(held - set(target.names))
    if unplaced:  # its state would be left on the workers, or lost, outside any plan
        raise RuntimeError(f"the target plan places no {', '.join(unplaced)}, which the job "
                           f"holds: a target after a fault places every model-stage")
    restore, rebuild, rolled_back = _to_restore(job, report, [s.stage for s in target.stages])
    where = _checkpoint_of(restore, checkpointer, rolled_back)
    if rebuild and checkpointer is None:
        names = ", ".join(f"{s} from {t}" for s, t in rebuild.items())
        raise RuntimeError(f"cannot rebuild {names} (no copy survived): no checkpoint folder "
                           "is configured, and the rebuild goes through it")
    kept_intact = {s: es for s, es in report.intact.items() if s not in restore}
    current, extra = _current_plan(job, kept_intact, target)
    extra += [e for s in restore for e in report.intact.get(s, ())]  # rolled back: replaced
    renames: dict[int, dict[str, str]] = {}
    # Units of the kept layout are renamed to the ids Φ(current) gives them.
    phi_current = phi(job, current)
    kept = {s: [e for e in kept_intact.get(s, ()) if e not in extra] for s in phi_current}
    for s, es in kept.items():
        for e in sorted(es, key=lambda u: u.id):
            want = next(u for u in phi_current[s] if u.gpus == e.gpus and u.layout == e.layout)
            if want.id != e.id:
                for g in e.gpus:
                    renames.setdefault(g, {})[e.id] = want.id
    todo: dict[int, list[str]] = {}
    for e in extra:
        for g in e.gpus:
            todo.setdefault(g, []).append(e.id)
    if todo:
        pool.run({g: (_drop_all, (ids,)) for g, ids in todo.items()}, GRACE_S)
    if renames:
        from nereus.runtime.executor import _rename

        token = f"recover-{uuid.uuid4().hex}"
        pool.run({g: (_rename, (m, token)) for g, m in renames.items()}, GRACE_S)
    schedule = plan_transition(job.with_pool(GpuPool(job.cluster, pool.device_ids)), current,
                               target)
    run = executor.run(schedule) if schedule.primitives else None
    units = dict(run.units) if run else dict(phi(job, target))
    phi_target = phi(job, target)
    if restore:
        assert checkpointer is not None and where is not None
        for s in restore:
            checkpointer.restore(pool, s, phi_target[s], executor.specs[s], where)
            units[s] = phi_target[s]
    for s, t in rebuild.items():
        assert checkpointer is not None
        checkpointer.rebuild(pool, units[t][0], phi_target[s], executor.specs[s])
        units[s] = phi_target[s]
    return Recovery(target, tuple(e.id for e in extra), run, restore,
                    None if where is None else str(where), units, rolled_back, rebuild)


def _to_restore(job: JobSpec, report: FaultReport, stages: Sequence[str]
                ) -> tuple[tuple[str, ...], dict[str, str], bool]:
    """(the model-stages to restore from the checkpoint, those to rebuild from the stage
    training their model (copy -> training stage), whether the job rolls back): a stage with
    no intact copy is rebuilt where it holds a copy of a trained model's θ and that model's
    training stage is intact, else restored; where a training stage is lost, every trained
    model's stage is restored and nothing is rebuilt."""
    wf = job.workflow
    lost = report.lost_stages(stages)
    gone, rebuilt = wf.after_loss(lost)
    if gone:  # a training stage among them
        trained = [s for s in stages if wf.model(wf.stage(s).model).trainable]
        return tuple(s for s in stages if s in lost or s in trained), {}, True
    rebuild = {s: t for s, t in rebuilt.items() if t is not None}
    return tuple(s for s in lost if s not in rebuild), rebuild, False


def _checkpoint_of(restore: Sequence[str], checkpointer: Checkpointer | None,
                   rolled_back: bool) -> Path | None:
    """The checkpoint to restore ``restore`` from (None when nothing is restored); a
    ``RuntimeError`` naming what is missing when there is no such checkpoint."""
    if not restore:
        return None
    why = ("a training stage's last copy is lost, so every trained model's stage rolls back "
           "to the checkpoint" if rolled_back else "no copy survived")
    names = ", ".join(restore)
    if checkpointer is None:
        raise RuntimeError(f"cannot restore {names} ({why}): no checkpoint is configured")
    where = checkpointer.latest()
    if where is None:
        raise RuntimeError(f"cannot restore {names} ({why}): no checkpoint was saved under "
                           f"{checkpointer.root}")
    missing = [s for s in restore if not checkpointer.holds(where, s)]
    if missing:
        raise RuntimeError(f"cannot restore {names} ({why}): the checkpoint {where} holds no "
                           f"{', '.join(missing)}")
    return where
