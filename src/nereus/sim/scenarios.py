"""Scenarios: a job, its traces, the hidden truth, and where every parameter comes from.

Built-in scenarios (``SCENARIOS``) and user scenarios from a YAML file (``load_scenario``).
Every parameter of a built-in scenario has an entry in its ``notes``: a source, or the word
"assumption" with the reasoning behind the value.

YAML (paths relative to the file)::

    name: my-run
    job: {model: llama-3.1-8b, algo: ppo, gpus: 16, cluster: {devices_per_node: 8},
          workload: {prompts_per_step: 512, prompt_len: 512}}
    steps: 1000
    seed: 0
    lengths: {csv: lengths.csv}        # or {growth: {start: 500, end: 8000}} / {stationary: {}}
    availability: {csv: pool.csv}      # the job holds the GPUs of it in job.gpus; or
                                       # {spot: {start_tick: 3372, file: my.json}} /
                                       # {constant: true} /
                                       # {churn: {}} (gpus: 2 or more whole nodes)
    drift: {csv: drift.csv}            # or {congestion: {periods: 3}}; optional
    hidden_efficiency: {gemm: 0.55}    # optional; the rest from the built-in truth
    noise: 0.01
    restart: {startup_s: 180, storage_read_gb_per_s_per_node: 2, checkpoint_interval_steps: 10}
    control: {gamma: 0.5, delta_len: 0.3}
    notes: {availability: "our cluster's scheduler log, May 2025"}
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import Empty
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nereus.control.controller import ControlConfig
from nereus.control.restart import RESTART_SOURCES, RestartParams
from nereus.cost.efficiency import Efficiencies, peak_bound
from nereus.cost.ops import OpClass
from nereus.errors import InputError, count
from nereus.files import read_yaml, validate
from nereus.sim.plancache import EFF_GRID, LENGTH_BUCKET
from nereus.sim.policies import POLICIES, make_policies
from nereus.sim.simulator import OOM_LOST_FRACTION, SimResult, Simulator
from nereus.sim.traces import (
    MAX_CHURN_CHANGES,
    MAX_TOKENS,
    MIN_CHURN_HOURS,
    MIN_DRIFT_FACTOR,
    Availability,
    DriftTrace,
    LengthTrace,
    busiest_window,
    congestion,
    constant,
    format_runs,
    growth,
    load_drift,
    load_lengths,
    node_churn,
    read_availability,
    read_spot_trace,
    spot_counts,
    spot_window,
    stationary,
)
from nereus.sim.truth import MAX_NOISE, Truth
from nereus.spec.cluster import format_gpus
from nereus.spec.job import JobSpec, check_context, check_groups, parse_job
from nereus.spec.workload import MAX_TOKENS as WORKLOAD_MAX_TOKENS
from nereus.spec.workload import Optimizer

GB = 1e9

# The simulated cluster's true efficiencies: what the calibrator has to find. Assumptions, set
# inside the ranges public measurements report and away from the defaults (which start low on
# purpose): dense GEMMs 50-60 % of peak (Megatron-LM reports ~50 % MFU at scale), NVLink
# collectives 70-80 % of link peak and the network 40-50 % (nccl-tests bus bandwidth), decode
# 70 % of HBM bandwidth; communicator set-up twice the transition layer's 0.1 s estimate; a
# Merge's on-device copy 85 % of HBM bandwidth (STREAM-style copies: ≈ 80-90 %, see
# nereus.cost.efficiency).
HIDDEN_EFFICIENCY: Mapping[OpClass, float] = {
    OpClass.GEMM: 0.55, OpClass.ATTENTION: 0.40, OpClass.DECODE: 0.70,
    OpClass.OPTIMIZER: 0.65, OpClass.HOST: 0.75,
    OpClass.ALLREDUCE_INTRA: 0.75, OpClass.ALLREDUCE_INTER: 0.40,
    OpClass.ALLGATHER_INTRA: 0.75, OpClass.ALLGATHER_INTER: 0.45,
    OpClass.P2P_INTRA: 0.70, OpClass.P2P_INTER: 0.45,
    OpClass.BROADCAST_INTRA: 0.70, OpClass.BROADCAST_INTER: 0.45,
    OpClass.SETUP: 0.50, OpClass.COPY: 0.85,
}

# The paper's default workload (lead's examples/llama-3.1-8b-ppo.yaml): Llama-3.1-8B, PPO,
# 16 H100s in 2 nodes of 8, 512 prompts of 512 tokens per step, 4 PPO mini-batches.
DEFAULT_JOB: Mapping[str, Any] = {
    "model": "llama-3.1-8b", "algo": "ppo", "execution": "sync", "gpus": 16,
    "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8},
    "workload": {"prompts_per_step": 512, "responses_per_prompt": 1, "prompt_len": 512,
                 "response_len": 500, "ppo_mini_batches": 4, "ppo_epochs": 1},
}

SPOT_WINDOW_TICKS = 360      # 30 hours of 5-minute ticks: about the default run's length
SPOT_MIN_RUNNING = 0.80      # the window holds GPUs at least 80 % of the time
MAX_STEPS = 100_000          # a YAML scenario's steps: 100x the paper's runs, hours of CPU


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    job: JobSpec
    steps: int
    lengths: LengthTrace
    availability: Availability
    drift: DriftTrace
    hidden: Efficiencies
    noise: float
    restart: RestartParams
    control: ControlConfig
    seed: int
    notes: Mapping[str, str]
    # the lengths the availability trace is mapped onto steps with (the nominal clock, see
    # nereus.sim.simulator): the whole run's when ``with_overrides`` cut it to its first steps,
    # so that a shorter run meets every change of the pool at the step the whole run does;
    # None: ``lengths``
    clock: LengthTrace | None = None
    # the trace files a scenario YAML read, by the field that named them (a command must not
    # write its output over one)
    inputs: Mapping[str, Path] = field(default_factory=dict)


def _common_notes(job: JobSpec) -> dict[str, str]:
    notes = {
        "job": "paper §3.2: Llama-3.1-8B PPO on 16 GPUs; assumption: H100 SXM 80GB in 2 "
               "nodes of 8 (NVLink inside, 400 Gb/s per GPU between), synchronous, and the "
               "batch of examples/llama-3.1-8b-ppo.yaml (512 prompts of 512 tokens, one "
               "response each, 4 mini-batches, one PPO epoch)",
        "hidden_efficiency": "assumption: " + ", ".join(f"{c.value} {v:g}" for c, v in
                                                         HIDDEN_EFFICIENCY.items())
                             + " -- inside public ranges (Megatron-LM MFU ~50 %, nccl-tests "
                               "bus bandwidth) and away from the calibrator's defaults",
        "noise": "assumption: log-normal σ = 1 % per stage and step; the paper reports max-min "
                 "step-latency spreads below 2 % over 50 steps (§7 metrics)",
        "memory": "assumption: the cost model's peak memory is exact; a stage whose peak "
                  "exceeds the device's memory crashes the step",
        "oom_lost_fraction": f"assumption: an out-of-memory crash loses "
                             f"{OOM_LOST_FRACTION:.0%} of a step on average",
        "control.gamma": "paper §4.3: γ = 0.5 by default",
        "control.delta_len": "paper §4.1: δ_len = 30 % in all experiments",
        "control.delta_eff": "assumption: an op class's calibrated efficiency moving 20 % "
                             "from its reference is drift (the paper gives no value)",
        "control.eff_min_share": "assumption: only op classes >= 5 % of the plan's time are "
                                 "watched",
        "control.warmup_steps": "assumption: efficiency signals arm after 10 steps of "
                                "calibration (the paper calibrates from the first step)",
        "control.horizon_alpha": "assumption: EMA weight 0.5 for the newest interval (the "
                                 "paper gives no value)",
        "control.length_window": "assumption: memory is planned for the longest response of "
                                 "the last 20 steps (the envelope of step-to-step noise)",
        "control.length_margin": "assumption: plus 5 % for growth between replans",
        "control.eff_z": "assumption: an efficiency signal counts only while a move of "
                         "delta_eff is at least 3 standard errors of the class's estimate",
        "control.max_tries": "assumption: at most 12 transition schedules priced per replan "
                             "(the paper gives no value)",
        "control.admission": "paper §4.3 and §7.3.3: Nereus admits a move by Eq. 2; "
                             "replan_always is the controller with it off",
        "plan_cache": f"simulation shortcut: best plans cached per pool, {LENGTH_BUCKET - 1:.0%} "
                      f"response-length bucket (solved at its upper edge) and "
                      f"{EFF_GRID - 1:.0%} efficiency grid; re-priced exactly at the actual "
                      f"lengths and efficiencies before any decision",
        "static": "per GPU budget, the fastest plan over the trace among those that fit its "
                  "longest responses, chosen with the true efficiencies (as a parameter sweep "
                  "at start-up would measure them, §7 baselines); it restarts from the last "
                  "checkpoint when it loses a GPU and uses returned GPUs at its next restart",
        "static_verl": "static within verl's plan space, as its PPO examples configure it "
                       "(an assumption: the hybrid engine's one resource pool for every "
                       "model-stage, the rollout's TP without pipeline, Megatron TP/PP per "
                       "worker group, the critic's values on its training layout; "
                       "nereus.plan.frameworks); where no such plan fits a pool for the whole "
                       "trace, static's plan (generous: a verl job would wait)",
        "transitions": "schedule makespan from nereus.transition under the hidden "
                       "efficiencies, times the same noise",
        "replay": "after a failure the steps since the last checkpoint are done again, each "
                  "at its own lengths, on the plan and GPUs the job restarts on (after a loss, "
                  "fewer than ran them)",
        "availability_replay": "progress-aligned: trace time maps to steps on a nominal clock "
                               "(the best full-pool plan under the true efficiencies) that stops "
                               "while the pool is empty, so every policy meets each change at "
                               "the same step; a pool no plan fits at the run's longest "
                               "responses counts as empty, for every policy alike, also where "
                               "a plan fits it at the step's own (shorter) responses",
        "control.spread_on_churn": "extension beyond §4.3: after two pool losses, S* is the plan "
                                   "with replicas of every model-stage on two nodes when its "
                                   "step time beats the fastest plan's plus the expected "
                                   "restart cost of a last copy lost with a node (share of "
                                   "such nodes x restart / H of losses)",
        "control.onward": "extension beyond §4.3: an urgent move that stops short of S* is "
                          "replanned at the next boundary under Eq. 2",
        "control.restart_moves": "extension beyond §4.3: when no transition to the best target "
                                 "can run (the transition layer's memory check), a planned "
                                 "checkpoint/restart into it is priced as one more move under "
                                 "Eq. 2 (opportunistic) or over the horizon (urgent)",
    }
    for k, v in RESTART_SOURCES.items():
        notes[f"restart.{k}"] = v
    notes["restart.checkpoint_bytes"] = checkpoint_note(job)
    notes["restart.checkpoint_writes"] = ("assumption: every policy (the oracle too) writes "
                                          "a checkpoint every checkpoint_interval_steps steps "
                                          "and waits for it: the bytes a planned restart "
                                          "writes over storage_write_bw_per_node x the pool's "
                                          "nodes (nereus.control.restart.checkpoint_write_s); "
                                          "simulated")
    return notes


def checkpoint_note(job: JobSpec) -> str:
    """Where ``restart.checkpoint_bytes`` comes from, for ``job``'s own workflow: what
    nereus.control.restart counts (θ and ω of each trained model, θ of each frozen one)."""
    def names(ms: Sequence[str]) -> str:
        return "the " + (ms[0] if len(ms) == 1 else ", ".join(ms[:-1]) + " and " + ms[-1])

    w = job.workload
    # ω as the workload counts it (optimizer_state_bytes_per_param): a master copy only
    # when θ is kept below fp32, moments only for Adam
    omega = [part for part, on in (("fp32 master", w.master_weights and w.param_bytes < 4),
                                   ("Adam moments", w.optimizer is Optimizer.ADAM)) if on]
    trained = [m.name for m in job.workflow.models if m.trainable]
    frozen = [m.name for m in job.workflow.models if not m.trainable]
    read = f"θ and ω ({' + '.join(omega) or 'none'}) of {names(trained)}"
    if frozen:
        read += f", θ of {names(frozen)}"
    saved = names([m + "'s" for m in trained])
    return (f"computed: {read}, read at a restart; a planned restart first writes {saved} "
            "alone (frozen weights never change)")


def default_job() -> JobSpec:
    return parse_job(dict(DEFAULT_JOB))


def _growth_note(steps: int) -> str:
    return (f"paper §3.2 / Fig. 4(a): Llama-3.1-8B responses grow from 500 to 8,000 tokens "
            f"within 1,000 steps; linear shape, 5 % log-normal step noise and longest = "
            f"1.5x mean (plus noise) are assumptions; {count(steps, 'step')}")


def pool_start(av: Availability, changes: int = 3) -> str:
    """How the pool of ``av`` starts, in words: its size at time 0 and after its first
    ``changes`` changes ("3 GPUs for the first 5 minutes, then 8 from minute 5, ...")."""
    def minute(t: float) -> str:
        return f"{t / 60:.0f}" if t >= 60 else f"{t / 60:.1f}"

    n0 = len(av.pools[0])
    if len(av.times) == 1:
        return f"{count(n0, 'GPU')} throughout"
    first = minute(av.times[1])
    text = f"{count(n0, 'GPU')} for the first {first} minute{'' if first == '1' else 's'}"
    later = [f"{len(p)} from minute {minute(t)}"
             for t, p in zip(av.times[1:changes + 1], av.pools[1:changes + 1])]
    return f"{text}, then {', '.join(later)}"


def scenario_default(seed: int = 0, steps: int = 1000) -> Scenario:
    """The paper's workload on the real AWS spot trace, responses growing 500 -> 8,000."""
    job = default_job()
    counts, _ = spot_counts()
    start = busiest_window(counts, SPOT_WINDOW_TICKS, SPOT_MIN_RUNNING)
    avail = spot_window(start, max_gpus=16)
    most = max(len(p) for p in avail.pools)
    begins = pool_start(avail)
    notes = _common_notes(job)
    notes.update({
        "job": f"paper §3.2: Llama-3.1-8B PPO on 16 GPUs; assumption: a cluster of 16 H100 "
               f"SXM 80GB in 2 nodes of 8 (NVLink inside, 400 Gb/s per GPU between), "
               f"synchronous, and the batch of examples/llama-3.1-8b-ppo.yaml (512 prompts of "
               f"512 tokens, one response each, 4 mini-batches, one PPO epoch); the job's pool "
               f"is not a fixed 16 GPUs: it follows the availability trace, up to {most} GPUs "
               f"({begins}; a pool no plan fits at the run's longest responses is waited "
               f"out)",
        "lengths": _growth_note(steps),
        "availability": (f"real AWS spot trace (16 x p3.2xlarge, us-west-2a, 2023-08-27; "
                         f"Wu et al., NSDI 2024, the study the paper cites) from tick {start}: "
                         f"the {SPOT_WINDOW_TICKS}-tick (30 h, about the run's length) window with "
                         f"the most changes "
                         f"among those holding GPUs >= {SPOT_MIN_RUNNING:.0%} of the time; "
                         f"n instances -> GPU ids 0..n-1 of the 2 x 8 H100 nodes (assumption: "
                         f"the count is what matters; the last acquired go first); 0 = paused; "
                         f"changes meet every policy at the same step (progress-aligned "
                         f"replay on the nominal clock, see nereus.sim.simulator)"),
        "drift": "none",
    })
    return Scenario("default", f"Llama-3.1-8B PPO on up to {most} H100s (2 nodes of 8) as the "
                    f"real AWS spot trace gives them: {begins}, then outages and returns "
                    f"(a pool no plan fits at the run's longest responses is waited out); "
                    f"responses 500->8,000 tokens over {count(steps, 'step', fmt=',')}", job,
                    steps,
                    growth(steps, 500, 8000, 0.05, 1.5, seed), avail,
                    DriftTrace(), Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name),
                    0.01, RestartParams(), ControlConfig(), seed, notes)


