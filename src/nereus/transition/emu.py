"""EMUs: one DP replica of one model-stage, the unit every transition primitive acts on.

TP and PP live inside an EMU, DP is the set of EMUs (paper §5). An EMU id is a stable string
``"<stage>/<n>"`` so the runtime can key the state it holds by it: ``Φ(plan)`` names replica
``i`` of a stage ``"<stage>/<i>"``, and units a transition creates take the next free numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from nereus.cost.candidate import Layout
from nereus.errors import InputError
from nereus.plan.types import Plan, StagePlan
from nereus.spec.cluster import format_gpus
from nereus.spec.job import JobSpec
from nereus.spec.workflow import StageKind


class Holds(str, Enum):
    """Which logical state an EMU holds a complete copy of."""

    THETA = "theta"              # parameters only: generation and forward stages, frozen models
    THETA_OMEGA = "theta+omega"  # parameters and optimizer tensors: training stages


@dataclass(frozen=True)
class Emu:
    """(model-stage, layout, ordered GPU ids, held state). GPU ``gpus[i]`` holds TP/PP position
    ``(i % tp, i // tp)``; every EMU is a complete replica of its model-stage's state."""

    id: str
    stage: str
    model: str
    layout: Layout
    gpus: tuple[int, ...]
    holds: Holds

    def __post_init__(self) -> None:
        if len(self.gpus) != self.layout.size:
            raise InputError(f"emu {self.id}.gpus",
                             f"{len(self.gpus)} GPUs for tp x pp = {self.layout.size}")
        if len(set(self.gpus)) != len(self.gpus):
            raise InputError(f"emu {self.id}.gpus", "a GPU appears twice")

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def trainable(self) -> bool:
        return self.holds is Holds.THETA_OMEGA

    def position(self, index: int) -> tuple[int, int]:
        """(tp_rank, pp_rank) held by ``gpus[index]``."""
        return index % self.layout.tp, index // self.layout.tp

    def same_unit(self, other: Emu) -> bool:
        """Same stage, layout and GPU order (the ids may differ)."""
        return (self.stage, self.layout, self.gpus) == (other.stage, other.layout, other.gpus)

    def __str__(self) -> str:
        return f"{self.id}[tp={self.layout.tp},pp={self.layout.pp}]@{format_gpus(self.gpus)}"


def emu_id(stage: str, n: int) -> str:
    return f"{stage}/{n}"


def stage_of(unit_id: str) -> str:
    """The model-stage of a unit id (``emu_id``'s ``"<stage>/<n>"``)."""
    return unit_id.rsplit("/", 1)[0]


def holds_for(job: JobSpec, stage: str) -> tuple[str, Holds]:
    """(model name, held state) of a model-stage: training stages hold θ and ω, others θ."""
    ms = job.workflow.stage(stage)
    role = job.workflow.model(ms.model)
    trains = ms.kind is StageKind.TRAIN and role.trainable
    return ms.model, Holds.THETA_OMEGA if trains else Holds.THETA


def phi_stage(job: JobSpec, sp: StagePlan) -> tuple[Emu, ...]:
    """Φ(π_M): the EMUs of one model-stage, replica ``i`` named ``"<stage>/<i>"``."""
    model, holds = holds_for(job, sp.stage)
    return tuple(Emu(emu_id(sp.stage, i), sp.stage, model, sp.layout, tuple(r), holds)
                 for i, r in enumerate(sp.replicas))


def phi(job: JobSpec, plan: Plan) -> dict[str, tuple[Emu, ...]]:
    """Φ(S): the EMU collection of every model-stage of a plan."""
    return {sp.stage: phi_stage(job, sp) for sp in plan.stages}


def realization_problem(emus: Iterable[Emu], plan: Plan) -> str | None:
    """Why a collection of EMUs does not realize ``plan`` (None when it does).

    It does when every model-stage has exactly the plan's replicas (layout and GPU order), in
    any order, and nothing else.
    """
    by_stage: dict[str, list[tuple[Layout, tuple[int, ...]]]] = {}
    for e in emus:
        by_stage.setdefault(e.stage, []).append((e.layout, e.gpus))
    for sp in plan.stages:
        have = sorted(by_stage.pop(sp.stage, []), key=_unit_key)
        want = sorted(((sp.layout, tuple(r)) for r in sp.replicas), key=_unit_key)
        if have != want:
            return (f"{sp.stage}: holds {_describe(have)}, plan wants {_describe(want)}")
    if by_stage:
        return f"model-stages {sorted(by_stage)} hold units the plan does not list"
    return None


def realizes(emus: Iterable[Emu], plan: Plan) -> bool:
    return realization_problem(emus, plan) is None


def _unit_key(u: tuple[Layout, tuple[int, ...]]) -> tuple[int, int, tuple[int, ...]]:
    return u[0].tp, u[0].pp, u[1]


def _describe(units: list[tuple[Layout, tuple[int, ...]]]) -> str:
    if not units:
        return "no unit"
    return ", ".join(f"tp={lay.tp},pp={lay.pp}@{format_gpus(g)}" for lay, g in units)




def renames(final: Mapping[str, tuple[Emu, ...]]) -> dict[str, str]:
    """Ids of the units realizing a target plan -> the ids Φ(target) gives them.

    ``final[stage][i]`` is the unit that realizes replica ``i``; after a transition the runtime
    renames units so the next transition's Φ(current) finds them.
    """
    return {e.id: emu_id(stage, i) for stage, units in final.items() for i, e in enumerate(units)}
