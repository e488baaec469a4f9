"""``--help`` of every command: the defaults it states are shown (Rich markup ate them)."""

import re

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()


def help_text(*command: str) -> str:
    r = runner.invoke(app, [*command, "--help"])
    assert r.exit_code == 0, r.output
    flat = re.sub(r"[│╭╮╰╯─]", " ", r.output)  # the option box, wrapped lines joined
    return " ".join(flat.split())


@pytest.mark.parametrize("command,says", [
    ("plan", "ppo, grpo or remax [default: ppo]"),
    ("plan", "sync or async [default: sync]"),
    ("plan", "[default: h100-sxm-80gb]"),
    ("plan", "mean response length (tokens) [default: 2048]"),
    ("plan", "prompts per RL step [default: 512]"),
    ("plan", "[default: the mean response length]"),
    ("plan", "Exit 2 for bad input, a job that no plan fits included."),
    ("transition", "ppo, grpo or remax [default: ppo]"),
    ("transition", "[default: h100-sxm-80gb]"),
    ("transition", "(.png, .pdf or .svg)"),
    ("plan", "benchmarks/engine.py --profile OUT.json measures one"),
    ("transition", "benchmarks/engine.py --profile OUT.json measures one"),
    ("simulate", "drift [default: default]"),
    ("simulate", "[default: 0]"),
    ("simulate", "[default: the scenario's; 0.5 in the built-in ones]"),
    ("simulate", "(.png, .pdf or .svg)"),
    ("simulate", "Exit 2 for bad input"),
])
def test_help_states_the_defaults(command: str, says: str) -> None:
    assert says in help_text(command)


@pytest.mark.parametrize("command,flags", [
    ((), ["--help"]),
    (("plan",), ["--explain", "--spread", "--json", "--help"]),
    (("transition",), ["--json", "--execute", "--help"]),
    (("simulate",), ["--json", "--notes", "--log", "--help"]),
])
def test_flags_show_no_value_type(command: tuple[str, ...], flags: list[str]) -> None:
    """Newer typers printed '<bool>' beside every flag, as if '--json' took a value."""
    text = help_text(*command)
    assert "<bool>" not in text and "BOOLEAN" not in text, text
    for flag in flags:
        assert re.search(rf"{flag} (?!<)", text), (flag, text)
    if command:  # options that take a value still say what kind
        assert "<path>" in text or "OUT.png" in text
