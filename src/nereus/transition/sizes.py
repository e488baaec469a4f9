"""Bytes every position of an EMU holds: what a transition allocates, frees and moves.

One number per (layout, position), from the sharding format (``nereus.cost.state``); positions
differ because the first pipeline block holds the embedding and the last the head. Cached per
layout because a 256-GPU transition asks for the same few layouts thousands of times.
"""

from __future__ import annotations

from functools import lru_cache

from nereus.cost.candidate import Layout
from nereus.cost.state import emu_state_bytes
from nereus.spec.device import GiB
from nereus.spec.job import JobSpec
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workload import Workload
from nereus.transition.emu import Emu, Holds
from nereus.transition.workspace import split_staging_bytes, state_element_bytes


@lru_cache(maxsize=1024)
def position_bytes(model: ModelSpec, head: Head, trainable: bool, workload: Workload,
                   tp: int, pp: int) -> tuple[int, ...]:
    """State bytes of each position of a (tp, pp) unit, indexed ``pp_rank * tp + tp_rank``."""
    lay = Layout(tp, pp)
    return tuple(emu_state_bytes(model, head, lay, trainable, workload, i % tp, i // tp)
                 for i in range(tp * pp))


def format_bytes(nbytes: float) -> str:
    """Bytes in GiB, or MiB below one GiB (a tiny model's state is not '0.0 GiB')."""
    if abs(nbytes) >= GiB:
        return f"{nbytes / GiB:.1f} GiB"
    return f"{nbytes / 2**20:.2f} MiB"


class StateSizes:
    """Bytes per EMU position for one job (its model, heads and dtypes)."""

    def __init__(self, job: JobSpec):
        self.job = job
        self._heads = {m.name: m.head for m in job.workflow.models}
        # per (model, held state, tp, pp): the shared cache hashes the whole model spec on
        # every call, which costs more than the lookup itself when a schedule asks thousands
        self._of: dict[tuple[str, Holds, int, int], tuple[int, ...]] = {}
        self._staging: dict[tuple[str, bool, int, int, int, int], int] = {}

    def head(self, model: str) -> Head:
        return self._heads[model]

    def of(self, emu: Emu) -> tuple[int, ...]:
        """Bytes held by ``emu.gpus[i]``, for every i."""
        lay = emu.layout
        key = (emu.model, emu.holds, lay.tp, lay.pp)  # holds: what decides trainable
        got = self._of.get(key)
        if got is None:
            got = self._of[key] = position_bytes(self.job.model, self._heads[emu.model],
                                                 emu.trainable, self.job.workload, lay.tp,
                                                 lay.pp)
        return got

    def of_layout(self, model: str, trainable: bool, layout: Layout) -> tuple[int, ...]:
        return position_bytes(self.job.model, self._heads[model], trainable, self.job.workload,
                              layout.tp, layout.pp)

    def split_staging(self, model: str, trainable: bool, layout: Layout, sub: Layout) -> int:
        """Bytes of staging buffers each GPU of a Split of a ``layout`` unit into ``sub`` holds
        while it runs, at the smallest all-gather chunk the runtime shrinks to
        (``nereus.transition.workspace``)."""
        key = (model, trainable, layout.tp, layout.pp, sub.tp, sub.pp)
        got = self._staging.get(key)
        if got is None:
            got = self._staging[key] = split_staging_bytes(
                self.job.model, self._heads[model], (layout.tp, layout.pp), (sub.tp, sub.pp),
                state_element_bytes(self.job.workload, trainable))
        return got

    def total(self, emu: Emu) -> int:
        return sum(self.of(emu))

    def layout_problem(self, layout: Layout) -> str | None:
        return layout_problem(self.job.model, layout.tp, layout.pp)
