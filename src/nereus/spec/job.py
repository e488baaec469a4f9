"""A whole job (model, cluster, pool, workflow, workload) and its YAML config.

The YAML is validated by pydantic models that forbid unknown fields; every validation error is
turned into an :class:`~nereus.errors.InputError` that names the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from nereus.errors import InputError, count
from nereus.files import read_yaml, validate
from nereus.spec.cluster import MAX_DEVICES, MAX_DEVICES_PER_NODE, Cluster, GpuPool
from nereus.spec.device import DEVICE_PRESETS, GiB, get_device
from nereus.spec.model import MODEL_PRESETS, ModelSpec, get_model
from nereus.spec.workflow import Workflow, get_workflow
from nereus.spec.workload import INT_BOUNDS, Optimizer, Workload, shown


@dataclass(frozen=True)
class JobSpec:
    """Everything the planner needs to know about a job."""

    model: ModelSpec
    cluster: Cluster
    pool: GpuPool
    workflow: Workflow
    workload: Workload

    def with_pool(self, pool: GpuPool) -> JobSpec:
        return replace(self, pool=pool)

    def with_workload(self, workload: Workload) -> JobSpec:
        return replace(self, workload=workload)


# ---------------------------------------------------------------- YAML schema
class _Strict(BaseModel):
    # strict: a count is an integer (not true, 2.9 or "8"), a switch is true or false
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _count_text(most: int) -> str:
    return f"an integer 1..{most:,}"


class ClusterConfig(_Strict):
    # descriptions are what a wrong type's error lists as allowed (nereus.files)
    device: str = Field("h100-sxm-80gb",
                        description=f"a device preset: {', '.join(DEVICE_PRESETS)}")
    nodes: int | None = Field(None, description=f"{_count_text(MAX_DEVICES)} (nodes; default: "
                              "enough for gpus)")
    devices_per_node: int | None = Field(None, description=_count_text(MAX_DEVICES_PER_NODE))
    device_memory_gib: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                            description="a number of GiB > 0 and <= 1e6 "
                                            "(overrides the device's memory)")

    @field_validator("nodes", "devices_per_node")
    @classmethod
    def _count(cls, v: int | None, info: ValidationInfo) -> int | None:
        top = MAX_DEVICES if info.field_name == "nodes" else MAX_DEVICES_PER_NODE
        if v is not None and not 1 <= v <= top:
            raise ValueError(f"{shown(v)} is not allowed (allowed: 1..{top:,})")
        return v


class WorkloadConfig(_Strict):
    prompts_per_step: int = Field(512, description=_count_text(INT_BOUNDS["prompts_per_step"]))
    responses_per_prompt: int = Field(
        1, description=_count_text(INT_BOUNDS["responses_per_prompt"]) + " (>= 2 for grpo)")
    prompt_len: int = Field(512, description=_count_text(INT_BOUNDS["prompt_len"]) + " tokens")
    response_len: int = Field(2048, description=_count_text(INT_BOUNDS["response_len_mean"])
                              + " tokens (the mean response length)")
    response_len_max: int | None = Field(None, description=_count_text(
        INT_BOUNDS["response_len_max"]) + " tokens, at least response_len")
    ppo_mini_batches: int = Field(4, description="a divisor of prompts_per_step x "
                                  "responses_per_prompt")
    ppo_epochs: int = Field(1, description=_count_text(INT_BOUNDS["ppo_epochs"]))
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    grad_dtype: Literal["bf16", "fp16", "fp32"] = "fp32"
    master_weights: bool = True
    optimizer: Literal["adam", "sgd"] = "adam"


# Workload field -> its name in the YAML, where they differ (the Workload checks the bounds)
_YAML_FIELD = {"workload.response_len_mean": "workload.response_len"}


class JobConfig(_Strict):
    model: str = Field(description=f"a model preset ({', '.join(MODEL_PRESETS)}), a path to "
                       "a Hugging Face config.json, or a Hugging Face id (ORG/NAME) whose "
                       "config.json is in the local cache")
    algo: Literal["ppo", "grpo", "remax"] = "ppo"
    execution: Literal["sync", "async"] = "sync"
    # what scores the responses: a reward model as large as the actor (reward_infer), or a
    # rule on the CPU (a verifier, exact match: verl's function reward), no model-stage
    reward: Literal["model", "rule"] = "model"
    gpus: StrictInt | list[StrictInt] = Field(
        description=f"a pool size 1..{MAX_DEVICES:,}, or a list of distinct device ids "
                    f"0..{MAX_DEVICES - 1:,}")
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadConfig = WorkloadConfig()

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and not 1 <= v <= MAX_DEVICES:
            raise ValueError(f"{shown(v)} is not allowed (allowed: a pool of 1..{MAX_DEVICES:,} "
                             f"devices)")
        if isinstance(v, list) and (not v or min(v) < 0 or max(v) >= MAX_DEVICES):
            raise ValueError(f"must be a non-empty list of device ids (allowed: "
                             f"0..{MAX_DEVICES - 1})")
        if isinstance(v, list) and len(set(v)) < len(v):
            # a repeated id is a typo for another device; planning on the set would run the
            # job on fewer GPUs than the list says
            twice = sorted({g for g in v if v.count(g) > 1})
            raise ValueError(f"device id{'s' if len(twice) > 1 else ''} "
                             f"{', '.join(map(str, twice))} listed more than once (allowed: "
                             f"distinct device ids 0..{MAX_DEVICES - 1})")
        return v


def build_job(cfg: JobConfig) -> JobSpec:
    try:
        device = get_device(cfg.cluster.device)
    except InputError as e:  # the YAML field is cluster.device
        raise InputError("cluster.device", e.problem, e.allowed) from None
    if cfg.cluster.device_memory_gib:
        device = device.with_memory(int(cfg.cluster.device_memory_gib * GiB))
    ids = list(range(cfg.gpus)) if isinstance(cfg.gpus, int) else sorted(set(cfg.gpus))
    need = max(ids) + 1
    per_node = cfg.cluster.devices_per_node or min(device.devices_per_node, need)
    nodes = cfg.cluster.nodes or -(-need // per_node)
    cluster = Cluster(device, nodes, per_node)
    if need > cluster.num_devices and isinstance(cfg.gpus, int):
        # a count: say it as one, not as the device ids it stands for
        raise InputError("gpus", f"{count(need, 'GPU')} exceed the cluster's "
                         f"{count(nodes, 'node')} x {per_node}",
                         f"1..{cluster.num_devices:,}, or more cluster.nodes")
    if need > cluster.num_devices:
        raise InputError("gpus", f"device ids up to {need - 1} do not fit the cluster",
                         f"0..{cluster.num_devices - 1}")
    w = cfg.workload
    try:  # the Workload bounds every count (1..a stated maximum)
        workload = Workload(
            prompts_per_step=w.prompts_per_step, responses_per_prompt=w.responses_per_prompt,
            prompt_len=w.prompt_len, response_len_mean=w.response_len,
            response_len_max=(w.response_len if w.response_len_max is None
                              else w.response_len_max),
            ppo_mini_batches=w.ppo_mini_batches, ppo_epochs=w.ppo_epochs,
            param_dtype=w.param_dtype, grad_dtype=w.grad_dtype,
            master_weights=w.master_weights, optimizer=Optimizer(w.optimizer))
    except InputError as e:
        raise InputError(_YAML_FIELD.get(e.field, e.field), e.problem, e.allowed) from None
    model = get_model(cfg.model)
    check_context(model, workload,
                  "workload.response_len_max" if w.response_len_max else "workload.response_len")
    return JobSpec(model, cluster, GpuPool(cluster, tuple(ids)),
                   get_workflow(cfg.algo, cfg.execution, cfg.reward), workload)


def check_context(model: ModelSpec, workload: Workload,
                  response_field: str = "workload.response_len_max") -> None:
    """A prompt plus the longest response must fit the model's context window (where the model
    has one): past it the model was never trained, and the plan would price a step it cannot
    run. The error names ``response_field`` (or ``workload.prompt_len`` if the prompt alone
    fills it)."""
    limit = model.max_position_embeddings
    if limit is None or workload.seq_len_max <= limit:
        return
    p, r = workload.prompt_len, workload.response_len_max
    if p >= limit:
        raise InputError("workload.prompt_len", f"{p} tokens leave no room for a response in "
                         f"{model.name}'s context window of {limit} tokens",
                         f"at most {limit - 1}")
    raise InputError(response_field, f"prompt {p} + longest response {r} = {p + r} tokens exceed "
                     f"{model.name}'s context window of {limit} tokens",
                     f"a longest response up to {limit - p} tokens with a {p}-token prompt")


# Algorithms whose advantage compares the responses to one prompt with each other: GRPO's
# group-relative advantage (Shao et al. 2024, DeepSeekMath §4.1) normalises each response's
# reward by its group's mean and standard deviation, which one response does not have.
MIN_GROUP = {"grpo": 2}


def check_groups(job: JobSpec) -> None:
    """A job whose algorithm needs several responses per prompt has them. Checked where a
    user's job is read (the commands); ``parse_job`` leaves it to them, so that code which
    builds a GRPO job only to size or place its stages can keep one response per prompt."""
    least = MIN_GROUP.get(job.workflow.algo)
    n = job.workload.responses_per_prompt
    if least is not None and n < least:
        raise InputError("workload.responses_per_prompt",
                         f"{n} response{'s' if n != 1 else ''} per prompt "
                         f"leave{'' if n != 1 else 's'} "
                         f"{job.workflow.algo} no group to compute its group-relative "
                         f"advantage over", f">= {least} for {job.workflow.algo}")


def parse_job(data: object) -> JobSpec:
    return build_job(validate(JobConfig, data, "config"))


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job YAML file."""
    return parse_job(read_yaml(path, "config"))


