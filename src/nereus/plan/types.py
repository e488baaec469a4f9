"""A plan: one placed candidate per model-stage, and its JSON form (``nereus plan --json``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereus.cost.candidate import Candidate, Layout
from nereus.errors import InputError
from nereus.files import read_json


@dataclass(frozen=True)
class StagePlan:
    """π_M: a model-stage's candidate and the ordered GPU ids of each DP replica.

    Inside a replica, the GPU at index ``pp_rank * tp + tp_rank`` holds that (tp, pp) position,
    so a TP group is a run of consecutive ids.
    """

    stage: str
    candidate: Candidate
    replicas: tuple[tuple[int, ...], ...]
    latency_s: float = 0.0
    peak_mem_bytes: int = 0

    def __post_init__(self) -> None:
        c = self.candidate
        if len(self.replicas) != c.dp:
            raise InputError(f"plan.{self.stage}.gpus",
                             f"{len(self.replicas)} replicas listed for dp={c.dp}")
        for r in self.replicas:
            if len(r) != c.layout.size:
                raise InputError(f"plan.{self.stage}.gpus",
                                 f"a replica lists {len(r)} GPUs for tp x pp = {c.layout.size}")
        flat = self.gpus
        if len(set(flat)) != len(flat):
            raise InputError(f"plan.{self.stage}.gpus", "a GPU appears twice")

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
    """

    stages: tuple[StagePlan, ...]
    step_latency_s: float = 0.0
    source: str = "estimated"
    terms: Mapping[str, float] = field(default_factory=dict)  # step latency by phase / sync
    groups: tuple[tuple[str, ...], ...] = ()

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
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if not isinstance(data, Mapping) or "stages" not in data:
            raise InputError("plan", "needs a 'stages' list", "the JSON of `nereus plan --json`")
        groups = tuple(tuple(str(x) for x in g) for g in data.get("groups", ()))
        return cls(tuple(stage_plan_from_dict(s) for s in data["stages"]),
                   float(data.get("step_latency_s", 0.0)), str(data.get("source", "estimated")),
                   dict(data.get("terms", {})), groups)

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_json(path, "plan"))


def stage_plan_from_dict(s: Mapping[str, Any]) -> StagePlan:
    name = str(s.get("name", "?"))
    try:
        tp, pp, dp = int(s["tp"]), int(s["pp"]), int(s["dp"])
    except (KeyError, TypeError, ValueError):
        raise InputError(f"plan.{name}", "needs integer tp, pp and dp") from None
    gpus = s.get("gpus")
    if gpus is None:
        raise InputError(f"plan.{name}.gpus", "missing", "a list of GPU-id lists, one per replica")
    replicas = tuple(tuple(int(g) for g in r) for r in gpus)
    mb = int(s.get("micro_batch", 1))
    ga = int(s.get("grad_accum", 1))
    cand = Candidate(Layout(tp, pp), dp, mb, ga, bool(s.get("recompute", False)))
    return StagePlan(name, cand, replicas, float(s.get("latency_s", 0.0)),
                     int(s.get("peak_mem_bytes", 0)))


def contiguous_replicas(start: int, ids: Iterable[int], cand: Candidate) -> tuple[tuple[int, ...], ...]:
    """Replicas of ``cand`` laid over ``ids[start:]`` in order, TP innermost."""
    pool = list(ids)[start:start + cand.gpus]
    size = cand.layout.size
    return tuple(tuple(pool[r * size:(r + 1) * size]) for r in range(cand.dp))
