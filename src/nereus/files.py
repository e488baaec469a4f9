"""Reading user files (JSON, YAML) and validating them, with errors that name the field.

Every config, plan, profile and trace a user hands Nereus goes through these helpers, so a
missing file, a parse error or a wrong field always reads the same way: one line, exit code 2.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
from pathlib import Path
from types import GenericAlias
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from nereus.errors import InputError
from nereus.writes import whole_file

M = TypeVar("M", bound=BaseModel)


def os_reason(e: OSError) -> str:
    """What the operating system said, as the rest of a one-line error reads: 'permission
    denied', not 'Permission denied' or '[Errno 13] ...'."""
    if not e.strerror:
        return type(e).__name__
    return e.strerror[:1].lower() + e.strerror[1:]


# what a path that is neither a file nor a folder is, by its mode (``stat.S_IFMT``)
_NOT_REGULAR = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket"}


def path_stat(path: str | Path, field: str, writing: bool = False) -> os.stat_result | None:
    """``os.stat(path)``, None where nothing is there (a dangling link included); any other
    failure (a folder on the way that cannot be entered, a link loop, a name too long) is an
    InputError naming ``field``, that says it cannot be read (or, ``writing`` an output,
    written). ``Path.exists()`` and ``is_dir()`` raise PermissionError for a path inside a
    folder the user cannot enter: a traceback, not an answer."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:  # a NUL byte in the name: no file can have it
        raise InputError(field, f"{str(path)!r} is not a valid path (it holds a NUL byte)",
                         "a path without NUL bytes") from None
    except OSError as e:
        if writing:
            raise InputError(field, f"cannot write {path}: {os_reason(e)}",
                             "a file in a folder you can write") from None
        raise InputError(field, f"cannot read {path}: {os_reason(e)}",
                         "a readable file") from None


def save_figure(fig: Any, path: str | Path, **kw: Any) -> Path:
    """Write a matplotlib figure to ``path`` in the format its suffix names. It is rendered in
    memory first: the PNG and PDF writers seek back in their file, which a named pipe (an
    output nereus accepts where something reads it) cannot do. The file is written whole or
    not at all (``nereus.writes.whole_file``)."""
    out = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=out.suffix.lstrip(".").lower(), **kw)
    with whole_file(out, "wb") as f:
        f.write(buf.getbuffer())
    return out


def exists(path: str | Path, field: str) -> bool:
    """Whether anything is at ``path``; a path that cannot be looked at is an InputError
    (:func:`path_stat`), not False and not a traceback."""
    return path_stat(path, field) is not None


def is_dir(path: str | Path, field: str, writing: bool = False) -> bool:
    """Whether ``path`` is a folder; as :func:`path_stat` for a path that cannot be looked
    at."""
    st = path_stat(path, field, writing)
    return st is not None and stat.S_ISDIR(st.st_mode)


def existing_file(path: str | Path, field: str, allowed: str = "a file") -> Path:
    """``path``, a regular file; else an InputError naming ``field`` that says what is there
    instead (nothing, a folder, a device or a pipe: ``/dev/zero`` would be read forever, and
    a named pipe blocks until something writes to it)."""
    if str(path) in ("", "."):
        # typer reads an empty argument (``--config "$UNSET"``) as Path(""), which is ".":
        # "'.' is a directory" would name a folder the user never typed
        raise InputError(field, "the path is empty" if not str(path) else
                         "the path is empty or '.' (the working folder)", "a file path")
    st = path_stat(path, field)
    if st is None:
        raise InputError(field, f"no file at {path}{_examples_hint(path)}", "an existing file")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{path} is a directory", allowed)
    if not stat.S_ISREG(st.st_mode):
        what = _NOT_REGULAR.get(stat.S_IFMT(st.st_mode), "another kind")
        raise InputError(field, f"{path} is not a regular file ({what})", allowed)
    return Path(path)


def _examples_hint(path: str | Path) -> str:
    """Where a missing ``examples/...`` path comes from: the README's commands name the
    shipped examples by that folder, which an installed nereus has only once copied there."""
    p = Path(path)
    if p.is_absolute() or not p.parts or p.parts[0] != "examples":
        return ""
    return "; `nereus examples` copies the shipped examples into ./examples"


def read_text(path: str | Path, field: str) -> str:
    """The file's text as UTF-8, without a leading byte-order mark (as Excel and some Windows
    editors write); bytes that are not UTF-8, or a file that cannot be read, are an
    InputError, not a traceback."""
    p = existing_file(path, field)
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(field, f"{p} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
                         f"offset {e.start})", "UTF-8 text") from None
    except OSError as e:  # no read permission, or a file gone or changed since the check
        raise InputError(field, f"cannot read {p}: {os_reason(e)}", "a readable file") from None


class _KeyTwice(dict):
    """A JSON object that set ``key`` twice (the later value kept, as json.loads keeps it)."""

    key: str


def read_json(path: str | Path, field: str) -> Any:
    """JSON; a key given twice in one object is an error, as in :func:`read_yaml`, not the
    last one winning (json.loads keeps it silently: a plan that set ``tp`` twice moved to the
    second)."""
    p = Path(path)
    text = read_text(p, field)
    if not text.strip():  # what the JSON parser calls "Expecting value: line 1, column 1"
        raise InputError(field, f"{p} is empty", "a JSON document")
    twice: list[_KeyTwice] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) == len(pairs) or twice:
            return obj
        marked = _KeyTwice(obj)
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                marked.key = k
                break
            seen.add(k)
        twice.append(marked)
        return marked

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as e:
        raise InputError(field, f"{p} is not valid JSON ({e.msg}: line {e.lineno}, column "
                         f"{e.colno})", "a JSON object") from None
    except RecursionError:
        raise _too_deep(p, field) from None
    if twice:
        try:
            where = _path_to(data, twice[0])
        except RecursionError:  # nested as deep as json.loads goes: say the key alone
            where = None
        key = twice[0].key
        raise InputError(field, f"{p} sets {key!r} twice{f' in {where}' if where else ''}"
                         f"{_key_lines(text, key)}", "each key once per object")
    return data


def _path_to(data: Any, target: object, at: str = "") -> str | None:
    """The dotted path (``stages.0``) of the object ``target`` within ``data``; "" for the
    whole document, None where it is not."""
    if data is target:
        return at
    items = (data.items() if isinstance(data, dict) else enumerate(data)
             if isinstance(data, list) else ())
    for k, v in items:
        if isinstance(v, (dict, list)):
            found = _path_to(v, target, f"{at}.{k}" if at else str(k))
            if found is not None:
                return found
    return None


def _key_lines(text: str, key: str) -> str:
    """Where ``key`` is set, as the YAML reader's error says it (``(line 3, then line 9)``),
    when the text names it just twice (else the two cannot be told from the others)."""
    at = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
    if len(at) != 2:
        return ""
    (l1, c1), (l2, c2) = ((text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i))
                          for i in at)
    return f" (line {l1}, then line {l2})" if l1 != l2 else f" (line {l1}, column {c1}, then "\
        f"column {c2})"


def _too_deep(p: Path, field: str) -> InputError:
    """Nesting past Python's recursion limit (``[[[[...``): no config is that deep."""
    return InputError(field, f"{p} nests lists or mappings too deeply to read",
                      "a few levels of nesting")


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    """A key given twice in one mapping, as written, with its line and the first one's."""

    def __init__(self, key: str, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a key given twice in one mapping: PyYAML keeps the
    last silently, so a config that set ``model:`` twice planned the second and said nothing."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # before the merge keys (``<<: *base``) are flattened in: a key that overrides a
        # merged one is YAML's way of overriding, not a key given twice
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue  # a mapping or list as a key is unhashable: the loader says so
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key_node.value, line, seen[key])
            seen[key] = line
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, field: str, kind: str = "YAML",
              allowed: str = "a YAML mapping of fields") -> Any:
    """YAML, and so JSON too (YAML is a superset of JSON); a key given twice in one mapping is
    an error, not the last one winning, and so is a file with nothing but blanks or comments
    (YAML reads it as null; no caller takes that). ``kind`` and ``allowed`` say what the field
    takes where it is not a YAML of fields alone (``--evaluate``: a plan JSON or a layout
    YAML)."""
    p = Path(path)
    text = read_text(p, field)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise InputError(field, f"{p} sets {e.key!r} twice (line {e.first}, then line "
                         f"{e.line})", "each key once per mapping") from None
    except yaml.YAMLError as e:
        # the first line says what; where is in the marks (PyYAML counts from 0)
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise InputError(field, f"{p} is not valid {kind} ({what}{at})", allowed) from None
    except RecursionError:
        raise _too_deep(p, field) from None
    if data is None:
        raise InputError(field, f"{p} is empty", allowed)
    return data


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


