"""Where a transition schedule assumes each current unit is when: on its devices, or offloaded.

The transition planner (``nereus.transition.global_dag``) prices a move at a boundary between
phases, where idle state is offloaded to host memory: a current unit of a changed model-stage
that a Split, Merge or Extend reads is loaded onto its GPUs, all of them at the start or, when
the schedule ``loads_on_first_read``, each by the first primitive that reads it; every other
current unit (one that is only destroyed or kept as it is, and every unit of a model-stage that
does not change) stays offloaded, and destroying it frees no device memory. The executor holds
the state that way (``Executor.run``), so a schedule the planner certified fits on the workers.

The schedule does not carry this as data; it is derived here from its public fields by the
planner's rule. The first reader is the reader of lowest schedule index: the planner orders a
unit's other readers after its first one (resource edges), and the schedule's indices follow
start times, so that is the same primitive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nereus.runtime.state import StateSpec, position_bytes
from nereus.transition.emu import Emu
from nereus.transition.schedule import Schedule


@dataclass(frozen=True)
class Residency:
    """A schedule's residency assumptions. ``loaded_at_start``: current unit ids on their
    devices before the first primitive; every other current unit starts offloaded.
    ``first_reader``: unit id -> schedule index of the first primitive that reads it (Split,
    Merge, Extend): where it is loaded when the schedule loads on first read."""

    units: Mapping[str, Emu]
    loaded_at_start: frozenset[str]
    first_reader: Mapping[str, int]
    loads_on_first_read: bool

    @property
    def offloaded_at_start(self) -> frozenset[str]:
        return frozenset(self.units) - self.loaded_at_start

    def loads(self) -> dict[int, tuple[str, ...]]:
        """Schedule index -> the units it loads (none unless the schedule loads on first
        read)."""
        if not self.loads_on_first_read:
            return {}
        out: dict[int, list[str]] = {}
        for u, k in sorted(self.first_reader.items()):
            out.setdefault(k, []).append(u)
        return {k: tuple(us) for k, us in out.items()}


def residency(schedule: Schedule) -> Residency:
    """The residency the planner assumed for ``schedule`` (see the module docstring)."""
    units = {e.id: e for es in schedule.initial.values() for e in es}
    changed = {e.id for s in schedule.changed for e in schedule.initial.get(s, ())}
    first: dict[str, int] = {}
    for sp in sorted(schedule.primitives, key=lambda sp: sp.index):
        if sp.op == "Destroy":
            continue
        for e in sp.primitive.inputs:
            if e.id in changed:
                first.setdefault(e.id, sp.index)
    at_start = frozenset() if schedule.loads_on_first_read else frozenset(first)
    return Residency(units, at_start, first, schedule.loads_on_first_read)


def unit_bytes(e: Emu, spec: StateSpec) -> dict[int, int]:
    """The runtime's arena bytes of each position of ``e``, by GPU."""
    lay = (e.layout.tp, e.layout.pp)
    return {g: position_bytes(spec, *lay, *e.position(i)) for i, g in enumerate(e.gpus)}
