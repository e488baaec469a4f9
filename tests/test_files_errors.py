"""nereus.files and the trace readers: every error a user can fix says what is allowed, and a
JSON file that sets a key twice is refused as a YAML one is, not read with the last value."""

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from nereus.errors import InputError
from nereus.files import existing_file, read_json, read_yaml, validate
from nereus.sim.traces import load_availability, parse_ids


def said(fn, *args) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    return info.value


# ---- a key given twice ----

def test_a_json_key_given_twice_is_refused_with_its_lines(tmp_path: Path) -> None:
    """json.loads kept the last: a plan that set tp twice planned the second, silently."""
    p = tmp_path / "plan.json"
    p.write_text('{\n "tp": 1,\n "pp": 1,\n "tp": 2\n}\n')
    e = said(read_json, p, "target")
    assert str(e) == (f"target: {p} sets 'tp' twice (line 2, then line 4) (allowed: each key "
                      "once per object)")


def test_a_nested_json_key_given_twice_names_where(tmp_path: Path) -> None:
    p = tmp_path / "p.json"
    p.write_text('{"stages": [{"name": "a"}, {"name": "b", "tp": 1, "tp": 2}], "tp": 3}')
    e = said(read_json, p, "target")
    # three "tp"s in the text: which two are the object's is not told, so no lines
    assert e.problem == f"{p} sets 'tp' twice in stages.1"
    assert e.allowed == "each key once per object"
    p.write_text('{"stages": [{"name": "a"}, {"name": "b", "tp": 1, "tp": 2}]}')
    e = said(read_json, p, "target")
    assert e.problem == f"{p} sets 'tp' twice in stages.1 (line 1, column 42, then column 51)"


def test_a_json_key_given_twice_reads_as_the_yaml_readers_error(tmp_path: Path) -> None:
    """One wording for both readers: the file, the key, where, and what is allowed."""
    j, y = tmp_path / "c.json", tmp_path / "c.yaml"
    j.write_text('{"model": "a",\n"model": "b"}')
    y.write_text("model: a\nmodel: b\n")
    assert said(read_json, j, "x").problem == f"{j} sets 'model' twice (line 1, then line 2)"
    assert said(read_yaml, y, "x").problem == f"{y} sets 'model' twice (line 1, then line 2)"


def test_a_json_key_in_two_objects_is_no_key_given_twice(tmp_path: Path) -> None:
    p = tmp_path / "ok.json"
    p.write_text('{"a": {"tp": 1}, "b": {"tp": 2}, "c": [{"tp": 1}, {"tp": 1}]}')
    assert read_json(p, "x") == {"a": {"tp": 1}, "b": {"tp": 2}, "c": [{"tp": 1}, {"tp": 1}]}


# ---- missing and empty paths ----

def test_a_missing_file_says_what_is_allowed(tmp_path: Path) -> None:
    e = said(existing_file, tmp_path / "nope.yaml", "--config")
    assert str(e) == f"--config: no file at {tmp_path / 'nope.yaml'} (allowed: an existing file)"


def test_a_dangling_link_says_what_is_allowed(tmp_path: Path) -> None:
    (tmp_path / "l.yaml").symlink_to(tmp_path / "gone.yaml")
    assert said(existing_file, tmp_path / "l.yaml", "--config").allowed == "an existing file"


@pytest.mark.parametrize("path", ["examples/llama-3.1-8b-ppo.yaml", "./examples/x/y.yaml"])
def test_a_missing_example_says_how_to_get_the_examples(tmp_path: Path, monkeypatch,
                                                        path: str) -> None:
    """The README's quick start names examples/...; an installed nereus has no such folder."""
    monkeypatch.chdir(tmp_path)
    e = said(existing_file, Path(path), "--config")
    assert e.problem == (f"no file at {Path(path)}; `nereus examples` copies the shipped "
                         "examples into ./examples"), e.problem
    assert e.allowed == "an existing file"


def test_a_missing_file_elsewhere_gets_no_examples_hint(tmp_path: Path) -> None:
    assert "nereus examples" not in str(said(existing_file, tmp_path / "examples/x.yaml", "c"))
    assert "nereus examples" not in str(said(existing_file, Path("my-examples/x.yaml"), "c"))


