"""A plan: one placed candidate per model-stage, and its JSON form (``nereus plan --json``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nereus.cost.candidate import Candidate, Layout
from nereus.errors import InputError, count
from nereus.files import read_json, validate
from nereus.spec.cluster import MAX_DEVICES
from nereus.spec.workflow import WORKFLOWS

if TYPE_CHECKING:
    from nereus.cost.estimate import Estimate
    from nereus.cost.model import CostModel, Links


def replica_problem(replicas: Sequence[Sequence[int]], dp: int, size: int) -> str | None:
    """What is wrong with a model-stage's GPU lists (one per DP replica, tp x pp = ``size``
    ids each, no GPU twice), or None: the rule for plans and plan files. A layout's lists are
    checked by ``nereus.plan.evaluate`` against the same rule, with errors that name the list
    and the job's pool."""
    if len(replicas) != dp:
        return f"{len(replicas)} GPU lists for dp = {dp}"
    bad = [r for r in replicas if len(r) != size]
    if bad:
        return f"a replica lists {count(len(bad[0]), 'GPU')} for tp x pp = {size}"
    flat = [g for r in replicas for g in r]
    if len(set(flat)) != len(flat):
        return "a GPU appears twice"
    return None


def replica_rule(dp: int, size: int) -> str:
    """What :func:`replica_problem` allows, as an error's "allowed" part."""
    return (f"{count(dp, 'GPU list')} (one per DP replica) of {count(size, 'GPU id')} each "
            "(tp x pp), no GPU in two places")


@dataclass(frozen=True)
class StagePlan:
    """π_M: a model-stage's candidate and the ordered GPU ids of each DP replica.

    Inside a replica, the GPU at index ``pp_rank * tp + tp_rank`` holds that (tp, pp) position,
    so a TP group is a run of consecutive ids. Its latency prices each collective on the
    link these ids give it (``stage_estimate``).
    """

    stage: str
    candidate: Candidate
    replicas: tuple[tuple[int, ...], ...]
    latency_s: float = 0.0
    peak_mem_bytes: int = 0

    def __post_init__(self) -> None:
        c = self.candidate
        problem = replica_problem(self.replicas, c.dp, c.layout.size)
        if problem:
            raise InputError(f"plan.{self.stage}.gpus", problem,
                             replica_rule(c.dp, c.layout.size))

    @property
    def layout(self) -> Layout:
        return self.candidate.layout

    @property
    def tp(self) -> int:
        return self.candidate.tp

    @property
    def pp(self) -> int:
        return self.candidate.pp

    @property
    def dp(self) -> int:
        return self.candidate.dp

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for r in self.replicas for g in r)

    def position(self, replica: int, gpu_index: int) -> tuple[int, int]:
        """(tp_rank, pp_rank) of the GPU at ``gpu_index`` of a replica."""
        return gpu_index % self.tp, gpu_index // self.tp

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {"name": self.stage, "tp": c.tp, "pp": c.pp, "dp": c.dp,
                "gpus": [list(r) for r in self.replicas], "latency_s": self.latency_s,
                "peak_mem_bytes": int(self.peak_mem_bytes), "micro_batch": c.micro_batch,
                "grad_accum": c.grad_accum, "recompute": c.recompute}


