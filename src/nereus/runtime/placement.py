"""Putting a plan's state onto the workers, and reading a unit back for checks.

Every position is built inside the worker that holds it (seeded init or a safetensors slice),
so nothing passes through the driver; ``gather_unit`` is the only path that brings a whole unit
to the driver, for tests and small models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import ray

from nereus.runtime import movement as mv
from nereus.runtime.state import LogicalState, StateSpec, gather
from nereus.runtime.workers import WorkerPool
from nereus.transition.emu import Emu


def place_units(pool: WorkerPool, units: Iterable[Emu], specs: Mapping[str, StateSpec],
                seed: int | Mapping[str, int] = 0, warm: bool = True,
                checkpoint: str | Path | None = None) -> dict[int, int]:
    """Build every position of ``units`` on its worker: seeded (``seed``, one for all stages
    or one per stage; ``warm`` optimizer state) or read from a Hugging Face ``checkpoint``.
    Returns bytes placed per worker."""
    refs: dict[int, list[object]] = {}
    for e in units:
        spec = specs[e.stage]
        lay = (e.layout.tp, e.layout.pp)
        s = seed if isinstance(seed, int) else seed[e.stage]
        for i, g in enumerate(e.gpus):
            if checkpoint is None:
                ref = pool.submit(g, mv.place_seeded, e.id, spec, lay, e.position(i), s, warm)
            else:
                ref = pool.submit(g, mv.place_safetensors, e.id, str(checkpoint), spec, lay,
                                  e.position(i), s)
            refs.setdefault(g, []).append(ref)
    return {g: sum(ray.get(rs)) for g, rs in refs.items()}


def place_plan(pool: WorkerPool, job: object, plan: object, specs: Mapping[str, StateSpec],
               seed: int | Mapping[str, int] = 0, stages: Sequence[str] | None = None, warm: bool = True,
               checkpoint: str | Path | None = None) -> dict[str, tuple[Emu, ...]]:
    """Place Φ(plan) (optionally only ``stages``) and return it."""
    from nereus.transition.emu import phi

    units = phi(job, plan)  # type: ignore[arg-type]
    if stages is not None:
        units = {s: units[s] for s in stages}
    place_units(pool, [e for es in units.values() for e in es], specs, seed, warm, checkpoint)
    return units


def gather_unit(pool: WorkerPool, emu: Emu) -> LogicalState:
    """The logical state one unit holds, assembled on the driver from every position."""
    refs = [pool.submit(g, mv.export_unit, emu.id) for g in emu.gpus]
    return gather(ray.get(refs))


def verify_units(pool: WorkerPool, units: Iterable[Emu], seed: int, warm: bool = True
                 ) -> list[str]:
    """Check every position against the seeded state on its own worker (bitwise); returns the
    differences found (empty when every unit equals the seeded state)."""
    refs = [pool.submit(g, mv.verify_seeded, e.id, seed, warm) for e in units for g in e.gpus]
    return [r for r in ray.get(refs) if r is not None]