@pytest.mark.parametrize("path, problem", [
    ("", "the path is empty"),
    (Path(""), "the path is empty or '.' (the working folder)"),  # what typer makes of ''
])
def test_an_empty_path_is_said_to_be_empty(path, problem: str) -> None:
    """`--config ''` said '. is a directory'."""
    e = said(existing_file, path, "--config")
    assert (e.problem, e.allowed) == (problem, "a file path")


# ---- files that do not parse, or hold the wrong thing ----

def test_a_file_that_does_not_parse_says_what_is_allowed(tmp_path: Path) -> None:
    y, j = tmp_path / "j.yaml", tmp_path / "c.json"
    y.write_text("a: [1, 2\nb: 3\n")
    j.write_text("{'a': 1}")
    e = said(read_yaml, y, "--config")
    assert e.problem.startswith(f"{y} is not valid YAML (") and \
        e.allowed == "a YAML mapping of fields"
    e = said(read_json, j, "--model")
    assert e.problem.startswith(f"{j} is not valid JSON (") and e.allowed == "a JSON object"


def test_a_config_json_that_holds_no_object_says_what_is_allowed(tmp_path: Path) -> None:
    from nereus.spec.model import ModelSpec

    p = tmp_path / "config.json"
    p.write_text("[1, 2]")
    e = said(ModelSpec.from_hf_config, p)
    assert e.problem == f"{p} must hold a JSON object" and "a JSON object" in (e.allowed or "")


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    tp: int = 1


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a model preset or a config.json")
    count: int = 0
    stages: list[_Inner] = []
    job: dict[str, object] = Field({}, description="a job as nereus plan --config reads it")
    notes: dict[str, str] = {}


def _validated(data: dict) -> InputError:
    return said(validate, _Outer, data)


def test_a_missing_field_says_what_it_takes() -> None:
    assert str(_validated({})) == ("model: required field is missing (allowed: a model "
                                   "preset or a config.json)")
    assert str(_validated({"model": "m", "stages": [{"tp": 2}]})) == (
        "stages.0.name: required field is missing (allowed: text)")


def test_a_free_form_section_that_is_no_mapping_says_what_is_allowed() -> None:
    assert str(_validated({"model": "m", "job": [1]})) == (
        "job: must be a mapping of fields (allowed: a job as nereus plan --config reads it)")
    assert str(_validated({"model": "m", "notes": "x"})) == (
        "notes: must be a mapping of fields (allowed: a mapping of name: value pairs)")


def test_a_validators_allowed_is_the_errors_allowed() -> None:
    """A field validator says what is allowed as '(allowed: ...)' in its message: the error
    keeps it as its allowed, not as part of the problem."""
    from nereus.sim.scenarios import _Congestion

    e = said(validate, _Congestion, {"length": [120, 40]}, "drift.congestion", "drift.congestion.")
    assert e.field == "drift.congestion.length"
    assert e.problem == "shortest 120 > longest 40"
    assert e.allowed == "[shortest, longest] steps, shortest <= longest"


# ---- repeated GPU ids in an availability trace ----

@pytest.mark.parametrize("ids, twice", [("0-15 15", "device id 15"), ("0 0 1 2", "device id 0"),
                                        ("0-7 4-11", "device ids 4-7")])
def test_repeated_gpu_ids_in_a_pool_are_refused(ids: str, twice: str) -> None:
    """'0 0 1 2' became 3 GPUs, silently; a job's gpus: [0, 1, 1] is refused."""
    e = said(parse_ids, ids, "availability row 2.gpus")
    assert e.problem == f"{twice} listed more than once"
    assert e.allowed is not None and e.allowed.startswith("distinct device ids")


def test_repeated_gpu_ids_name_the_trace_file_row_and_column(tmp_path: Path) -> None:
    p = tmp_path / "pool.csv"
    p.write_text("time_s,gpus\n0,0-15\n600,0 0 1 2\n")
    e = said(load_availability, p)
    assert str(e).startswith(f"availability ({p}) row 3.gpus: device id 0 listed more "
                             "than once (allowed: distinct device ids"), str(e)


def test_distinct_gpu_ids_in_a_pool_are_read() -> None:
    assert parse_ids("0-7 8-15") == tuple(range(16))
    assert parse_ids("3 1 2") == (1, 2, 3)