def scenario_stationary(seed: int = 0, steps: int = 300) -> Scenario:
    """Only noise: constant length, pool and efficiencies. Nereus should never move."""
    job = default_job()
    notes = _common_notes(job)
    notes.update({"lengths": "assumption: 2,000 tokens with 5 % log-normal noise, longest = "
                             f"1.5x mean; {count(steps, 'step')}",
                  "availability": "constant: 16 GPUs", "drift": "none"})
    return Scenario("stationary", "the default job with nothing but noise", job, steps,
                    stationary(steps, 2000, 0.05, 1.5, seed), constant(range(16)), DriftTrace(),
                    Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name), 0.01,
                    RestartParams(), ControlConfig(), seed, notes)


def scenario_churn(seed: int = 0, steps: int = 1000) -> Scenario:
    """Responses grow while whole nodes leave and come back (a generated spot trace)."""
    job = default_job()
    notes = _common_notes(job)
    notes.update({
        "lengths": _growth_note(steps),
        "availability": "generated (seeded): whole 8-GPU nodes of the job's 2 leave and come "
                        "back, 12 changes in every 10 hours (paper §3.2 after Wu et al.: more "
                        "than ten changes for a 16-GPU job over ten hours), never fewer than "
                        "one node",
        "drift": "none",
    })
    return Scenario("churn", "the default job on a generated trace of whole-node churn", job,
                    steps, growth(steps, 500, 8000, 0.05, 1.5, seed),
                    node_churn(2, 8, 10.0, 12, 1, seed), DriftTrace(),
                    Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name), 0.01,
                    RestartParams(), ControlConfig(), seed, notes)