@dataclass(frozen=True)
class Plan:
    """S = {π_M}: the placed candidate of every model-stage and the predicted step latency.

    ``groups`` lists the model-stages that share one GPU set inside their phase and so run one
    after another; stages of one phase in different groups run concurrently on disjoint GPUs.
    A stage in no group runs alone.

    ``notes``: one line per way the plan's GPU ids make its price differ from pricing by sizes
    (``evaluate_plan``); not in the JSON form, which ``nereus plan --evaluate --json`` extends
    with them. ``proven``: False where the search stopped before it proved this plan the
    fastest of its space (``search.MAX_REPRICED``: pools of partly filled nodes).
    """

    stages: tuple[StagePlan, ...]
    step_latency_s: float = 0.0
    source: str = "estimated"
    terms: Mapping[str, float] = field(default_factory=dict)  # step latency by phase / sync
    groups: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)
    proven: bool = field(default=True, compare=False)

    def __post_init__(self) -> None:
        names = [s.stage for s in self.stages]
        if len(set(names)) != len(names):
            raise InputError("plan.stages", "a model-stage appears twice")

    def stage(self, name: str) -> StagePlan:
        for s in self.stages:
            if s.stage == name:
                return s
        raise InputError("plan", f"no model-stage {name!r}", [s.stage for s in self.stages])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.stage for s in self.stages)

    def all_groups(self) -> list[tuple[str, ...]]:
        """``groups``, then each model-stage in none as a group of its own: what the overlap
        graph (``nereus.plan.overlap``) is built from."""
        return [*self.groups, *[(s.stage,) for s in self.stages
                                if not any(s.stage in g for g in self.groups)]]

    def gpus(self) -> tuple[int, ...]:
        return tuple(sorted({g for s in self.stages for g in s.gpus}))

    def to_dict(self) -> dict[str, Any]:
        return {"step_latency_s": self.step_latency_s, "source": self.source,
                "terms": dict(self.terms), "groups": [list(g) for g in self.groups],
                "stages": [s.to_dict() for s in self.stages]}

    def group_of(self, stage: str) -> tuple[str, ...]:
        for g in self.groups:
            if stage in g:
                return g
        return (stage,)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any, field: str = "plan") -> Plan:
        """A plan in the JSON shape of ``nereus plan --json`` (strictly checked: a wrong field
        or type is an :class:`InputError` naming it, under ``field``)."""
        f = validate(_PlanFile, data, field, prefix=f"{field}.")
        names = [s.name for s in f.stages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InputError(f"{field}.stages", f"model-stages listed twice: {twice}",
                             "each model-stage once")
        for g in f.groups:
            unknown = sorted(set(g) - set(names))
            # a model-stage of some workflow that groups names but stages lacks: its entry
            # under stages is what is missing (deleted, or the plan file cut short)
            missing = [n for n in unknown if n in MODEL_STAGES]
            if missing:
                raise InputError(f"{field}.stages", f"lacks model-stage {missing[0]!r}, which "
                                 "groups lists", "an entry under stages for every model-stage "
                                 f"groups lists, or groups without {missing[0]}")
            if unknown:
                raise InputError(f"{field}.groups",
                                 f"names model-stages not in the plan: {unknown}", names)
        return cls(tuple(s.to_stage_plan() for s in f.stages), f.step_latency_s, f.source,
                   dict(f.terms), tuple(tuple(g) for g in f.groups))

    @classmethod
    def load(cls, path: str | Path, field: str = "plan") -> Plan:
        return cls.from_dict(read_json(path, field), field)


# every model-stage name a workflow has: a name in groups that is one of them is a model-stage
MODEL_STAGES = frozenset(s.name for w in WORKFLOWS.values() for s in w().stages)
MAX_GPU_ID = MAX_DEVICES - 1  # the largest cluster's last id: past it, a typo


class _StageFile(BaseModel):
    """One model-stage of a plan file."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    tp: int = Field(ge=1)
    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    gpus: list[list[Annotated[int, Field(ge=0, le=MAX_GPU_ID)]]] = Field(min_length=1)
    micro_batch: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    recompute: bool = False
    latency_s: float = Field(0.0, ge=0)
    peak_mem_bytes: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _replicas(self) -> _StageFile:
        problem = replica_problem(self.gpus, self.dp, self.tp * self.pp)
        if problem:
            # the one-line error reads the allowed part from the message: a validator's
            # error carries nothing else through pydantic
            raise ValueError(f"{self.name}: {problem} (allowed: "
                             f"{replica_rule(self.dp, self.tp * self.pp)})")
        return self

    def to_stage_plan(self) -> StagePlan:
        cand = Candidate(Layout(self.tp, self.pp), self.dp, self.micro_batch, self.grad_accum,
                         self.recompute)
        return StagePlan(self.name, cand, tuple(tuple(r) for r in self.gpus), self.latency_s,
                         self.peak_mem_bytes)


class _PlanFile(BaseModel):
    """A plan file: what ``nereus plan --json`` writes, or ``nereus plan --evaluate --json``
    (the plan plus its verdict, which is read past: a plan is priced where it is used)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    stages: list[_StageFile] = Field(min_length=1)
    step_latency_s: float = Field(0.0, ge=0)
    source: Literal["estimated", "measured", "simulated"] = "estimated"
    terms: dict[str, float] = Field(default_factory=dict)
    groups: list[list[str]] = Field(default_factory=list)
    fits: bool | None = None
    problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    best_step_latency_s: float | None = None


PLAN_FILE_KEYS: tuple[str, ...] = tuple(_PlanFile.model_fields)


def idle_bytes(cost: CostModel, plan: Plan, stage: str) -> int:
    """Bytes the other model-stages of ``stage``'s group keep resident on its GPUs while it
    runs (the co-resident state its estimate needs)."""
    return int(sum(cost.resident_bytes(o, plan.stage(o).layout)
                   for o in plan.group_of(stage) if o != stage))


def stage_links(cost: CostModel, sp: StagePlan) -> Links | None:
    """Where ``sp``'s GPU ids put each kind of its groups (``CostModel.placed_links``); None
    for a stage without GPU ids (the cost model then decides from sizes)."""
    return cost.placed_links(sp.layout, sp.replicas) if sp.replicas else None


def stage_estimate(cost: CostModel, plan: Plan, stage: str) -> Estimate:
    """``stage``'s estimate in ``plan``: beside its group's idle state, each collective on the
    link its GPU ids give it. Every plan is priced so, the planner's own included: its
    placements keep TP groups and pipelines inside nodes, where sizes would put them too, but
    not always DP groups (the Llama-3.1-8B PPO example's spread plan trains two replicas of 4
    GPUs on two nodes, whose gradient all-reduce runs on the network)."""
    sp = plan.stage(stage)
    return cost.estimate(stage, sp.candidate, idle_bytes(cost, plan, stage),
                         stage_links(cost, sp))


def weight_sync_estimate(cost: CostModel, train: StagePlan, gen: StagePlan,
                         by_sizes: bool = False) -> Estimate:
    """The weight sync from ``train`` to ``gen`` as placed: their GPU ids say which generation
    GPUs hold a training shard, which positions of the two each holds, and whether their
    replicas sit inside nodes (``CostModel.placed_sync_intra``); the candidates' counts and
    sizes decide where the stages have no GPU ids. ``by_sizes``: whether replicas sit inside
    nodes from their sizes, as if placed node-aligned (what a note compares with)."""
    from nereus.cost.model import placed_overlap

    receivers = cost.placed_sync_receivers(train.replicas, gen.replicas)
    overlap = None if receivers is None else placed_overlap(train.layout, train.replicas,
                                                           gen.layout, gen.replicas)
    intra = (cost.placed_sync_intra(train.replicas, gen.replicas)
             if train.replicas and gen.replicas and not by_sizes else None)
    return cost.weight_sync(train.candidate, gen.candidate, receivers, overlap, intra)


def contiguous_replicas(start: int, ids: Iterable[int],
                        cand: Candidate) -> tuple[tuple[int, ...], ...]:
    """Replicas of ``cand`` laid over ``ids[start:]`` in order, TP innermost."""
    pool = list(ids)[start:start + cand.gpus]
    size = cand.layout.size
    return tuple(tuple(pool[r * size:(r + 1) * size]) for r in range(cand.dp))
