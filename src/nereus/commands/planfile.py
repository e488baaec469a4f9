"""Plan files as the commands write and read them: the job a plan was made for, and the
files ``nereus transition`` takes as a plan (a plan JSON, or a layout as ``--evaluate`` reads).

``nereus plan --json`` records under ``planned_for`` the model, its architecture, the device,
the algorithm, what scores its responses (a reward model or a rule) and whether generation runs
asynchronously; a command that prices a plan for a job checks that record
against the job (a plan of another model sizes no state of this one). The architecture is
what identifies a model: one read from a file is named after the file, or after its folder
for a config.json (``nereus.spec.model.name_from_path``), so two models can share a name and
one model can have two. Files without a record, or whose record predates the architecture
(written before, or by hand), are checked on what they have.

The record also holds the whole job under ``job``, as the job YAML writes it (pool, cluster,
workload): ``nereus transition a.json b.json`` prices the move with the jobs the two files
record, with no job options. A model read from a config.json is recorded by the file's
absolute path, which another machine may not have; files written before ``job`` was recorded
need the job from the options, as they always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nereus.errors import InputError
from nereus.files import exists, is_dir
from nereus.plan.types import PLAN_FILE_KEYS
from nereus.spec.job import JobConfig, JobSpec, job_config, parse_job
from nereus.spec.model import MODEL_PRESETS, ModelSpec

RECORD_KEY = "planned_for"
RECORD_FIELDS = ("model", "device", "algo", "reward", "execution", "architecture", "job")
JOB_KEY = "job"  # the whole job, as the job YAML writes it
# what the error names (the model by its architecture); a record without a reward or an
# execution predates it
CHECKED = ("model", "device", "algo", "reward", "execution")


def architecture(m: ModelSpec) -> str:
    """The shape that sizes a model's state and compute, as one line."""
    return (f"{m.num_layers} layers x {m.hidden_size}, ffn {m.intermediate_size}, "
            f"{m.num_heads}/{m.num_kv_heads} heads x {m.head_dim}, vocab {m.vocab_size}"
            + (", tied embeddings" if m.tie_embeddings else "")
            + (", qk-norm" if m.qk_norm else "")
            + (f", sliding window {m.sliding_window} (layers {m.window_from}+, every "
               f"{m.window_every})" if m.sliding_window is not None else ""))


def planned_for(job: JobSpec) -> dict[str, str]:
    """What ``nereus plan --json`` records of the job it planned, by name (the job itself is
    :func:`with_record`'s to add: it needs to know where the model came from)."""
    return {"model": job.model.name, "device": job.cluster.device.name,
            "algo": job.workflow.algo, "reward": job.workflow.reward,
            "execution": job.workflow.execution.value, "architecture": architecture(job.model)}


def model_source(given: str) -> str:
    """The model as a record keeps it, from the ``model`` a user gave: a preset by its name;
    a config.json path made absolute (it was read relative to the working directory, which
    a later command may not share), its links kept: a config.json is named after the folder
    the path names, and a Hugging Face snapshot's config.json links into a folder of blobs;
    anything else (a Hugging Face id, read from the local cache) as given."""
    if given.lower() in MODEL_PRESETS:
        return given.lower()
    path = Path(given)
    return str(path.absolute()) if exists(path, "--model") else given


# top-level fields of a plan JSON besides its stages (those --evaluate --json adds included)
PLAN_FIELDS = tuple(k for k in PLAN_FILE_KEYS if k != "stages")


def output_kind(data: Any) -> str | None:
    """What another command's ``--json`` output ``data`` is, in words, where it is one (a
    frontier, a simulation, a transition's schedule or run): no plan, though a plan's reader
    would otherwise name a field of it as wrong; None for anything else."""
    if not isinstance(data, Mapping) or "stages" in data:
        return None
    if {"frontier", "stage"} <= set(data):
        return "a model-stage's latency-GPU frontier (as nereus plan --frontier --json writes)"
    if {"scenario", "policies"} <= set(data):
        return "a simulation's result (as nereus simulate --json writes)"
    if "primitives" in data:
        return "a transition's schedule (as nereus transition --json writes)"
    return None


def job_shaped(data: Any) -> bool:
    """Whether ``data`` has a job YAML's fields (model, gpus, ...): a job file, not a plan."""
    return isinstance(data, Mapping) and any(k in JobConfig.model_fields for k in data)


def with_record(plan_dict: dict[str, Any], job: JobSpec,
                model: str | None = None) -> dict[str, Any]:
    """A plan's JSON with the job it was planned for. ``model``: the model as the user gave
    it (:func:`model_source`); without it, the whole job is recorded only for a preset model,
    the one kind the job itself names."""
    record: dict[str, Any] = planned_for(job)
    if model is not None:
        record[JOB_KEY] = job_config(job, model_source(model))
    elif MODEL_PRESETS.get(job.model.name) == job.model:
        record[JOB_KEY] = job_config(job)
    return {**plan_dict, RECORD_KEY: record}