# NVLink collectives a degraded or contended link slows (the drift scenario)
NVLINK_CLASSES = ("allreduce.intra", "allgather.intra", "broadcast.intra", "p2p.intra")


def scenario_drift(seed: int = 0, steps: int = 1000) -> Scenario:
    """Responses grow on a fixed pool with periods in which the NVLink collectives slow down."""
    job = default_job()
    notes = _common_notes(job)
    notes.update({
        "lengths": _growth_note(steps),
        "availability": "constant: 16 GPUs",
        "drift": "assumption: 3 periods of 40-120 steps in which the collectives inside a node "
                 "(all-reduce, all-gather, broadcast, p2p over NVLink) achieve 30 % of their "
                 "usual efficiency: a degraded NVLink/NVSwitch port or a co-scheduled job "
                 "contending for the links (§3.2: achieved efficiency drifts). Not inter-node "
                 "congestion: on 2 nodes of 8 no plan of this job puts its heavy traffic across "
                 "nodes, and slowing those classes changed no step time",
    })
    return Scenario("drift", "the default job on a fixed pool with periods of slow NVLink", job,
                    steps, growth(steps, 500, 8000, 0.05, 1.5, seed), constant(range(16)),
                    congestion(steps, 3, (40, 120), NVLINK_CLASSES, 0.3, seed),
                    Efficiencies(dict(HIDDEN_EFFICIENCY), job.cluster.device.name), 0.01,
                    RestartParams(), ControlConfig(), seed, notes)


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "default": scenario_default, "stationary": scenario_stationary,
    "churn": scenario_churn, "drift": scenario_drift,
}


