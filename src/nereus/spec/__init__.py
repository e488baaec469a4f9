"""What the job is: model, devices and cluster, GPU pool, RL workflow, workload."""

from nereus.spec.cluster import Cluster, GpuPool
from nereus.spec.device import DEVICE_PRESETS, GB, DeviceSpec, GiB, get_device, gib
from nereus.spec.job import JobConfig, JobSpec, build_job, load_job, parse_job
from nereus.spec.model import MODEL_PRESETS, Head, ModelSpec, get_model
from nereus.spec.workflow import (
    Execution,
    ModelRole,
    ModelStage,
    Phase,
    StageKind,
    Workflow,
    get_workflow,
    grpo,
    ppo,
    remax,
)
from nereus.spec.workload import Optimizer, Workload

__all__ = [
    "DEVICE_PRESETS", "GB", "GiB", "MODEL_PRESETS", "Cluster", "DeviceSpec", "Execution",
    "GpuPool", "Head", "JobConfig", "JobSpec", "ModelRole", "ModelSpec", "ModelStage",
    "Optimizer", "Phase", "StageKind", "Workflow", "Workload", "build_job", "get_device",
    "get_model", "get_workflow", "gib", "grpo", "load_job", "parse_job", "ppo", "remax",
]
