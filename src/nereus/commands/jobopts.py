"""A job from a YAML config and/or command-line options (shared by plan, transition, simulate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nereus.errors import InputError
from nereus.files import read_yaml
from nereus.spec.job import JobSpec, parse_job


def job_from_options(config: Path | None = None, *, model: str | None = None,
                     algo: str | None = None, execution: str | None = None,
                     gpus: int | None = None, device: str | None = None,
                     devices_per_node: int | None = None,
                     response_len: int | None = None, response_len_max: int | None = None,
                     prompt_len: int | None = None, prompts: int | None = None,
                     responses_per_prompt: int | None = None) -> JobSpec:
    """Options override the config's fields; without a config, ``model`` and ``gpus`` are needed."""
    data: dict[str, Any] = {}
    if config is not None:
        loaded = read_yaml(config, "config")
        if not isinstance(loaded, dict):
            raise InputError("config", "must be a YAML mapping of fields")
        data = loaded
    elif model is None:
        raise InputError("--model", "needed without --config",
                         "a preset (llama-3.1-8b, qwen3-14b, ...) or a config.json path")
    if gpus is None and "gpus" not in data:
        raise InputError("--gpus", "needed without a config that sets gpus", "an integer >= 1")
    for key, val in (("model", model), ("algo", algo), ("execution", execution), ("gpus", gpus)):
        if val is not None:
            data[key] = val
    for section in ("cluster", "workload"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise InputError(section, "must be a mapping of fields")
    cluster = dict(data.get("cluster") or {})
    for key, val in (("device", device), ("devices_per_node", devices_per_node)):
        if val is not None:
            cluster[key] = val
    if cluster:
        data["cluster"] = cluster
    workload = dict(data.get("workload") or {})
    for key, val in (("response_len", response_len), ("response_len_max", response_len_max),
                     ("prompt_len", prompt_len), ("prompts_per_step", prompts),
                     ("responses_per_prompt", responses_per_prompt)):
        if val is not None:
            workload[key] = val
    if response_len is not None and response_len_max is None:
        workload.pop("response_len_max", None)
    if workload:
        data["workload"] = workload
    return parse_job(data)