def builtin(name: str, seed: int = 0, steps: int | None = None) -> Scenario:
    if name not in SCENARIOS:
        raise InputError("--scenario", f"unknown scenario {name!r}", SCENARIOS)
    return SCENARIOS[name](seed=seed) if steps is None else SCENARIOS[name](seed=seed,
                                                                            steps=steps)


# ------------------------------------------------------------------ YAML scenarios
class _Strict(BaseModel):
    # strict, as the job's models: a count is an integer (not true, 2.9 or "8"), a number is
    # not a string, a switch is true or false; an integer still counts where a float is expected
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


MAX_LENGTH_RATIO = 100.0     # longest / mean response length a generated trace may ask for
MAX_LENGTH_MARGIN = 1.0      # control.length_margin: plan memory for up to 2x the longest
MAX_CHURN_HOURS = 100_000.0  # a churn block past ~11 years never changes within a run


# a response length is at least one token (as a lengths CSV's response_len_mean)
class _Growth(_Strict):
    start: float = Field(500.0, ge=1, le=MAX_TOKENS, allow_inf_nan=False)
    end: float = Field(8000.0, ge=1, le=MAX_TOKENS, allow_inf_nan=False)
    noise: float = Field(0.05, ge=0, le=MAX_NOISE, allow_inf_nan=False)
    max_ratio: float = Field(1.5, ge=1, le=MAX_LENGTH_RATIO, allow_inf_nan=False)


class _Stationary(_Strict):
    length: float = Field(2000.0, ge=1, le=MAX_TOKENS, allow_inf_nan=False)
    noise: float = Field(0.05, ge=0, le=MAX_NOISE, allow_inf_nan=False)
    max_ratio: float = Field(1.5, ge=1, le=MAX_LENGTH_RATIO, allow_inf_nan=False)


class _Lengths(_Strict):
    csv: str | None = None
    growth: _Growth | None = None
    stationary: _Stationary | None = None


class _Spot(_Strict):
    # without it, the busiest SPOT_WINDOW_TICKS window that holds GPUs SPOT_MIN_RUNNING of
    # the time; a trace shorter than the window replays whole, from tick 0 (busiest_window)
    start_tick: int | None = Field(None, ge=0)
    # a trace of your own in the shipped one's format (skypilot-org/spot-traces' files),
    # relative to the scenario file; without it, the real AWS trace that ships
    file: str | None = None


class _Churn(_Strict):
    hours: float = Field(10.0, ge=MIN_CHURN_HOURS, le=MAX_CHURN_HOURS, allow_inf_nan=False)
    changes: int = Field(12, ge=1, le=MAX_CHURN_CHANGES)
    min_nodes: int = Field(1, ge=1)


class _Availability(_Strict):
    csv: str | None = None
    spot: _Spot | None = None
    churn: _Churn | None = None
    constant: bool | None = None


_Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]


class _Congestion(_Strict):
    periods: int = Field(3, ge=0, le=MAX_STEPS)
    # YAML gives lists: a tuple field takes one (its items stay strict)
    length: tuple[_Steps, _Steps] = Field((40, 120), strict=False)
    op_classes: tuple[Annotated[str, Field(strict=True)], ...] = Field(
        ("allreduce.inter", "p2p.inter"), strict=False)
    factor: float = Field(0.4, ge=MIN_DRIFT_FACTOR, allow_inf_nan=False)

    @field_validator("length")
    @classmethod
    def _shortest_first(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] > v[1]:
            raise ValueError(f"shortest {v[0]} > longest {v[1]} (allowed: [shortest, "
                             f"longest] steps, shortest <= longest)")
        return v


class _Drift(_Strict):
    csv: str | None = None
    congestion: _Congestion | None = None


# Bounds that keep simulated times finite (assumptions: no real job restarts for more than a
# day, or reads its checkpoint at under 1 MB/s per node, or runs an op class at under 0.1 % of
# its peak); past them a run's sums overflowed to inf and its JSON to "Infinity"
MAX_STARTUP_S = 86_400.0
MIN_STORAGE_GB_PER_S = 1e-3
MIN_HIDDEN_EFFICIENCY = 1e-3


