"""A whole job (model, cluster, pool, workflow, workload) and its YAML config.

The YAML is validated by pydantic models that forbid unknown fields; every validation error is
turned into an :class:`~nereus.errors.InputError` that names the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nereus.errors import InputError
from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.device import GiB, get_device
from nereus.spec.model import ModelSpec, get_model
from nereus.spec.workflow import Workflow, get_workflow
from nereus.spec.workload import Optimizer, Workload


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
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterConfig(_Strict):
    device: str = "h100-sxm-80gb"
    nodes: int | None = Field(None, ge=1, description="nodes; default: enough for `gpus`")
    devices_per_node: int | None = Field(None, ge=1)
    device_memory_gib: float | None = Field(None, gt=0, description="override device memory")


class WorkloadConfig(_Strict):
    prompts_per_step: int = Field(512, ge=1)
    responses_per_prompt: int = Field(1, ge=1)
    prompt_len: int = Field(512, ge=1)
    response_len: int = Field(2048, ge=1, description="mean response length in tokens")
    response_len_max: int | None = Field(None, ge=1)
    ppo_mini_batches: int = Field(4, ge=1)
    ppo_epochs: int = Field(1, ge=1)
    param_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    grad_dtype: Literal["bf16", "fp16", "fp32"] = "fp32"
    master_weights: bool = True
    optimizer: Literal["adam", "sgd"] = "adam"


class JobConfig(_Strict):
    model: str = Field(description="preset name or path to a Hugging Face config.json")
    algo: Literal["ppo", "grpo", "remax"] = "ppo"
    execution: Literal["sync", "async"] = "sync"
    gpus: int | list[int] = Field(description="pool size, or the device ids of the pool")
    cluster: ClusterConfig = ClusterConfig()
    workload: WorkloadConfig = WorkloadConfig()

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1")
        if isinstance(v, list) and (not v or min(v) < 0):
            raise ValueError("must be a non-empty list of device ids >= 0")
        return v


def _first_error(e: ValidationError) -> InputError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "config"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = err["loc"][:-1]
        model: type[BaseModel] = JobConfig
        for part in parent:
            fld = model.model_fields.get(str(part))
            ann = fld.annotation if fld else None
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
        return InputError(loc, "unknown field", list(model.model_fields))
    if kind == "missing":
        return InputError(loc, "required field is missing")
    if kind == "literal_error":
        return InputError(loc, f"{err.get('input')!r} is not allowed",
                          str(err.get("ctx", {}).get("expected", "")))
    return InputError(loc, str(err["msg"]).removeprefix("Value error, "))


def build_job(cfg: JobConfig) -> JobSpec:
    device = get_device(cfg.cluster.device)
    if cfg.cluster.device_memory_gib:
        device = device.with_memory(int(cfg.cluster.device_memory_gib * GiB))
    ids = list(range(cfg.gpus)) if isinstance(cfg.gpus, int) else sorted(set(cfg.gpus))
    need = max(ids) + 1
    per_node = cfg.cluster.devices_per_node or min(device.devices_per_node, need)
    nodes = cfg.cluster.nodes or -(-need // per_node)
    cluster = Cluster(device, nodes, per_node)
    if need > cluster.num_devices:
        raise InputError("gpus", f"device ids up to {need - 1} do not fit the cluster",
                         f"0..{cluster.num_devices - 1}")
    w = cfg.workload
    workload = Workload(
        prompts_per_step=w.prompts_per_step, responses_per_prompt=w.responses_per_prompt,
        prompt_len=w.prompt_len, response_len_mean=w.response_len,
        response_len_max=w.response_len_max or w.response_len,
        ppo_mini_batches=w.ppo_mini_batches, ppo_epochs=w.ppo_epochs,
        param_dtype=w.param_dtype, grad_dtype=w.grad_dtype, master_weights=w.master_weights,
        optimizer=Optimizer(w.optimizer))
    return JobSpec(get_model(cfg.model), cluster, GpuPool(cluster, tuple(ids)),
                   get_workflow(cfg.algo, cfg.execution), workload)


def parse_job(data: object) -> JobSpec:
    if not isinstance(data, dict):
        raise InputError("config", "must be a YAML mapping of fields",
                         list(JobConfig.model_fields))
    try:
        cfg = JobConfig.model_validate(data)
    except ValidationError as e:
        raise _first_error(e) from None
    return build_job(cfg)


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job YAML file."""
    p = Path(path)
    if not p.is_file():
        raise InputError("config", f"no file at {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise InputError("config", f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_job(data)
