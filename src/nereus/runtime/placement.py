"""Putting a plan's state onto the workers, and reading a unit back for checks.

Every position is built inside the worker that holds it (seeded init or a safetensors slice),
so nothing passes through the driver; ``gather_unit`` is the only path that brings a whole unit
to the driver, for tests and small models.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from nereus.runtime import movement as mv
from nereus.runtime.state import LogicalState, StateMismatch, StateSpec, gather
from nereus.runtime.workers import WorkerPool
from nereus.transition.emu import Emu, stage_of

if TYPE_CHECKING:
    from nereus.plan.types import Plan
    from nereus.spec.job import JobSpec
    from nereus.transition.schedule import Schedule


def place_units(pool: WorkerPool, units: Iterable[Emu], specs: Mapping[str, StateSpec],
                seed: int | Mapping[str, int] = 0, warm: bool = True,
                checkpoint: str | Path | None = None,
                offloaded: Collection[str] = ()) -> dict[int, int]:
    """Build every position of ``units`` on its worker: seeded (``seed``, one for all stages
    or one per stage; ``warm`` optimizer state) or read from a Hugging Face ``checkpoint``.
    Units whose ids are in ``offloaded`` are built in host memory, not counted against the
    workers' capacity until loaded. Returns bytes placed per worker."""
    refs: dict[int, list[ray.ObjectRef[int]]] = {}
    for e in units:
        spec = specs[e.stage]
        lay = (e.layout.tp, e.layout.pp)
        s = seed if isinstance(seed, int) else seed[e.stage]
        host = e.id in offloaded
        for i, g in enumerate(e.gpus):
            if checkpoint is None:
                ref = pool.submit(g, mv.place_seeded, e.id, spec, lay, e.position(i), s, warm,
                                  host)
            else:
                ref = pool.submit(g, mv.place_safetensors, e.id, str(checkpoint), spec, lay,
                                  e.position(i), s, host)
            refs.setdefault(g, []).append(ref)
    return {g: sum(ray.get(rs)) for g, rs in refs.items()}


def place_current(pool: WorkerPool, schedule: Schedule, specs: Mapping[str, StateSpec],
                  seed: int | Mapping[str, int] = 0, stages: Collection[str] | None = None,
                  warm: bool = True) -> list[Emu]:
    """Place the current units of ``schedule`` (of ``stages``; by default the model-stages it
    changes) held as the schedule assumes at its start (``nereus.runtime.residency``):
    those it loads later, or never, in host memory. Returns the units placed."""
    from nereus.runtime.residency import residency

    keep = set(schedule.changed if stages is None else stages)
    units = [e for s, es in schedule.initial.items() if s in keep for e in es]
    place_units(pool, units, specs, seed, warm, offloaded=residency(schedule).offloaded_at_start)
    return units


def place_plan(pool: WorkerPool, job: JobSpec, plan: Plan, specs: Mapping[str, StateSpec],
               seed: int | Mapping[str, int] = 0, stages: Sequence[str] | None = None,
               warm: bool = True,
               checkpoint: str | Path | None = None) -> dict[str, tuple[Emu, ...]]:
    """Place Φ(plan) (optionally only ``stages``) and return it."""
    from nereus.transition.emu import phi

    units = phi(job, plan)
    if stages is not None:
        units = {s: units[s] for s in stages}
    place_units(pool, [e for es in units.values() for e in es], specs, seed, warm, checkpoint)
    return units


def gather_unit(pool: WorkerPool, emu: Emu) -> LogicalState:
    """The logical state one unit holds, assembled on the driver from every position. Each
    GPU's shard must be the position ``emu`` gives that GPU (``StateMismatch`` if not):
    ``gather`` alone accepts every position present, whichever GPU holds it."""
    refs = [pool.submit(g, mv.export_unit, emu.id) for g in emu.gpus]
    shards = ray.get(refs)
    lay = (emu.layout.tp, emu.layout.pp)
    for i, (g, st) in enumerate(zip(emu.gpus, shards)):
        wrong = mv.position_difference(emu.id, g, lay, emu.position(i), (st.tp, st.pp),
                                       st.position)
        if wrong is not None:
            raise StateMismatch(wrong)
    return gather(shards)


def verify_units(pool: WorkerPool, units: Iterable[Emu], seed: int | Mapping[str, int],
                 warm: bool = True, *, expected: Iterable[Emu] | None = None) -> list[str]:
    """Check every position on its own worker: the unit is held there as the layout and
    position the unit gives that GPU, and equals the seeded state (``seed``: one for all, or
    one per model-stage) bitwise. Then the units the workers hold (``held_differences``):
    with ``expected``, the whole collection the workers should hold, every worker of the pool
    holds exactly its units; without, each GPU of ``units`` holds no other unit of their
    model-stages. Returns the differences found (empty when all is as it should be)."""
    units = list(units)
    refs = []
    for e in units:
        s = seed if isinstance(seed, int) else seed[e.stage]
        lay = (e.layout.tp, e.layout.pp)
        refs += [pool.submit(g, mv.verify_seeded, e.id, s, warm, lay, e.position(i))
                 for i, g in enumerate(e.gpus)]
    diffs = [r for r in ray.get(refs) if r is not None]
    checked = {(g, e.id) for e in units for g in e.gpus}  # a missing one is reported above
    if expected is None:
        return diffs + held_differences(pool, units, complete=False, skip=checked)
    return diffs + held_differences(pool, expected, complete=True, skip=checked)


def held_differences(pool: WorkerPool, units: Iterable[Emu], complete: bool = True,
                     skip: Collection[tuple[int, str]] = ()) -> list[str]:
    """Units held where ``units`` places none, and units ``units`` places that are not held,
    per worker. ``complete``: ``units`` is everything the workers should hold, so every
    worker of the pool is compared with it (a Destroy that left its source behind shows).
    Else only the GPUs of ``units``, and only units of their model-stages: a GPU holds one
    replica of a model-stage, so another one there is left over (a Split's or Merge's
    source). ``skip``: (GPU, unit id) pairs whose absence was reported already."""
    units = list(units)
    want: dict[int, set[str]] = {}
    for e in units:
        for g in e.gpus:
            want.setdefault(g, set()).add(e.id)
    devices = pool.device_ids if complete else tuple(sorted(want))
    held = pool.run({g: (mv.held_units, ()) for g in devices})
    stages = {e.stage for e in units}
    out = []
    for g in devices:
        have = set(held[g])
        if not complete:
            have = {u for u in have if stage_of(u) in stages}
        mine = want.get(g, set())
        extra = sorted(have - mine)
        missing = sorted(u for u in mine - have if (g, u) not in skip)
        if extra:
            out.append(f"GPU {g} holds unit(s) {extra} that the target does not place there"
                       f" (expected {sorted(mine)})")
        if missing:
            out.append(f"GPU {g} lacks unit(s) {missing} that the target places there")
    return out