class _Restart(_Strict):
    startup_s: float = Field(RestartParams.startup_s, ge=0, le=MAX_STARTUP_S,
                             allow_inf_nan=False)
    storage_read_gb_per_s_per_node: float = Field(RestartParams.storage_read_bw_per_node / GB,
                                                  ge=MIN_STORAGE_GB_PER_S, allow_inf_nan=False)
    storage_write_gb_per_s_per_node: float = Field(
        RestartParams.storage_write_bw_per_node / GB, ge=MIN_STORAGE_GB_PER_S,
        allow_inf_nan=False)
    checkpoint_interval_steps: int = Field(RestartParams.checkpoint_interval_steps, ge=1)


# YAML field of ``restart`` -> the RestartParams field its note is kept under
_RESTART_NOTES = {"startup_s": "startup_s",
                  "storage_read_gb_per_s_per_node": "storage_read_bw_per_node",
                  "storage_write_gb_per_s_per_node": "storage_write_bw_per_node",
                  "checkpoint_interval_steps": "checkpoint_interval_steps"}


class _Control(_Strict):
    gamma: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)
    delta_len: float = Field(0.30, gt=0, allow_inf_nan=False)
    delta_eff: float = Field(0.20, gt=0, allow_inf_nan=False)
    # planned memory for the longest response plus this share: up to twice the longest
    length_margin: float = Field(0.05, allow_inf_nan=False)
    length_window: int = Field(20, ge=1)
    warmup_steps: int = Field(10, ge=0)
    horizon_alpha: float = Field(0.5, gt=0, le=1, allow_inf_nan=False)

    @field_validator("length_margin")
    @classmethod
    def _margin_in_range(cls, v: float) -> float:
        if not 0 <= v <= MAX_LENGTH_MARGIN:
            raise ValueError(f"{v:g} is outside 0..{MAX_LENGTH_MARGIN:g} (allowed: a share of "
                             f"the longest response from 0 to {MAX_LENGTH_MARGIN:g})")
        return v


class _ScenarioFile(_Strict):
    name: str = "custom"
    description: str = ""
    job: dict[str, Any] = Field(description="a job as nereus plan --config reads it (model, "
                                            "algo, gpus, cluster, workload)")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    seed: int = Field(0, ge=0)
    lengths: _Lengths = _Lengths(growth=_Growth())
    availability: _Availability = _Availability(constant=True)
    drift: _Drift | None = None
    hidden_efficiency: dict[str, Annotated[float, Field(ge=MIN_HIDDEN_EFFICIENCY,
                                                        allow_inf_nan=False)]] = {}
    noise: float = Field(0.01, ge=0, le=MAX_NOISE, allow_inf_nan=False)
    restart: _Restart = _Restart()
    control: _Control = _Control()
    notes: dict[str, str] = {}


def _one(section: str, model: BaseModel) -> str:
    set_ = [k for k, v in model if v not in (None, False)]
    if len(set_) != 1:
        raise InputError(section, f"set exactly one of {', '.join(type(model).model_fields)}",
                         list(type(model).model_fields))
    return set_[0]


def _onto(av: Availability, ids: Sequence[int]) -> Availability:
    """``av``'s i-th GPU (0..len(ids)-1; whole-node churn's in node order) as the job's i-th:
    a generated trace holds the GPUs the job asked for, not the cluster's first ones."""
    ids = tuple(sorted(ids))
    if ids == tuple(range(len(ids))):
        return av
    return Availability(av.times, tuple(tuple(ids[g] for g in p) for p in av.pools),
                        f"{av.source}; onto the job's GPUs {format_gpus(ids)}")


def _within(path: Path, ids: Sequence[int]) -> Availability:
    """The availability file at ``path`` held to the job's GPUs ``ids``: at each time, the
    GPUs it lists that are the job's. The job asked for those (``job.gpus``), so the others
    are not its to use; a trace that never lists one of them gives the job nothing to run on.
    Rows are cut to ``ids`` as they are read, so a file naming a million ids costs what the
    job's GPUs do."""
    av, listed = read_availability(path, ids)
    if not listed:  # else the simulator finds it, with no file to name
        raise InputError(f"availability ({path})", "the trace never gives a GPU",
                         "at least one row with GPUs")
    if not any(av.pools):
        raise InputError("job.gpus", f"the job's GPUs {format_gpus(ids)} are in no row of "
                         f"the availability trace ({av.source})",
                         f"GPUs the trace lists, e.g. {format_runs(listed, most=8)}")
    if sum(hi - lo + 1 for lo, hi in listed) == len(av.ids()):  # all the job's: as read
        return av
    return Availability(av.times, av.pools, f"{av.source}; the job's GPUs of it "
                        f"({format_gpus(ids)}, job.gpus)")


def _fits_context(job: JobSpec, longest: int, fld: str, how: str = "",
                  allowed: str = "") -> None:
    """A prompt plus ``longest`` must fit the model's context window: the rule ``nereus plan``
    applies to a job's workload (``check_context``), for a trace's longest response. The error
    names ``fld`` (the scenario's field or the CSV row that set the length), ``how`` it came
    about before the sum, and ``allowed`` after what check_context allows."""
    # past the workload's bound is past every context window: the sum still says so
    w = job.workload.with_response_len(1, min(longest, WORKLOAD_MAX_TOKENS))
    try:
        check_context(job.model, w, fld)
    except InputError as e:
        problem = e.problem if longest <= WORKLOAD_MAX_TOKENS else e.problem.replace(
            str(w.response_len_max), str(longest)).replace(str(w.seq_len_max),
                                                           str(w.prompt_len + longest))
        raise InputError(fld, f"{how}: {problem}" if how else problem,
                         f"{e.allowed}{allowed}") from None


def _tokens(v: float) -> str:
    """A length or a time as the file likely wrote it: 1000000, not 1e+06; past
    ``_DIGITS_AT_MOST`` digits as ``:g`` (a time of 1e308 s is 1e+308, not 309 digits)."""
    return str(int(v)) if abs(v) < 10 ** _DIGITS_AT_MOST and v == int(v) else f"{v:g}"


