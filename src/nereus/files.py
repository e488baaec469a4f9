"""Reading user files (JSON, YAML) and validating them, with errors that name the field.

Every config, plan, profile and trace a user hands Nereus goes through these helpers, so a
missing file, a parse error or a wrong field always reads the same way: one line, exit code 2.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ValidationError

from nereus.errors import InputError

M = TypeVar("M", bound=BaseModel)


def _existing(path: str | Path, field: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError(field, f"no file at {path}")
    return p


def read_text(path: str | Path, field: str) -> str:
    """The file's text as UTF-8, without a leading byte-order mark (as Excel and some Windows
    editors write); bytes that are not UTF-8 are an InputError, not a traceback."""
    p = _existing(path, field)
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(field, f"{p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
                         f"offset {e.start})", "UTF-8 text") from None


def read_json(path: str | Path, field: str) -> Any:
    p = Path(path)
    text = read_text(p, field)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"{p} is not valid JSON ({e.msg} at line {e.lineno})") from None


def read_yaml(path: str | Path, field: str) -> Any:
    """YAML, and so JSON too (YAML is a superset of JSON)."""
    p = Path(path)
    text = read_text(p, field)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(field, f"{p} is not valid YAML: {str(e).splitlines()[0]}") from None


def validate(model: type[M], data: object, field: str = "config", prefix: str = "") -> M:
    """``model.model_validate(data)`` with the first error turned into an InputError; the
    field it names starts with ``prefix`` (e.g. ``"current."``) when one is given."""
    if not isinstance(data, dict):
        raise InputError(field, "must be a mapping of fields", list(model.model_fields))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = validation_error(e, model)
        if prefix:
            err = InputError(prefix + err.field, err.problem, err.allowed)
        raise err from None


_UNION_BRANCH = re.compile(r"(int|float|str|bool|none|list\[.*\]|dict\[.*\]|tuple\[.*\]|"
                           r"function-.*)")


_YAML_TEXT_EXP = re.compile(r"[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+")


def _nested_model(ann: object) -> type[BaseModel] | None:
    """The model a field holds, itself or inside a list, dict or optional."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def validation_error(e: ValidationError, root: type[BaseModel]) -> InputError:
    """The first pydantic error as an InputError naming the dotted field and what is allowed."""
    err = e.errors()[0]
    # a union's branch shows in the location as its type ("gpus.int"): not a field name
    parts = [str(x) for x in err["loc"] if not _UNION_BRANCH.fullmatch(str(x))]
    loc = ".".join(parts) or "config"
    kind = err["type"]
    if kind == "extra_forbidden":
        model: type[BaseModel] = root
        for part in err["loc"][:-1]:
            if isinstance(part, int):
                continue  # a list index: the same model's items
            fld = model.model_fields.get(str(part))
            inner = _nested_model(fld.annotation) if fld else None
            if inner is not None:
                model = inner
        return InputError(loc, "unknown field", list(model.model_fields))
    if kind == "missing":
        return InputError(loc, "required field is missing")
    if kind == "literal_error":
        return InputError(loc, f"{err.get('input')!r} is not allowed",
                          str(err.get("ctx", {}).get("expected", "")))
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return InputError(loc, "must be a mapping of fields")
    inp = err.get("input")
    if kind in ("int_type", "float_type") and isinstance(inp, (str, bool)):
        what = "an integer" if kind == "int_type" else "a number"
        problem = f"{str(inp).lower() if isinstance(inp, bool) else repr(inp)} is not {what}"
        if isinstance(inp, str) and _YAML_TEXT_EXP.fullmatch(inp.strip()):
            # YAML 1.1 reads 1e300 as text: its floats need a point and a signed exponent
            problem += f" (YAML reads it as text: write {float(inp):.1e})"
        return InputError(loc, problem)
    if kind == "bool_type":
        return InputError(loc, f"{inp!r} is not a switch", "true, false")
    return InputError(loc, str(err["msg"]).removeprefix("Value error, "))