def split_record(data: Any, field: str) -> tuple[Any, dict[str, Any] | None]:
    """``data`` without its ``planned_for`` record, and the record (None when it has none):
    names as strings, the job (where recorded) a mapping, read by :func:`recorded_job`. A
    record of the wrong shape is an InputError naming ``field.planned_for``."""
    if not isinstance(data, Mapping) or RECORD_KEY not in data:
        return data, None
    rec = data[RECORD_KEY]
    where = f"{field}.{RECORD_KEY}"
    if not isinstance(rec, Mapping):
        raise InputError(where, "must be a mapping of model, device, algo and architecture",
                         "what nereus plan --json writes")
    for k, v in rec.items():
        if k not in RECORD_FIELDS:
            raise InputError(f"{where}.{k}", "unknown field", RECORD_FIELDS)
        if k == JOB_KEY:
            if not isinstance(v, Mapping):
                raise InputError(f"{where}.{k}", "must be a mapping of job fields",
                                 "a job as the job YAML writes it")
        elif not isinstance(v, str):
            raise InputError(f"{where}.{k}", f"{v!r} is not a string", "a name")
    rest = {k: v for k, v in data.items() if k != RECORD_KEY}
    return rest, {str(k): v if k == JOB_KEY else str(v) for k, v in rec.items()}


def recorded_job(record: Mapping[str, Any] | None, field: str, path: Path) -> JobSpec | None:
    """The job a plan file records (None for a file without one: written before the job was
    recorded, or by hand). Its errors name the record's field (``target.planned_for.job.gpus``)
    and the file; a model whose config.json is not on this machine says so in one line."""
    if record is None or JOB_KEY not in record:
        return None
    data = record[JOB_KEY]
    where = f"{field}.{RECORD_KEY}.{JOB_KEY}"
    missing = _missing_config(data.get("model"), f"{where}.model")
    if missing is not None:  # the model's errors would offer the presets: the file is missing
        raise InputError(f"{where}.model", f"{path.name} was planned for the model in "
                         f"{missing}, which is not on this machine",
                         "the config.json back at that path, or the job from --config or "
                         "--model")
    try:
        job = parse_job(data)
    except InputError as e:
        name = where if e.field == "config" else f"{where}.{e.field}"
        raise InputError(name, f"{path.name}: {e.problem}", e.allowed) from None
    # nereus plan --json writes the names from the job it records: a name that differs from
    # its job's was edited by hand, and which of the two the plan was made for is unknown
    # (the architecture alone would let a renamed model pass)
    mine = planned_for(job)
    for k in RECORD_FIELDS:
        if k in record and k in mine and record[k] != mine[k]:
            raise InputError(f"{field}.{RECORD_KEY}.{k}", f"{path.name} records "
                             f"{record[k]!r}, but its {RECORD_KEY}.{JOB_KEY} says {mine[k]!r}",
                             f"the {k} of {RECORD_KEY}.{JOB_KEY}, as nereus plan --json "
                             f"writes it")
    return job


def _missing_config(model: Any, field: str) -> Path | None:
    """The config.json a recorded model names that is not there (None for a preset, an
    id, or a config.json that is): a record names one by its absolute path, the file or its
    folder. One that cannot be looked at is an InputError naming ``field``."""
    if not isinstance(model, str) or model.lower() in MODEL_PRESETS:
        return None
    p = Path(model)
    if not p.is_absolute() or exists(p, field) and (not is_dir(p, field)
                                                   or exists(p / "config.json", field)):
        return None
    return p if p.suffix.lower() == ".json" else p / "config.json"


def _described(rec: Mapping[str, Any]) -> str:
    model, device, algo, reward, execution = (rec.get(k, "?") for k in CHECKED)
    return (f"{model} on {device} ({algo}{', rule reward' if reward == 'rule' else ''}"
            f"{', asynchronous' if execution == 'async' else ''})")


def _model_differs(record: Mapping[str, Any], mine: Mapping[str, str]) -> str | None:
    """How the recorded model differs from the job's (None when it does not): by
    architecture where the record has one, else by name."""
    if "architecture" in record:
        if record["architecture"] == mine["architecture"]:
            return None
        return "model" if record.get("model") != mine["model"] else "model architecture"
    return "model" if "model" in record and record["model"] != mine["model"] else None


def check_record(record: Mapping[str, Any] | None, job: JobSpec, field: str,
                 path: Path) -> None:
    """Refuse a plan recorded for another model, device or algorithm than ``job``: its state
    sizes, memory and stages are another job's, so its transition would be priced wrongly or
    reported infeasible for a reason that is not one."""
    if record is None:
        return
    mine = planned_for(job)
    # execution: a plan's step latency adds its terms (sync) or overlaps generation (async)
    differ = [k for k in ("device", "algo", "reward", "execution")
              if k in record and record[k] != mine[k]]
    model = _model_differs(record, mine)
    if model is not None:
        differ.insert(0, model)
    if not differ:
        return
    opts = record_options(record)
    verb = "differs" if len(differ) == 1 else "differ"
    raise InputError(field, f"{path.name} was planned for {_described(record)}, not for "
                     f"{_described(mine)} ({' and '.join(differ)} {verb})",
                     f"a plan made for {_described(mine)}, or {opts} to price it with the "
                     f"job it was planned for")


def record_options(record: Mapping[str, Any]) -> str:
    """The options that price a plan with the job its record names (``--model X --device Y
    ...``)."""
    return " ".join(f"--{k} {_option_value(k, record)}" for k in CHECKED if k in record)


def _option_value(key: str, record: Mapping[str, Any]) -> str:
    """A recorded name as an option's value. A model is a preset only when its architecture
    is the preset's; otherwise it came from a file, named after it or its folder, which only
    its path finds again."""
    value = record[key]
    if key != "model":
        return value
    preset = MODEL_PRESETS.get(value)
    if preset is not None:
        shape = architecture(preset)
        if record.get("architecture", shape) == shape:
            return value
    return f"<the config.json of {value}>"
