"""Plan files as the commands write and read them: the job a plan was made for, and the
files ``nereus transition`` takes as a plan (a plan JSON, or a layout as ``--evaluate`` reads).

``nereus plan --json`` records under ``planned_for`` the model, device and algorithm it
planned; a command that prices a plan for a job checks that record against the job (a plan
of another model sizes no state of this one). Files without it (written before the record
existed, or by hand) are taken as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nereus.errors import InputError
from nereus.spec.job import JobSpec

RECORD_KEY = "planned_for"
RECORD_FIELDS = ("model", "device", "algo")


def planned_for(job: JobSpec) -> dict[str, str]:
    """What ``nereus plan --json`` records of the job it planned."""
    return {"model": job.model.name, "device": job.cluster.device.name,
            "algo": job.workflow.algo}


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
        raise InputError(where, "must be a mapping of model, device and algo",
                         "what nereus plan --json writes")
    for k, v in rec.items():
        if k not in RECORD_FIELDS:
            raise InputError(f"{where}.{k}", "unknown field", RECORD_FIELDS)
        if not isinstance(v, str):
            raise InputError(f"{where}.{k}", f"{v!r} is not a string", "a name")
    rest = {k: v for k, v in data.items() if k != RECORD_KEY}
    return rest, {str(k): str(v) for k, v in rec.items()}


def _described(rec: Mapping[str, str]) -> str:
    model, device, algo = (rec.get(k, "?") for k in RECORD_FIELDS)
    return f"{model} on {device} ({algo})"


def check_record(record: Mapping[str, str] | None, job: JobSpec, field: str,
                 path: Path) -> None:
    """Refuse a plan recorded for another model, device or algorithm than ``job``: its state
    sizes, memory and stages are another job's, so its transition would be priced wrongly or
    reported infeasible for a reason that is not one."""
    if record is None:
        return
    mine = planned_for(job)
    differ = [k for k in RECORD_FIELDS if k in record and record[k] != mine[k]]
    if not differ:
        return
    opts = " ".join(f"--{k} {record[k]}" for k in RECORD_FIELDS if k in record)
    verb = "differs" if len(differ) == 1 else "differ"
    raise InputError(field, f"{path.name} was planned for {_described(record)}, not for "
                     f"{_described(mine)} ({' and '.join(differ)} {verb})",
                     f"a plan made for {_described(mine)}, or {opts} to price it with the "
                     f"job it was planned for")