def _yaml_number(value: object) -> str | None:
    """How to write ``value``, a number in exponent notation that YAML 1.1 read as text (its
    floats need a point and a signed exponent: ``1e2`` is a string), so that YAML reads the
    number; None for any other value. A whole number as an integer, since ``1.0e+02`` reads
    as 100.0, which a count refuses too."""
    if not isinstance(value, str) or not _YAML_TEXT_EXP.fullmatch(value.strip()):
        return None
    v = float(value)
    if not math.isfinite(v):  # 1e999: no number to suggest
        return None
    if v.is_integer() and abs(v) <= 2**53:  # past 2**53 a float no longer holds every integer
        return str(int(v))
    shown = repr(v)  # the shortest text that reads back as v: 0.75, 1.5e-07, 1e+300
    return shown.replace("e", ".0e") if "e" in shown and "." not in shown else shown


def _nested_model(ann: object) -> type[BaseModel] | None:
    """The model a field holds, itself or inside a list, dict or optional."""
    # list[int] passes isinstance(..., type) on Python 3.10, and issubclass refuses it
    if isinstance(ann, type) and not isinstance(ann, GenericAlias) and issubclass(ann, BaseModel):
        return ann
    for arg in get_args(ann):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


# what a value of each pydantic type error should have been
_TYPE_WORDS = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
               "list_type": "a list", "tuple_type": "a list", "bool_type": "a switch"}
