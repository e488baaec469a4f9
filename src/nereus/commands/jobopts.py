"""A job from a YAML config and/or command-line options (shared by plan, transition, simulate)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from nereus.commands.common import with_default
from nereus.errors import InputError
from nereus.files import read_yaml
from nereus.spec.device import DEVICE_PRESETS
from nereus.spec.job import ClusterConfig, JobConfig, JobSpec, WorkloadConfig, parse_job
from nereus.spec.job import check_groups as group_check
from nereus.spec.model import MODEL_PRESETS


def _schema_default(model: type[Any], name: str) -> object:
    return model.model_fields[name].default


# Help of the job options that plan and transition share; the defaults are the job schema's
# (what applies when neither the option nor --config sets the field).
JOB_HELP = {
    "model": f"model preset ({', '.join(MODEL_PRESETS)}), path to a HF config.json, or a HF "
             "id (ORG/NAME) whose config.json is in the local Hugging Face cache",
    "algo": with_default("ppo, grpo or remax", _schema_default(JobConfig, "algo")),
    "execution": with_default("sync or async", _schema_default(JobConfig, "execution")),
    "reward": with_default("what scores responses: model (a reward model as large as the "
                           "actor) or rule (a verifier on the CPU, no model-stage)",
                           _schema_default(JobConfig, "reward")),
    "gpus": "GPUs in the pool (needed without a --config that sets gpus)",
    "device": with_default(", ".join(DEVICE_PRESETS), _schema_default(ClusterConfig, "device")),
    "devices_per_node": with_default("devices per node",
                                     "the device's node size ("
                                     + "/".join(sorted({str(d.devices_per_node)
                                                        for d in DEVICE_PRESETS.values()}))
                                     + "), or the pool if smaller"),
    "response_len": with_default("mean response length (tokens)",
                                 _schema_default(WorkloadConfig, "response_len")),
    "response_len_max": with_default("longest response (tokens); --response-len alone also "
                                     "replaces a config's response_len_max",
                                     "the mean response length"),
    "prompt_len": with_default("prompt length (tokens)",
                               _schema_default(WorkloadConfig, "prompt_len")),
    "prompts": with_default("prompts per RL step",
                            _schema_default(WorkloadConfig, "prompts_per_step")),
    "responses_per_prompt": with_default("responses per prompt",
                                         _schema_default(WorkloadConfig, "responses_per_prompt")),
    "ppo_mini_batches": with_default("optimizer updates per epoch; must divide prompts x "
                                     "responses per prompt",
                                     _schema_default(WorkloadConfig, "ppo_mini_batches")),
    "profile": with_default("calibration profile JSON of the same device: efficiency per "
                            "op class, memory_scale per stage kind (in a source checkout, "
                            "python benchmarks/engine.py --profile OUT.json measures one)",
                            "built-in efficiencies per op class"),
}


# The option that sets each job field from the command line.
OPTION_OF = {"model": "--model", "algo": "--algo", "execution": "--execution",
              "reward": "--reward", "gpus": "--gpus",
              "cluster.device": "--device", "cluster.devices_per_node": "--devices-per-node",
              "workload.response_len": "--response-len",
              "workload.response_len_max": "--response-len-max",
              "workload.prompt_len": "--prompt-len", "workload.prompts_per_step": "--prompts",
              "workload.responses_per_prompt": "--responses-per-prompt",
              "workload.ppo_mini_batches": "--ppo-mini-batches"}


# Fields whose check reads other fields too: when the user typed one of those options and not
# the field's own, the option is what they changed, so the error names it.
_ALSO_SET_BY = {"workload.ppo_mini_batches": ("--prompts", "--responses-per-prompt"),
                "workload.responses_per_prompt": ("--prompts",),
                # the context window: prompt + longest response within the model's
                "workload.response_len": ("--prompt-len", "--model"),
                "workload.response_len_max": ("--prompt-len", "--model")}


def _param(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def _as_option(e: InputError, typed: Mapping[str, object],
               config: Mapping[str, Any] | None = None) -> InputError:
    """``e`` naming the option that set the field it names (``--gpus``, not ``gpus``), as a user
    typed it; a field the config file set, or a value the command worked out itself, keeps the
    field's name, unless an option the user typed made that value wrong (``--prompts 3``
    against the config's ``ppo_mini_batches: 4``, or its default): then that option.
    ``typed``: the values of the options the user gave, by parameter name
    (``devices_per_node``); ``config``: the fields the config file gave."""
    option = OPTION_OF.get(e.field)
    if option is not None and typed.get(_param(option)) is not None:
        return InputError(option, e.problem, e.allowed)
    changed = [o for o in _ALSO_SET_BY.get(e.field, ()) if typed.get(_param(o)) is not None]
    if not changed:
        return e
    what = str(typed[_param(changed[0])]) + "".join(
        f" (with {o} {typed[_param(o)]})" for o in changed[1:])
    section, _, name = e.field.partition(".")
    given = name in ((config or {}).get(section) or {})
    whose = f"the config's {e.field}" if given else f"the default {e.field}"
    return InputError(changed[0], f"{what} against {whose}: {e.problem}",
                      f"{option} {e.allowed}, or another {' / '.join(changed)}"
                      if e.allowed and option else e.allowed)


def job_from_options(config: Path | None = None, **options: Any) -> JobSpec:
    """The job from a config and the options (:func:`job_and_fields_from_options`)."""
    return job_and_fields_from_options(config, **options)[0]


def job_and_fields_from_options(
        config: Path | None = None, *, model: str | None = None, algo: str | None = None,
        execution: str | None = None, reward: str | None = None, gpus: int | None = None,
        device: str | None = None, devices_per_node: int | None = None,
        response_len: int | None = None, response_len_max: int | None = None,
        prompt_len: int | None = None, prompts: int | None = None,
        responses_per_prompt: int | None = None, ppo_mini_batches: int | None = None,
        check_groups: bool = True, derived: Collection[str] = ()
) -> tuple[JobSpec, dict[str, Any]]:
    """The job, and the job YAML's fields it was read from (the config's, with the options in
    place: its ``model`` is the model as the user gave it, which the job does not keep).
    Options override the config's fields; without a config, ``model`` and ``gpus`` are needed.
    ``check_groups``: refuse a GRPO job with one response per prompt (off where the command
    reads no workload: its default would be refused with no option to change it).
    ``derived``: parameters the command worked out itself rather than took from an option
    (``nereus transition`` sizes ``gpus`` to its plan files): their errors name the field."""
    data: dict[str, Any] = {}
    if config is not None:
        loaded = read_yaml(config, "config", allowed="a YAML mapping of job fields, model "
                           "and gpus at least (nereus examples writes some)")
        if not isinstance(loaded, dict):
            raise InputError("config", "must be a YAML mapping of fields",
                             list(JobConfig.model_fields))
        data = loaded
        unknown = [k for k in data if k not in JobConfig.model_fields]
        if unknown:  # before "needs gpus": a misspelt ``gpus:`` is the likelier mistake
            raise InputError(str(unknown[0]), "unknown field", list(JobConfig.model_fields))
    elif model is None:
        raise InputError("--model", "needed without --config",
                         "a preset (llama-3.1-8b, qwen3-14b, ...) or a config.json path")
    loaded_fields = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    if gpus is None and "gpus" not in data:
        raise InputError("--gpus", "needed without a config that sets gpus", "an integer >= 1")
    for key, val in (("model", model), ("algo", algo), ("execution", execution),
                     ("reward", reward), ("gpus", gpus)):
        if val is not None:
            data[key] = val
    for section, fields in (("cluster", ClusterConfig.model_fields),
                            ("workload", WorkloadConfig.model_fields)):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise InputError(section, "must be a mapping of fields", list(fields))
    cluster = dict(data.get("cluster") or {})
    for key, val in (("device", device), ("devices_per_node", devices_per_node)):
        if val is not None:
            cluster[key] = val
    if cluster:
        data["cluster"] = cluster
    workload = dict(data.get("workload") or {})
    for key, val in (("response_len", response_len), ("response_len_max", response_len_max),
                     ("prompt_len", prompt_len), ("prompts_per_step", prompts),
                     ("responses_per_prompt", responses_per_prompt),
                     ("ppo_mini_batches", ppo_mini_batches)):
        if val is not None:
            workload[key] = val
    if response_len is not None and response_len_max is None:
        workload.pop("response_len_max", None)
    if workload:
        data["workload"] = workload
    given = {"model": model, "algo": algo, "execution": execution, "reward": reward, "gpus": gpus,
             "device": device, "devices_per_node": devices_per_node,
             "response_len": response_len, "response_len_max": response_len_max,
             "prompt_len": prompt_len, "prompts": prompts,
             "responses_per_prompt": responses_per_prompt, "ppo_mini_batches": ppo_mini_batches}
    typed = {k: v for k, v in given.items() if k not in derived}
    try:
        job = parse_job(data)
    except InputError as e:
        raise _as_option(e, typed, loaded_fields) from None
    if check_groups:
        try:
            group_check(job)
        except InputError as e:
            if "responses_per_prompt" in (data.get("workload") or {}) and \
                    responses_per_prompt is None:
                raise  # the config's own value: its field names it
            if responses_per_prompt is None and config is not None:
                # the job came from the config, which leaves the field to its default: the
                # field names it (the option can set it too)
                raise InputError(e.field, f"{job.workflow.algo} needs several responses per "
                                 "prompt to compare, and the config leaves it at the default 1",
                                 f"{e.allowed}, e.g. responses_per_prompt: 8 under workload, or "
                                 "--responses-per-prompt 8") from None
            option_given = responses_per_prompt is not None
            raise InputError("--responses-per-prompt",
                             e.problem if option_given else f"{job.workflow.algo} needs several "
                             "responses per prompt to compare, and the default is 1",
                             f"{e.allowed}, e.g. --responses-per-prompt 8") from None
    return job, data
