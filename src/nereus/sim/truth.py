"""The simulator's ground truth: the cost model under hidden efficiencies, with noise.

What a step "really" takes is the cost model's estimate under efficiencies the policies do not
know (they differ from the defaults, and drift periods scale some op classes), times a
log-normal noise factor per stage and step. The same (step, stage) draws the same noise for
every policy, so two policies running one plan see one time. Transitions take what the
transition schedule says under the same hidden efficiencies, times noise.

Cost models are shared per (efficiencies, lengths, pool shape: the pool's GPUs per node), and
each memoizes its estimates:
the four policies of a run price the same few stage candidates at the same lengths.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from nereus.control.targets import reprice
from nereus.cost.efficiency import Efficiencies
from nereus.cost.model import CostModel
from nereus.errors import InputError
from nereus.plan.overlap import step_latency
from nereus.plan.types import Plan
from nereus.sim.traces import DriftTrace
from nereus.spec.cluster import GpuPool
from nereus.spec.job import JobSpec
from nereus.transition.planner import plan_transition
from nereus.transition.schedule import Schedule

EffKey = tuple[tuple[str, float], ...]

# Largest σ of the log-normal step noise: e^±1 per stage is far past any spread a cluster
# shows (the paper reports below 2 %), and larger σ overflows the factor.
MAX_NOISE = 1.0


def eff_key(eff: Efficiencies) -> EffKey:
    return tuple(sorted((c.value, round(v, 6)) for c, v in eff.values.items()))


@dataclass(frozen=True)
class Priced:
    """A plan's noise-free step latency, stage latencies and peak memory (simulated)."""

    step_s: float
    stage_s: Mapping[str, float]
    peak_bytes: Mapping[str, int]
    sync_s: float
    sync_peak_bytes: int = 0  # the fullest GPU while the weights sync (colocated execution)


def pool_shape(job: JobSpec, pool: tuple[int, ...]) -> tuple[int, ...]:
    """What a cost model reads of its pool: its GPUs per node, fullest first. They give the
    node size a TP group may use, whether the whole pool sits in one node (asynchronous weight
    sync crosses the network otherwise) and how many of a synchronous sync's generation GPUs
    share a node with training GPUs (``CostModel.sync_receivers``: (8, 4, 4) and (8, 8) differ
    there, though both have nodes of 8 and span nodes)."""
    gp = GpuPool(job.cluster, pool)
    return tuple(sorted((len(v) for v in gp.by_node().values()), reverse=True))


class Truth:
    """Prices plans and transitions as the simulated cluster runs them."""

    def __init__(self, job: JobSpec, hidden: Efficiencies, drift: DriftTrace, noise: float,
                 seed: int = 0):
        if not 0 <= noise <= MAX_NOISE:
            raise InputError("noise", f"must be in [0, {MAX_NOISE:g}], got {noise}")
        if seed < 0:
            raise InputError("seed", f"must be >= 0, got {seed}")
        self.job = job
        self.hidden = hidden
        self.drift = drift
        self.noise = noise
        self.seed = seed
        self._models: dict[tuple[object, ...], CostModel] = {}
        self._transitions: dict[tuple[object, ...], Schedule] = {}
        self._eff_cache: dict[int, Efficiencies] = {}

    # ---- efficiencies and jobs ----
    def efficiencies(self, step: int) -> Efficiencies:
        hit = self._eff_cache.get(step)
        if hit is None:
            hit = self.drift.apply(self.hidden, step)
            if len(self._eff_cache) > 4096:
                self._eff_cache.clear()
            self._eff_cache[step] = hit
        return hit

    def job_at(self, pool: tuple[int, ...], mean: float, longest: int) -> JobSpec:
        w = self.job.workload.with_response_len(int(round(mean)), int(longest))
        return self.job.with_pool(GpuPool(self.job.cluster, pool)).with_workload(w)

    def _model(self, eff: Efficiencies, mean: float, longest: int, pool: tuple[int, ...]
               ) -> CostModel:
        key = (eff_key(eff), int(round(mean)), int(longest), pool_shape(self.job, pool))
        m = self._models.get(key)
        if m is None:
            if len(self._models) > 256:
                self._models.clear()
            m = CostModel(self.job_at(pool, mean, longest), eff)
            self._models[key] = m
        return m

    # ---- pricing ----
    def price(self, plan: Plan, pool: tuple[int, ...], step: int, mean: float, longest: int
              ) -> Priced:
        """Noise-free time and memory of ``plan`` on ``pool`` at one step's lengths."""
        eff = self.efficiencies(step)
        cost = self._model(eff, mean, longest, pool)
        p = reprice(cost.job, cost, plan).plan
        assert p is not None
        pair = cost.job.workflow.colocated_sync()
        held = 0 if pair is None else cost.weight_sync_peak_bytes(p.stage(pair[0]).layout,
                                                                  p.stage(pair[1]).layout)
        return Priced(p.step_latency_s, {s.stage: s.latency_s for s in p.stages},
                      {s.stage: s.peak_mem_bytes for s in p.stages},
                      float(p.terms.get("weight_sync", 0.0)), held)

    def fits(self, priced: Priced) -> bool:
        """Whether every GPU holds its peak, the weight sync's included: the simulated device
        has all of its memory."""
        cap = self.job.cluster.device.memory_bytes
        return priced.sync_peak_bytes <= cap and all(b <= cap for b in priced.peak_bytes.values())

    # ---- noise ----
    def factor(self, step: int, what: str) -> float:
        """exp(N(0, noise)) drawn from (seed, step, what): the same for every policy."""
        if self.noise <= 0:
            return 1.0
        h = hashlib.blake2b(f"{self.seed}/{step}/{what}".encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(h, "little"))
        return float(math.exp(rng.normal(0.0, self.noise)))

    def run_step(self, plan: Plan, pool: tuple[int, ...], step: int, mean: float, longest: int
                 ) -> tuple[float, dict[str, float], Priced]:
        """Measured (noisy) step time and stage times of one step."""
        p = self.price(plan, pool, step, mean, longest)
        stage = {s: v * self.factor(step, s) for s, v in p.stage_s.items()}
        sync = self.job.workflow.weight_sync()
        groups = plan.all_groups()
        sync_s = p.sync_s * self.factor(step, "weight_sync") if sync else 0.0
        step_s = step_latency(self.job.workflow, groups, stage, sync_s)
        return step_s, stage, p

    def transition(self, source: Plan, target: Plan, pool: tuple[int, ...], step: int
                   ) -> Schedule:
        """The schedule as it runs under the hidden efficiencies (its makespan is L_tran)."""
        eff = self.efficiencies(step)
        key = (_layout_key(source), _layout_key(target), pool, eff_key(eff))
        hit = self._transitions.get(key)
        if hit is None:
            job = self.job.with_pool(GpuPool(self.job.cluster, pool))
            hit = plan_transition(job, source, target, eff)
            if len(self._transitions) > 512:
                self._transitions.clear()
            self._transitions[key] = hit
        return hit


def _layout_key(plan: Plan) -> tuple[object, ...]:
    return tuple((s.stage, s.candidate, s.replicas) for s in plan.stages)


def same_layouts(a: Plan, b: Plan) -> bool:
    """Plans that place the same candidates on the same GPUs (a move between them is free)."""
    return all(x.candidate == y.candidate and x.replicas == y.replicas
               for x, y in zip(a.stages, b.stages)) and a.names == b.names