_TYPE_ALLOWED = {"int_type": "an integer", "float_type": "a number", "string_type": "text",
                 "list_type": "a list", "tuple_type": "a list", "bool_type": "true, false",
                 "dict_type": "a mapping of name: value pairs"}
# a field's Python type -> pydantic's name for it (a missing field says what it takes)
_KIND_OF: dict[object, str] = {int: "int_type", float: "float_type", str: "string_type",
                               bool: "bool_type", list: "list_type", tuple: "tuple_type",
                               dict: "dict_type"}


def _field_info(root: type[BaseModel], loc: tuple[object, ...]) -> FieldInfo | None:
    """The schema field an error location ends in (list indices and union branches skipped)."""
    model: type[BaseModel] | None = root
    found: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int) or _UNION_BRANCH.fullmatch(str(part)):
            continue
        fi = model.model_fields.get(str(part)) if model is not None else None
        if fi is None:
            return found if model is None else None
        found = fi
        model = _nested_model(fi.annotation)
    return found


def _quoted(v: object) -> str:
    """A wrong value as the message quotes it: ``'16'``, ``16.5``, ``true``, an empty value."""
    if v is None:
        return "an empty value"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        from nereus.spec.workload import shown  # spec imports this module

        return shown(v)
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_error(e: ValidationError) -> ErrorDetails:
    """The error to report: the first, or for a union (``gpus: 16 | [0, 1]``) the branch the
    value went furthest into (``gpus: [0, 'a']`` is a list with a bad id, not a bad integer)."""
    errs = e.errors()
    first = errs[0]
    if not any(_UNION_BRANCH.fullmatch(str(x)) for x in first["loc"]):
        return first
    head = first["loc"][0] if first["loc"] else None
    same = [x for x in errs if x["loc"] and x["loc"][0] == head]
    return max(same, key=lambda x: len(x["loc"]))  # the first of the deepest