_DIGITS_AT_MOST = 15  # a float holds every whole number below this many digits exactly


def _trace_fits_context(job: JobSpec, lengths: LengthTrace, fld: str, what: str,
                        max_ratio: float) -> None:
    """A generated trace's longest response fits the context window (``_fits_context``)."""
    top = max(lengths.longest)
    k = lengths.longest.index(top)
    room = (job.model.max_position_embeddings or 0) - job.workload.prompt_len
    _fits_context(job, top, fld, f"{what} reach a longest response of {top} tokens at step {k} "
                  f"(longest/mean up to max_ratio {max_ratio:g}, plus noise)",
                  f"; so {fld.rsplit('.', 1)[1]} x max_ratio {max_ratio:g}, plus the noise, "
                  f"must stay under {room}")


SCENARIO_FILES = "a scenario YAML (nereus examples writes two, under scenarios/)"


def load_scenario(path: str | Path) -> Scenario:
    """A scenario from YAML; every value not in the file comes from the defaults above."""
    p = Path(path)
    raw = read_yaml(p, "--config", allowed=SCENARIO_FILES)
    cfg = validate(_ScenarioFile, raw, "--config")
    try:
        job = parse_job(cfg.job)
        check_groups(job)  # the check nereus plan makes of a job a user wrote: GRPO's groups
    except InputError as e:     # the job is the file's ``job:`` section: name the field so
        where = "job" if e.field == "config" else f"job.{e.field}"
        raise InputError(where, e.problem, e.allowed) from None
    base = p.parent
    seed = cfg.seed
    inputs: dict[str, Path] = {}

    def read(name: str, file: str) -> Path:
        inputs[name] = base / file
        return inputs[name]

    kind = _one("lengths", cfg.lengths)
    if kind == "csv":
        lengths = load_lengths(read("lengths.csv", str(cfg.lengths.csv)),
                               fits=lambda longest, fld: _fits_context(job, longest, fld))
    elif kind == "growth":
        g = cfg.lengths.growth
        assert g is not None
        lengths = growth(cfg.steps or 1000, g.start, g.end, g.noise, g.max_ratio, seed)
        _trace_fits_context(job, lengths, "lengths.growth.end" if g.end >= g.start else
                            "lengths.growth.start", f"responses growing from {_tokens(g.start)} "
                            f"to {_tokens(g.end)} tokens", g.max_ratio)
    else:
        s = cfg.lengths.stationary
        assert s is not None
        lengths = stationary(cfg.steps or 1000, s.length, s.noise, s.max_ratio, seed)
        _trace_fits_context(job, lengths, "lengths.stationary.length",
                            f"responses of {_tokens(s.length)} tokens", s.max_ratio)
    if cfg.steps and cfg.steps > len(lengths):
        raise InputError("steps", f"{cfg.steps} is more than the "
                         f"{count(len(lengths), 'step')} of the lengths trace",
                         f"1..{len(lengths)}, or leave it out")
    steps = min(cfg.steps or len(lengths), len(lengths))
    if steps > MAX_STEPS:
        raise InputError("steps", f"the lengths trace has {steps} steps, more than "
                         f"{MAX_STEPS}; set steps: to simulate its first ones", f"1..{MAX_STEPS}")
    lengths = lengths.head(steps)

    kind = _one("availability", cfg.availability)
    if kind == "csv":
        # the file is the cluster's pool over time, read as it is written (ids past the job's
        # cluster too: a scheduler log of a larger cluster); the job holds the GPUs of it
        # that it asked for (job.gpus), as with a spot trace
        avail = _within(read("availability.csv", str(cfg.availability.csv)), job.pool.ids)
    elif kind == "spot":
        sp = cfg.availability.spot
        spot_file = read("availability.spot.file", sp.file) if sp and sp.file is not None \
            else None
        trace = read_spot_trace(spot_file) if spot_file is not None else spot_counts()
        counts = trace[0]
        start = sp.start_tick if sp and sp.start_tick is not None else busiest_window(
            counts, SPOT_WINDOW_TICKS, SPOT_MIN_RUNNING)
        # the job holds at most the GPUs it asked for, whatever else the cluster has
        avail = _onto(spot_window(start, max_gpus=job.pool.size, path=spot_file, trace=trace),
                      job.pool.ids)
    elif kind == "churn":
        c = cfg.availability.churn
        assert c is not None
        per, nodes = job.cluster.devices_per_node, job.pool.by_node()
        # nodes leave and come back whole, and only the job's own do: a part of a node (or
        # one node) has no whole-node churn to follow
        if len(nodes) < 2 or any(len(g) != per for g in nodes.values()):
            raise InputError("job.gpus", f"whole-node churn needs whole nodes of "
                             f"{count(per, 'GPU')}, at least 2; the job has "
                             f"{count(job.pool.size, 'GPU')} on {count(len(nodes), 'node')}",
                             f"a multiple of {per} from {2 * per}, or ids of whole nodes")
        avail = _onto(node_churn(len(nodes), per, c.hours, c.changes, c.min_nodes, seed),
                      job.pool.ids)
    else:
        avail = constant(job.pool.ids)
    off = sorted(avail.ids() - set(range(job.cluster.num_devices)))
    if off:
        raise InputError("availability", f"device ids {off[:8]} are outside the cluster",
                         f"0..{job.cluster.num_devices - 1}")

    drift = DriftTrace()
    if cfg.drift is not None:
        kind = _one("drift", cfg.drift)
        if kind == "csv":
            drift = load_drift(read("drift.csv", str(cfg.drift.csv)), steps).head(steps)
        else:
            c2 = cfg.drift.congestion
            assert c2 is not None
            drift = congestion(steps, c2.periods, c2.length, c2.op_classes, c2.factor, seed)

    hidden = dict(HIDDEN_EFFICIENCY)
    device = job.cluster.device.name
    for k, v in cfg.hidden_efficiency.items():
        try:
            cls = OpClass(k)
        except ValueError:
            raise InputError(f"hidden_efficiency.{k}", "unknown op class",
                             [c.value for c in OpClass]) from None
        if v > peak_bound(cls, device):
            raise InputError(f"hidden_efficiency.{k}", f"{v:g} is above the {device}'s "
                             f"peak", "(0, 1]")
        hidden[cls] = v
    truth_eff = Efficiencies(hidden, device)
    drift.check(truth_eff)
    r = cfg.restart
    restart = RestartParams(r.startup_s, r.storage_read_gb_per_s_per_node * GB,
                            r.storage_write_gb_per_s_per_node * GB, r.checkpoint_interval_steps)
    c3 = cfg.control
    control = ControlConfig(gamma=c3.gamma, delta_len=c3.delta_len, delta_eff=c3.delta_eff,
                            length_margin=c3.length_margin, length_window=c3.length_window,
                            warmup_steps=c3.warmup_steps,
                            horizon_alpha=c3.horizon_alpha, restart=restart)
    notes = _common_notes(job)
    notes.update({"job": f"from {p.name}", "lengths": lengths.source,
                  "availability": avail.source, "drift": drift.source})
    here = f"from {p.name}"
    if cfg.hidden_efficiency:
        notes["hidden_efficiency"] = (f"{here}: " + ", ".join(
            f"{k} {v:g}" for k, v in cfg.hidden_efficiency.items())
            + f"; other classes {notes['hidden_efficiency']}")
    if "noise" in cfg.model_fields_set:
        notes["noise"] = here
    for f in cfg.restart.model_fields_set:
        notes[f"restart.{_RESTART_NOTES[f]}"] = here
    for f in cfg.control.model_fields_set:
        notes[f"control.{f}"] = here
    notes.update(cfg.notes)
    return Scenario(cfg.name, cfg.description or f"from {p.name}", job, steps, lengths, avail,
                    drift, truth_eff, cfg.noise, restart,
                    control, seed, notes, inputs=inputs)