def job_config(job: JobSpec, model: str | None = None) -> dict[str, Any]:
    """``job`` as the job YAML writes it: ``parse_job`` of it gives ``job`` back. Every field
    is written out, defaults too, so that a default changed later does not change the job read
    back. ``model``: what finds the model again (a preset name, a config.json path or a
    Hugging Face id); by default its preset's name. A ModelSpec does not know where it was
    read from, so a model that is no preset needs it."""
    if model is None:
        if MODEL_PRESETS.get(job.model.name) != job.model:
            raise ValueError(f"{job.model.name} is no preset: say where its config.json is")
        model = job.model.name
    device = job.cluster.device
    cluster: dict[str, Any] = {"device": device.name, "nodes": job.cluster.num_nodes,
                               "devices_per_node": job.cluster.devices_per_node}
    if device.memory_bytes != get_device(device.name).memory_bytes:
        # bytes / 2**30 and back is exact for any memory below 2**53 bytes
        cluster["device_memory_gib"] = device.memory_bytes / GiB
    ids = job.pool.ids
    w = job.workload
    return {
        "model": model, "algo": job.workflow.algo, "execution": job.workflow.execution.value,
        "reward": job.workflow.reward,
        # a count where the pool is the first GPUs, as a job YAML usually says it
        "gpus": len(ids) if ids == tuple(range(len(ids))) else list(ids),
        "cluster": cluster,
        "workload": {"prompts_per_step": w.prompts_per_step,
                     "responses_per_prompt": w.responses_per_prompt,
                     "prompt_len": w.prompt_len, "response_len": w.response_len_mean,
                     "response_len_max": w.response_len_max,
                     "ppo_mini_batches": w.ppo_mini_batches, "ppo_epochs": w.ppo_epochs,
                     "param_dtype": w.param_dtype, "grad_dtype": w.grad_dtype,
                     "master_weights": w.master_weights, "optimizer": w.optimizer.value}}
