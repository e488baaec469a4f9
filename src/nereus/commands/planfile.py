"""Plan files as the commands write and read them: the job a plan was made for, and the
files ``nereus transition`` takes as a plan (a plan JSON, or a layout as ``--evaluate`` reads).

``nereus plan --json`` records under ``planned_for`` the model, its architecture, the device,
the algorithm, what scores its responses (a reward model or a rule) and whether generation runs
asynchronously; a command that prices a plan for a job checks that record
against the job (a plan of another model sizes no state of this one). The architecture is
what identifies a model: a Hugging Face config.json is named after its folder, so two
models can share a name and one model can have two. Files without a record, or whose record
predates the architecture (written before, or by hand), are checked on what they have.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nereus.errors import InputError
from nereus.spec.job import JobSpec
from nereus.spec.model import MODEL_PRESETS, ModelSpec

RECORD_KEY = "planned_for"
RECORD_FIELDS = ("model", "device", "algo", "reward", "execution", "architecture")
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
    """What ``nereus plan --json`` records of the job it planned."""
    return {"model": job.model.name, "device": job.cluster.device.name,
            "algo": job.workflow.algo, "reward": job.workflow.reward,
            "execution": job.workflow.execution.value, "architecture": architecture(job.model)}


def with_record(plan_dict: dict[str, Any], job: JobSpec) -> dict[str, Any]:
    """A plan's JSON with the job it was planned for."""
    return {**plan_dict, RECORD_KEY: planned_for(job)}


def split_record(data: Any, field: str) -> tuple[Any, dict[str, str] | None]:
    """``data`` without its ``planned_for`` record, and the record (None when it has none);
    a record of the wrong shape is an InputError naming ``field.planned_for``."""
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
        if not isinstance(v, str):
            raise InputError(f"{where}.{k}", f"{v!r} is not a string", "a name")
    rest = {k: v for k, v in data.items() if k != RECORD_KEY}
    return rest, {str(k): str(v) for k, v in rec.items()}


def _described(rec: Mapping[str, str]) -> str:
    model, device, algo, reward, execution = (rec.get(k, "?") for k in CHECKED)
    return (f"{model} on {device} ({algo}{', rule reward' if reward == 'rule' else ''}"
            f"{', asynchronous' if execution == 'async' else ''})")


def _model_differs(record: Mapping[str, str], mine: Mapping[str, str]) -> str | None:
    """How the recorded model differs from the job's (None when it does not): by
    architecture where the record has one, else by name."""
    if "architecture" in record:
        if record["architecture"] == mine["architecture"]:
            return None
        return "model" if record.get("model") != mine["model"] else "model architecture"
    return "model" if "model" in record and record["model"] != mine["model"] else None


def check_record(record: Mapping[str, str] | None, job: JobSpec, field: str,
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


def record_options(record: Mapping[str, str]) -> str:
    """The options that price a plan with the job its record names (``--model X --device Y
    ...``)."""
    return " ".join(f"--{k} {_option_value(k, record)}" for k in CHECKED if k in record)


def _option_value(key: str, record: Mapping[str, str]) -> str:
    """A recorded name as an option's value. A model is a preset only when its architecture
    is the preset's; otherwise it came from a config.json, named after its folder, which only
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