def with_overrides(sc: Scenario, *, steps: int | None = None, gamma: float | None = None
                   ) -> Scenario:
    """``sc`` cut to its first ``steps`` steps (traces included: a policy that reads the whole
    trace must not see lengths the run never meets) and with Nereus's γ set. The availability
    is still mapped onto steps by the whole run's lengths (``Scenario.clock``): the cut run meets
    each change of the pool at the step the whole run meets it, so it runs the whole run's
    first steps (the static policy excepted: it plans for the lengths of the run it is told
    of)."""
    out = sc
    notes = dict(sc.notes)
    if steps is not None:
        if steps < 1:
            raise InputError("--steps", f"must be >= 1, got {steps}", "an integer >= 1")
        n = min(steps, len(sc.lengths))
        lengths, drift = sc.lengths.head(n), sc.drift.head(n)
        if lengths is not sc.lengths:
            notes["lengths"] = (f"{notes.get('lengths', lengths.source)}; its first "
                                f"{count(n, 'step')} (--steps on the command line)")
        if drift is not sc.drift:
            notes["drift"] = (f"{notes.get('drift', drift.source)}; periods cut to the first "
                              f"{count(n, 'step')} (--steps on the command line)")
        clock = sc.clock if sc.clock is not None else sc.lengths
        if lengths is not sc.lengths and "availability_replay" in notes:
            first = ("this step is its first" if n == 1
                     else f"these {n} steps are its first {n}")
            notes["availability_replay"] = (f"{notes['availability_replay']}; with --steps the "
                                            f"nominal clock is still the whole run's "
                                            f"({count(len(clock), 'step')}), so {first}")
        out = replace(out, steps=n, lengths=lengths, drift=drift, clock=clock)
    if gamma is not None:
        if not 0.0 <= gamma <= 1.0:
            raise InputError("--gamma", f"must be in [0, 1], got {gamma}", "a number in [0, 1]")
        out = replace(out, control=replace(out.control, gamma=gamma))
        notes["control.gamma"] = f"--gamma on the command line ({gamma:g})"
    return replace(out, notes=notes)




# CPU seconds of a policy alone (measured on the default scenario on a 2-core machine:
# replanning at every step costs the most); used to split policies over worker processes.
_COST = {"replan_always": 32.0, "nereus": 15.0, "oracle": 11.0, "static": 6.0,
         "static_verl": 8.0}


def _groups(names: Sequence[str], workers: int) -> list[list[str]]:
    groups: list[list[str]] = [[] for _ in range(max(1, min(workers, len(names))))]
    load = [0.0] * len(groups)
    for n in sorted(names, key=lambda n: -_COST.get(n, 1.0)):
        i = load.index(min(load))
        groups[i].append(n)
        load[i] += _COST.get(n, 1.0)
    return [g for g in groups if g]


def _worker(sim: Simulator, sc: Scenario, names: list[str], index: int, queue: Any,
            logging_on: bool) -> None:
    """One process's share of the policies; reports progress, results and log lines."""
    try:
        lines: list[tuple[str, str]] = []
        on_log = (lambda p, line: lines.append((p, line))) if logging_on else None
        pols = make_policies(names, sim.truth, sc.lengths, sc.control, on_log)

        def progress(k: int) -> None:
            if k % 10 == 0 or k == sim.steps:
                queue.put(("progress", index, k, None))

        res = sim.run(pols, sc.name, progress, sc.notes)
        queue.put(("done", index, dict(res.results), lines))
    except BaseException as e:  # noqa: BLE001 - the parent re-raises it
        queue.put(("error", index, e if isinstance(e, InputError) else
                   RuntimeError(f"in a simulation worker:\n{traceback.format_exc()}"), None))


