"""The four primitives over EMUs (paper §5.2) as values with their preconditions.

- ``Split(emu, T_sub)``: one unit of layout T becomes k = (tp/tp_sub)(pp/pp_sub) complete units
  of T_sub on the same GPUs, by a position-wise all-gather inside each group of k GPUs that
  share a T_sub-position. Source shards stay until the all-gather ends. While it runs, each
  GPU also holds the all-gather's staging buffers for the regions that land strided in the
  new shard (when TP shrinks): counted at the smallest chunk the runtime shrinks them to, with
  the formula the runtime reserves them by (``nereus.transition.workspace``), so a Split the
  planner fits is one the runtime's memory check admits.
- ``Merge(emus, T)``: k complete units of T_sub become one unit of T; each GPU allocates its
  new shard and cuts it out of the sub-shard it holds, which is freed when the cut ends (the
  runtime keeps a unit's state in one contiguous arena, so the sub-shard cannot be freed a
  tensor at a time), so its peak is the sub-shard plus the new shard. No collective, nothing
  crosses a link.
- Staged through host memory (``staged=True``), for a Split or Merge too big for a GPU as
  above: each GPU first copies what it needs of its source position to host memory and frees
  it there, then allocates the new shard and fills it from the host copy (a Split's
  all-gather sends from it). The peak is the larger of the two shards, at the price of the
  host copies; same semantics, same transfers between GPUs. A staged Split still holds its
  staging buffers beside the new shard.
- ``Extend(emu, R')``: a new unit with the same layout on disjoint GPUs R'; GPU i of the source
  sends its shard to GPU i of R'. The receiving copy is allocated when the primitive starts.
- ``Destroy(emu)``: local teardown; its bytes are freed when it ends. Allowed only while another
  unit of the same model-stage holds a complete copy.

Each primitive knows the bytes it sends between every GPU pair and, on every GPU it touches,
the bytes of its own units before, during and after it (``MemStep``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from nereus.cost.candidate import Layout
from nereus.spec.model import ModelSpec
from nereus.transition.emu import Emu
from nereus.transition.nesting import (
    factors,
    gather_groups,
    merge_gpus,
    nesting_problem,
    split_gpus,
    sub_index,
)
from nereus.transition.sizes import StateSizes


class PrimitiveError(ValueError):
    """A primitive whose preconditions do not hold: names the primitive and the rule."""


@dataclass(frozen=True)
class Transfer:
    """``bytes`` sent from GPU ``src`` to GPU ``dst`` by one primitive."""

    src: int
    dst: int
    bytes: int


class MemStep(NamedTuple):
    """Bytes of a primitive's own units on one GPU before, at the peak during, and after it.
    A named tuple: schedulers unpack millions of them."""

    before: int
    during: int
    after: int

    @property
    def extra(self) -> int:
        """Bytes the GPU must have free when the primitive starts."""
        return self.during - self.before

    @property
    def net(self) -> int:
        return self.after - self.before


def _same_state(a: Emu, b: Emu) -> bool:
    return (a.stage, a.model, a.holds) == (b.stage, b.model, b.holds)


@dataclass(frozen=True)
class Split:
    emu: Emu
    sub: Layout
    outputs: tuple[Emu, ...]
    staged: bool = False  # the source goes through host memory (see the module's docstring)
    op: ClassVar[str] = "Split"

    @classmethod
    def of(cls, emu: Emu, sub: Layout, ids: Sequence[str], staged: bool = False) -> Split:
        gpus = split_gpus(emu.gpus, emu.layout, sub)
        if len(ids) != len(gpus):
            raise PrimitiveError(f"Split({emu.id}): {len(ids)} ids for {len(gpus)} units")
        return cls(emu, sub, tuple(Emu(i, emu.stage, emu.model, sub, g, emu.holds)
                                   for i, g in zip(ids, gpus)), staged)

    def __post_init__(self) -> None:
        lay, sub = self.emu.layout, self.sub
        if lay.tp % sub.tp or lay.pp % sub.pp:
            raise PrimitiveError(f"Split({self.emu.id}): {sub} does not divide {lay}")
        m_tp, m_pp = factors(lay, sub)
        if m_tp * m_pp < 2:
            raise PrimitiveError(f"Split({self.emu.id}): {sub} equals the unit's layout; "
                                 "a split needs k >= 2")
        want = split_gpus(self.emu.gpus, lay, sub)
        got = tuple(o.gpus for o in self.outputs)
        if got != want or any(o.layout != sub or not _same_state(o, self.emu)
                              for o in self.outputs):
            raise PrimitiveError(f"Split({self.emu.id}): outputs do not follow the nesting "
                                 "mapping of the layout contract")

    @property
    def stage(self) -> str:
        return self.emu.stage

    @property
    def inputs(self) -> tuple[Emu, ...]:
        return (self.emu,)

    @property
    def consumed(self) -> tuple[Emu, ...]:
        """The units that are gone once it ends (its inputs)."""
        return self.inputs

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.emu.gpus

    @property
    def k(self) -> int:
        m_tp, m_pp = factors(self.emu.layout, self.sub)
        return m_tp * m_pp

    def groups(self) -> tuple[tuple[int, ...], ...]:
        """GPU ids of each all-gather group (one per T_sub-position)."""
        return tuple(tuple(self.emu.gpus[i] for i in grp)
                     for grp in gather_groups(self.emu.layout, self.sub))

    def transfers(self, sizes: StateSizes) -> tuple[Transfer, ...]:
        src = sizes.of(self.emu)
        out: list[Transfer] = []
        for grp in gather_groups(self.emu.layout, self.sub):
            for a in grp:
                for b in grp:
                    if a != b:
                        out.append(Transfer(self.emu.gpus[a], self.emu.gpus[b], src[a]))
        return tuple(out)

    def memory(self, sizes: StateSizes) -> dict[int, MemStep]:
        """The source and the new shard (only the larger when staged), plus the all-gather's
        staging buffers while it runs."""
        src = sizes.of(self.emu)
        dst = sizes.of(self.outputs[0])
        lay, sub = self.emu.layout, self.sub
        work = sizes.split_staging(self.emu.model, self.emu.trainable, lay, sub)
        out: dict[int, MemStep] = {}
        for i, g in enumerate(self.emu.gpus):
            s = dst[sub_index(i, lay, sub)[1]]
            peak = max(src[i], s + work) if self.staged else src[i] + s + work
            out[g] = MemStep(src[i], peak, s)
        return out

    def host_bytes(self, sizes: StateSizes) -> dict[int, int]:
        """Bytes each GPU copies to host memory and back when staged (0 otherwise): its source
        position out, then the same bytes in again (its own piece, and what it sends)."""
        if not self.staged:
            return {}
        src = sizes.of(self.emu)
        return {g: 2 * src[i] for i, g in enumerate(self.emu.gpus)}

    def check(self, alive: Mapping[str, Emu], model: ModelSpec | None = None) -> None:
        _need_alive(self, (self.emu,), alive)
        _need_new(self, self.outputs, alive)
        if model is not None:
            p = nesting_problem(model, self.emu.layout, self.sub)
            if p:
                raise PrimitiveError(f"Split({self.emu.id}) into {self.sub}: {p}")


@dataclass(frozen=True)
class Merge:
    emus: tuple[Emu, ...]
    layout: Layout
    output: Emu
    staged: bool = False  # the new shard goes through host memory (see the module's docstring)
    op: ClassVar[str] = "Merge"

    @classmethod
    def of(cls, emus: Sequence[Emu], layout: Layout, new_id: str, staged: bool = False
           ) -> Merge:
        problem = _merge_problem(emus, layout)
        if problem:
            raise PrimitiveError(problem)
        first = emus[0]
        gpus = merge_gpus([e.gpus for e in emus], first.layout, layout)
        return cls(tuple(emus), layout, Emu(new_id, first.stage, first.model, layout, gpus,
                                            first.holds), staged)

    def __post_init__(self) -> None:
        problem = _merge_problem(self.emus, self.layout)
        if problem:
            raise PrimitiveError(problem)
        want = merge_gpus([e.gpus for e in self.emus], self.emus[0].layout, self.layout)
        if (self.output.gpus != want or self.output.layout != self.layout
                or not _same_state(self.output, self.emus[0])):
            raise PrimitiveError(f"Merge({', '.join(e.id for e in self.emus)}): output does "
                                 "not follow the nesting mapping")

    @property
    def stage(self) -> str:
        return self.output.stage

    @property
    def inputs(self) -> tuple[Emu, ...]:
        return self.emus

    @property
    def consumed(self) -> tuple[Emu, ...]:
        """The units that are gone once it ends (its inputs)."""
        return self.inputs

    @property
    def outputs(self) -> tuple[Emu, ...]:
        return (self.output,)

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.output.gpus

    def transfers(self, sizes: StateSizes) -> tuple[Transfer, ...]:
        return ()

    def memory(self, sizes: StateSizes) -> dict[int, MemStep]:
        new = sizes.of(self.output)
        out: dict[int, MemStep] = {}
        pos = {g: i for i, g in enumerate(self.output.gpus)}
        for e in self.emus:
            old = sizes.of(e)
            for i, g in enumerate(e.gpus):
                j = pos[g]
                peak = max(old[i], new[j]) if self.staged else old[i] + new[j]
                out[g] = MemStep(old[i], peak, new[j])
        return out

    def host_bytes(self, sizes: StateSizes) -> dict[int, int]:
        """Bytes each GPU copies to host memory and back when staged (0 otherwise): its whole
        sub-shard out (so a failed Merge can put it back), then the new shard in."""
        if not self.staged:
            return {}
        new = sizes.of(self.output)
        pos = {g: j for j, g in enumerate(self.output.gpus)}
        return {g: old[i] + new[pos[g]] for e in self.emus
                for old in (sizes.of(e),) for i, g in enumerate(e.gpus)}

    def check(self, alive: Mapping[str, Emu], model: ModelSpec | None = None) -> None:
        _need_alive(self, self.emus, alive)
        _need_new(self, (self.output,), alive)
        if model is not None:
            p = nesting_problem(model, self.layout, self.emus[0].layout)
            if p:
                raise PrimitiveError(f"Merge into {self.layout}: {p}")


@dataclass(frozen=True)
class Extend:
    emu: Emu
    targets: tuple[int, ...]
    output: Emu
    op: ClassVar[str] = "Extend"
    staged: ClassVar[bool] = False  # only a Split or Merge goes through host memory

    @classmethod
    def of(cls, emu: Emu, targets: Sequence[int], new_id: str) -> Extend:
        tg = tuple(targets)
        if len(tg) != emu.size:
            raise PrimitiveError(f"Extend({emu.id}): {len(tg)} target GPUs for a unit of "
                                 f"{emu.size}")
        return cls(emu, tg, Emu(new_id, emu.stage, emu.model, emu.layout, tg, emu.holds))

    def __post_init__(self) -> None:
        name = f"Extend({self.emu.id})"
        if len(self.targets) != self.emu.size or len(set(self.targets)) != len(self.targets):
            raise PrimitiveError(f"{name}: needs {self.emu.size} distinct target GPUs")
        both = set(self.targets) & set(self.emu.gpus)
        if both:
            raise PrimitiveError(f"{name}: target GPUs {sorted(both)} are the source's own; "
                                 "R' must be disjoint from the unit")
        if (self.output.gpus != self.targets or self.output.layout != self.emu.layout
                or not _same_state(self.output, self.emu)):
            raise PrimitiveError(f"{name}: output must be the same layout on R'")

    @property
    def stage(self) -> str:
        return self.emu.stage

    @property
    def inputs(self) -> tuple[Emu, ...]:
        return (self.emu,)

    @property
    def consumed(self) -> tuple[Emu, ...]:
        """None: the source stays (an Extend copies it)."""
        return ()

    @property
    def outputs(self) -> tuple[Emu, ...]:
        return (self.output,)

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.emu.gpus + self.targets

    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.emu.gpus, self.targets))

    def transfers(self, sizes: StateSizes) -> tuple[Transfer, ...]:
        s = sizes.of(self.emu)
        return tuple(Transfer(a, b, s[i]) for i, (a, b) in enumerate(self.pairs()))

    def memory(self, sizes: StateSizes) -> dict[int, MemStep]:
        s = sizes.of(self.emu)
        out = {g: MemStep(s[i], s[i], s[i]) for i, g in enumerate(self.emu.gpus)}
        out.update({g: MemStep(0, s[i], s[i]) for i, g in enumerate(self.targets)})
        return out

    def check(self, alive: Mapping[str, Emu], model: ModelSpec | None = None) -> None:
        _need_alive(self, (self.emu,), alive)
        _need_new(self, (self.output,), alive)


@dataclass(frozen=True)
class Destroy:
    emu: Emu
    op: ClassVar[str] = "Destroy"
    staged: ClassVar[bool] = False

    @property
    def stage(self) -> str:
        return self.emu.stage

    @property
    def inputs(self) -> tuple[Emu, ...]:
        return (self.emu,)

    @property
    def consumed(self) -> tuple[Emu, ...]:
        """The units that are gone once it ends (its inputs)."""
        return self.inputs

    @property
    def outputs(self) -> tuple[Emu, ...]:
        return ()

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.emu.gpus

    def transfers(self, sizes: StateSizes) -> tuple[Transfer, ...]:
        return ()

    def memory(self, sizes: StateSizes) -> dict[int, MemStep]:
        s = sizes.of(self.emu)
        return {g: MemStep(s[i], s[i], 0) for i, g in enumerate(self.emu.gpus)}

    def check(self, alive: Mapping[str, Emu], model: ModelSpec | None = None) -> None:
        """``alive``: the units alive when it starts, others being destroyed excluded."""
        _need_alive(self, (self.emu,), alive)
        if not any(e.stage == self.emu.stage and e.id != self.emu.id for e in alive.values()):
            raise PrimitiveError(f"Destroy({self.emu.id}): it holds the last copy of "
                                 f"{self.emu.stage}'s state")


Primitive = Split | Merge | Extend | Destroy


def _merge_problem(emus: Sequence[Emu], layout: Layout) -> str | None:
    name = f"Merge({', '.join(e.id for e in emus)})"
    if len(emus) < 2:
        return f"{name}: a merge needs k >= 2 units"
    sub = emus[0].layout
    if any(e.layout != sub for e in emus):
        return f"{name}: units have different layouts {sorted({str(e.layout) for e in emus})}"
    if any(not _same_state(e, emus[0]) for e in emus):
        return f"{name}: units of different model-stages or state"
    if layout.tp % sub.tp or layout.pp % sub.pp:
        return f"{name}: {sub} does not divide {layout}"
    m_tp, m_pp = factors(layout, sub)
    if m_tp * m_pp != len(emus):
        return f"{name}: merging {sub} into {layout} takes {m_tp * m_pp} units, got {len(emus)}"
    flat = [g for e in emus for g in e.gpus]
    if len(set(flat)) != len(flat):
        return f"{name}: units share GPUs"
    return None


def _need_alive(p: Primitive, emus: Sequence[Emu], alive: Mapping[str, Emu]) -> None:
    for e in emus:
        have = alive.get(e.id)
        if have is None or not have.same_unit(e):
            raise PrimitiveError(f"{p.op}({e.id}): unit {e} is not alive")


def _need_new(p: Primitive, emus: Sequence[Emu], alive: Mapping[str, Emu]) -> None:
    for e in emus:
        if e.id in alive:
            raise PrimitiveError(f"{p.op}: id {e.id} is already taken by a live unit")
