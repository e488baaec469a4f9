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

from nereus.transition.emu import Emu
from nereus.transition.schedule import Schedule


@dataclass(frozen=True)
class Residency:
    """A schedule's residency assumptions. ``loaded_at_start``: current unit ids on their
    devices before the first primitive; every other current unit starts offloaded, and the
    first primitive that reads one loads it (``nereus.runtime.primitives.loads``)."""

    units: Mapping[str, Emu]
    loaded_at_start: frozenset[str]
    loads_on_first_read: bool

    @property
    def offloaded_at_start(self) -> frozenset[str]:
        return frozenset(self.units) - self.loaded_at_start

def residency(schedule: Schedule) -> Residency:
    """The residency the planner assumed for ``schedule`` (see the module docstring)."""
    units = {e.id: e for es in schedule.initial.values() for e in es}
    changed = {e.id for s in schedule.changed for e in schedule.initial.get(s, ())}
    read = {e.id for sp in schedule.primitives if sp.op != "Destroy"
            for e in sp.primitive.inputs if e.id in changed}
    at_start = frozenset() if schedule.loads_on_first_read else frozenset(read)
    return Residency(units, at_start, schedule.loads_on_first_read)
