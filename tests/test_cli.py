"""The command line as a whole: usage errors are one line like every other bad input."""

import itertools
import re

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args,says", [
    (["plan", "-c"], "Option '-c' requires an argument"),
    (["transition"], "Missing argument"),
    (["plan", "--bogus"], "No such option: --bogus"),
    (["bogus"], "No such command 'bogus'"),
])
def test_usage_errors_are_one_line_with_exit_2(args, says):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.output
    assert "--help" in lines[0]


@pytest.mark.parametrize("args,where", [
    (["plan", "--config"], "nereus plan"),
    (["plan", "-c"], "nereus plan"),
    (["plan", "--json=yes"], "nereus plan"),
    (["plan", "--bogus"], "nereus plan"),
    (["simulate", "--steps"], "nereus simulate"),
    (["transition", "--model"], "nereus transition"),
    (["bogus"], "nereus"),
])
def test_a_usage_error_points_to_the_help_of_the_command_typed(args, where):
    """`nereus plan --config` (no value) pointed to 'nereus --help', which does not list
    plan's options: click raises a missing value without the command's context."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.rstrip().endswith(f"(see '{where} --help')"), r.output


def test_help_still_works():
    r = runner.invoke(app, ["plan", "--help"])
    assert r.exit_code == 0 and "Usage: nereus plan" in r.output


def test_version_prints_the_installed_version():
    from importlib.metadata import version

    import nereus
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"nereus {nereus.__version__}"
    assert version("nereus") == nereus.__version__     # pyproject reads the same one


def _help(command: str, width: int) -> str:
    r = runner.invoke(app, [command, "--help"], env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    return r.output


def _flat_help(command: str) -> str:
    """The help as one line: the option boxes' borders and the wrapping gone."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", _help(command, 120)).split())


@pytest.mark.parametrize("command,usage", [
    ("transition", "Usage: nereus transition [OPTIONS] CURRENT TARGET"),
    ("examples", "Usage: nereus examples [OPTIONS] [DEST]"),
])
def test_the_usage_line_names_arguments_as_click_does(command: str, usage: str) -> None:
    """Typer 0.2x wrote a required argument in braces, `{CURRENT} {TARGET}`, which read as
    a set of values to choose from."""
    out = _help(command, 120)
    assert usage in out and "{" not in out.split("\n\n")[0], out


@pytest.mark.parametrize("command", ["plan", "transition", "simulate", "examples"])
@pytest.mark.parametrize("width", [80, 120])
def test_help_paragraphs_wrap_at_the_terminals_width(command: str, width: int) -> None:
    """The transition docstring, wrapped at 92 columns, rendered at 80 as a line of 80 and a
    line of one word ('the', 'taken', 'Files'), by turns."""
    text = _help(command, width).split("╭")[0]  # the description, above the option boxes
    for paragraph in re.split(r"\n[ \t]*\n", text):
        lines = [ln.rstrip() for ln in paragraph.splitlines() if ln.strip()]
        for line, after in itertools.pairwise(lines):
            # a line is broken early only where the next word would not have fitted
            assert len(line) + 1 + len(after.split()[0]) > width - 2, (line, after)


def test_transition_json_help_names_every_key_it_prints(tmp_path) -> None:
    """--json's help listed estimated_s, feasible and primitives; the object also has source
    and loads_on_first_read, and each primitive says whether it is staged."""
    import json

    plans = []
    for gpus in (2, 4):
        r = runner.invoke(app, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus",
                                str(gpus), "--json"])
        assert r.exit_code == 0, r.output
        plans.append(tmp_path / f"p{gpus}.json")
        plans[-1].write_text(r.stdout)
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "tiny-llama",
                            "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["primitives"], out
    flat = _flat_help("transition")
    start = flat.index("--json print one JSON object")
    said = flat[start:flat.index("--execute", start)]
    for key in [*out, *out["primitives"][0]]:
        assert key in said, (key, said)


def test_evaluate_help_names_every_layout_field() -> None:
    """--evaluate's help said only 'YAML of tp/pp/dp per model-stage': a layout can place
    its replicas (gpus) and set micro_batch, grad_accum and recompute too."""
    from nereus.plan.evaluate import _LayoutStage

    flat = _flat_help("plan")
    start = flat.index("--evaluate PLAN")
    said = flat[start:flat.index("--profile", start)]
    # name: a plan JSON's list form; latency_s, peak_mem_bytes: a plan JSON's, recomputed
    for key in set(_LayoutStage.model_fields) - {"name", "latency_s", "peak_mem_bytes"}:
        assert key in said, (key, said)
    assert "one list of tp x pp GPU ids per DP replica" in said


@pytest.mark.parametrize("dest", ["", "  "])
def test_examples_refuses_an_empty_destination(tmp_path, monkeypatch, dest: str) -> None:
    """`nereus examples ""` (an unset variable) copied every example into the working
    folder: Path("") is '.'."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["examples", dest])
    assert r.exit_code == 2, r.output
    assert r.stderr == ("error: DEST: empty (allowed: a folder path, new or existing; . for "
                        "the working folder)\n"), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_examples_counts_one_file_as_one(tmp_path, monkeypatch) -> None:
    from nereus.commands import examples

    one = dict(list(examples.shipped().items())[:1])
    monkeypatch.setattr(examples, "shipped", lambda: one)
    r = runner.invoke(app, ["examples", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert f"wrote 1 file under {tmp_path / 'out'}:" in r.stdout, r.stdout


def test_ctrl_c_while_the_command_imports_is_one_line(monkeypatch, capsys):
    """The console script imports the command's modules for a second or two; a Ctrl-C then
    printed a 35-line traceback, and the shell saw a kill by SIGINT instead of exit 130."""
    import sys
    import types

    from nereus.__main__ import main

    class Interrupted(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            raise KeyboardInterrupt  # as if it came while the module was read

    monkeypatch.setitem(sys.modules, "nereus.cli", Interrupted("nereus.cli"))
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def test_the_console_script_runs_the_command(monkeypatch, capsys):
    from nereus.__main__ import main

    monkeypatch.setattr("sys.argv", ["nereus", "--version"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and capsys.readouterr().out.strip()


def test_text_to_a_pipe_is_not_broken_mid_sentence(capsys):
    """Piped, lines were hard-wrapped at 160 columns: a saved log no longer grepped."""
    from nereus.commands.common import console, err_console

    line = " ".join(f"word{i}" for i in range(60))  # about 400 characters
    console.print(line)
    err_console.print(line)
    out, err = capsys.readouterr()
    assert out == err == line + "\n"
