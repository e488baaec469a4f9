"""Reading user files (JSON, YAML) and validating them, with errors that name the field.

Every config, plan, profile and trace a user hands Nereus goes through these helpers, so a
missing file, a parse error or a wrong field always reads the same way: one line, exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from nereus.errors import InputError

M = TypeVar("M", bound=BaseModel)


def _existing(path: str | Path, field: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError(field, f"no file at {path}")
    return p


def read_json(path: str | Path, field: str) -> Any:
    p = _existing(path, field)
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(field, f"{p} is not valid JSON ({e.msg} at line {e.lineno})") from None


def read_yaml(path: str | Path, field: str) -> Any:
    """YAML, and so JSON too (YAML is a superset of JSON)."""
    p = _existing(path, field)
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise InputError(field, f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None


def validate(model: type[M], data: object, field: str = "config") -> M:
    """``model.model_validate(data)`` with the first error turned into an InputError."""
    if not isinstance(data, dict):
        raise InputError(field, "must be a mapping of fields", list(model.model_fields))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, model) from None


def validation_error(e: ValidationError, root: type[BaseModel]) -> InputError:
    """The first pydantic error as an InputError naming the dotted field and what is allowed."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "config"
    kind = err["type"]
    if kind == "extra_forbidden":
        model: type[BaseModel] = root
        for part in err["loc"][:-1]:
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
