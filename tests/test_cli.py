"""The command line as a whole: usage errors are one line like every other bad input."""

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args,says", [
    (["plan", "--model", "llama-3.1-8b", "--gpus", "abc"], "Invalid value for '--gpus'"),
    (["simulate", "--steps", "abc"], "Invalid value for '--steps'"),
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