def validation_error(e: ValidationError, root: type[BaseModel]) -> InputError:
    """The first pydantic error as an InputError naming the dotted field and what is allowed."""
    err = _first_error(e)
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
        return InputError(loc, "required field is missing",
                          _wanted(_field_info(root, tuple(err["loc"]))))
    if kind == "literal_error":
        return InputError(loc, f"{err.get('input')!r} is not allowed",
                          str(err.get("ctx", {}).get("expected", "")))
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        # a section given a value (``cluster: h100``): the fields it takes are what is allowed
        fi = _field_info(root, tuple(err["loc"]))
        inner = _nested_model(fi.annotation) if fi is not None else None
        if inner is not None:
            return InputError(loc, "must be a mapping of fields", list(inner.model_fields))
        # a free-form section (``job:`` of a scenario, ``notes:``): what its schema says
        return InputError(loc, "must be a mapping of fields",
                          fi.description if fi is not None and fi.description else
                          "a mapping of name: value pairs")
    inp = err.get("input")
    if kind in _TYPE_WORDS:
        # one wording for every wrong type: the value, what it should have been, and what
        # the field allows (its schema description where it has one)
        problem = f"{_quoted(inp)} is not {_TYPE_WORDS[kind]}"
        hint = _yaml_number(inp) if kind in ("int_type", "float_type") else None
        if hint is not None:
            problem += f" (YAML reads it as text: write {hint})"
        fi = _field_info(root, tuple(err["loc"]))
        allowed = _TYPE_ALLOWED[kind]
        if kind != "bool_type" and fi is not None and fi.description:
            allowed = fi.description
        return InputError(loc, problem, allowed)
    if kind in _BOUNDS:
        return InputError(loc, f"{_quoted(inp)} is not allowed",
                          _range(_field_info(root, tuple(err["loc"])), err))
    if kind == "finite_number":
        return InputError(loc, f"{_quoted(inp)} is not allowed", "a finite number")
    if kind in ("too_short", "too_long"):
        ctx = err.get("ctx", {})
        n = ctx.get("actual_length")
        items = "no items" if n == 0 else "1 item" if n == 1 else f"{n} items"
        return InputError(loc, f"has {items}", f"at least {ctx.get('min_length')}"
                          if kind == "too_short" else f"at most {ctx.get('max_length')}")
    # a validator's own message, which ends in what is allowed as "... (allowed: ...)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    problem, _, allowed = msg.partition(" (allowed: ")
    if not allowed.endswith(")"):
        return InputError(loc, msg)
    return InputError(loc, problem, allowed.removesuffix(")"))


def _wanted(fi: FieldInfo | None) -> str:
    """What a missing field takes, for the error that says it is missing: its schema
    description, the fields of the section it holds, or its type in words."""
    if fi is None:
        return "a value for it"
    if fi.description:
        return fi.description
    inner = _nested_model(fi.annotation)
    if inner is not None:
        many = get_origin(fi.annotation) in (list, tuple)
        return (f"{'a list of mappings' if many else 'a mapping'} of "
                f"{', '.join(inner.model_fields)}")
    kind = _KIND_OF.get(get_origin(fi.annotation) or fi.annotation)
    return _TYPE_ALLOWED[kind] if kind is not None else "a value for it"


# pydantic's bound errors: the comparison and its key in the error's context
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
           "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}


def _range(fi: FieldInfo | None, err: ErrorDetails) -> str:
    """What a bounded field allows: ``lo..hi`` where the field declares both inclusive
    bounds, else the bound the value broke (``>= 1``)."""
    lo = hi = None
    for m in fi.metadata if fi is not None else ():
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    if lo is not None and hi is not None:
        return f"{_bound(lo)}..{_bound(hi)}"
    op, key = _BOUNDS[err["type"]]
    return f"{op} {_bound(err.get('ctx', {}).get(key))}"


def _bound(v: object) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