def _child(parent: int, *args: Any) -> None:
    """A worker process: ``_worker(*args)``, ending with its ``parent`` (pid) however that
    ends. The parent stops its workers on an error, Ctrl-C or SIGTERM (``sigterm_raises``);
    one killed outright (SIGKILL, the OOM killer) cannot, and its workers simulated on,
    then blocked on a queue no one reads, holding the parent's stdout open."""
    # the parent's SIGTERM handler, copied by fork, would raise into the simulation: the
    # parent's terminate() must end the worker (SIGTERM is blocked until then)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if sys.platform.startswith("linux"):
        # the kernel kills the worker when the parent's thread that forked it ends
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it ended before that: nothing will kill the worker
            os._exit(1)
    else:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(WORKER_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, daemon=True).start()
    _worker(*args)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


# How often the parent checks that its worker processes are alive while it waits for them
# (seconds): a worker that dies without a word (killed, os._exit) is found within this long.
WORKER_POLL_S = 1.0


def simulator(sc: Scenario) -> Simulator:
    """The simulator of ``sc``: its truth, traces, nominal clock and the pool's alignment to
    it. Building it finds what makes the scenario unrunnable (a trace that never gives a
    usable pool), so callers build it before they print anything."""
    truth = Truth(sc.job, sc.hidden, sc.drift, sc.noise, sc.seed)
    sim = Simulator(truth, sc.lengths, sc.availability, sc.restart, sc.steps, clock=sc.clock)
    _pool_file_changes_in_the_run(sc, sim)
    return sim


def _pool_file_changes_in_the_run(sc: Scenario, sim: Simulator) -> None:
    """An availability file whose every change of the job's pool comes after the run ends
    (on the nominal clock) changes nothing, and the user believes it does: an error. Rows past
    the end beside ones inside it are a log longer than the run (kept); a run --steps cut
    short of the scenario's is cut on purpose (its notes say so)."""
    path = sc.inputs.get("availability.csv")
    if path is None or (sc.clock is not None and len(sc.clock) > sc.steps):
        return
    first = sc.availability.next_change(0.0)
    end = sum(sim.nominal) + sum(e.pause_s + sum(c[1] for c in e.changes) for e in sim.events)
    if first is not None and first >= end:
        raise InputError("availability.csv", f"the first change of the job's pool in "
                         f"{path}, at {_tokens(first)} s, comes after the run ends: its "
                         f"{count(sc.steps, 'step')} take about {end:.0f} s on the nominal "
                         f"clock (README: trace time is replayed on it), so the pool never "
                         f"changes", f"a change before {end:.0f} s, or a longer run")


def _collect(procs: Sequence[Any], groups: Sequence[Sequence[str]], queue: Any,
             on_message: Callable[[str, int, Any, Any], None], poll_s: float) -> None:
    """Hand every worker's messages to ``on_message`` until each has sent "done".

    Waits ``poll_s`` at a time; between waits a worker whose process has ended without its
    "done" (its last messages drained first) is a RuntimeError naming it and its exit code.
    """
    pending = set(range(len(procs)))

    def take(timeout: float) -> bool:
        try:
            kind, i, payload, lines = queue.get(timeout=timeout)
        except Empty:
            return False
        if kind == "done":
            pending.discard(i)
        on_message(kind, i, payload, lines)
        return True

    while pending:
        if take(poll_s):
            continue
        dead = [i for i in sorted(pending) if procs[i].exitcode is not None]
        if not dead:
            continue
        while pending and take(0.1):    # what a worker sent just before it ended
            pass
        dead = [i for i in dead if i in pending]
        if dead:
            i = dead[0]
            code = procs[i].exitcode
            how = f"was killed by signal {-code}" if code < 0 else f"ended with exit code {code}"
            raise RuntimeError(f"simulation worker {i} ({', '.join(groups[i])}) {how} before "
                               f"reporting its results")


def run_scenario(sc: Scenario, policies: Sequence[str] = POLICIES,
                 progress: Callable[[int], None] | None = None,
                 on_log: Callable[[str, str], None] | None = None,
                 workers: int | None = None, sim: Simulator | None = None) -> SimResult:
    """Simulate ``policies`` on ``sc`` (the public entry point of ``nereus simulate``).

    Policies are independent (each has its own plan cache), so they run in up to ``workers``
    processes (default: the CPU count, at most 2) where the platform can fork; the results
    are the same as in one process. ``sim``: ``simulator(sc)``, when the caller built it.
    """
    names = list(dict.fromkeys(policies))
    if sim is None:
        sim = simulator(sc)
    if workers is None:
        workers = min(2, os.cpu_count() or 1)
    groups = _groups(names, workers)
    if len(groups) == 1 or "fork" not in mp.get_all_start_methods():
        pols = make_policies(names, sim.truth, sc.lengths, sc.control, on_log)
        return sim.run(pols, sc.name, progress, sc.notes)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(os.getpid(), sim, sc, g, i, queue,
                                              on_log is not None), daemon=True)
             for i, g in enumerate(groups)]
    done: dict[int, tuple[dict[str, Any], list[tuple[str, str]]]] = {}
    seen = [0] * len(groups)

    def on_message(kind: str, i: int, payload: Any, lines: Any) -> None:
        if kind == "error":
            raise payload
        if kind == "done":
            done[i] = (payload, lines or [])
        seen[i] = payload if kind == "progress" else sim.steps
        if progress is not None:
            progress(min(seen))

    finished = False
    try:
        # SIGTERM held while forking: a worker unblocks it once it has put back the default
        # action (``_child``), and a SIGTERM to the parent meanwhile stops the ones started
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            for p in procs:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        _collect(procs, groups, queue, on_message, WORKER_POLL_S)
        finished = True
    finally:
        for p in procs:
            if finished:
                p.join(timeout=5)
            if p.is_alive():        # a failed run stops the other workers at once
                p.terminate()
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
    results: dict[str, Any] = {}
    for i in range(len(groups)):
        results.update(done[i][0])
        if on_log is not None:
            for policy, line in done[i][1]:
                on_log(policy, line)
    return SimResult(sc.name, {n: results[n] for n in names}, dict(sc.notes))
