"""Bad input a user plausibly types: one line naming the field or option and what is allowed,
exit 2; a job no plan fits: one line, exit 3. Conflicting options are refused, not ignored."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
CONFIG = "examples/llama-3.1-8b-ppo.yaml"


def one_line(args: list[str], code: int = 2) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == code, (args, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    return r.stderr


def test_a_misspelt_top_level_field_is_named_not_reported_as_missing_gpus(tmp_path: Path
                                                                         ) -> None:
    data = yaml.safe_load(Path(CONFIG).read_text())
    data["gpu"] = data.pop("gpus")
    cfg = tmp_path / "typo.yaml"
    cfg.write_text(yaml.safe_dump(data))
    err = one_line(["plan", "--config", str(cfg)])
    assert err.startswith("error: gpu: unknown field (allowed: ") and "gpus" in err, err


def test_a_plan_json_given_as_config_names_its_first_field(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(runner.invoke(app, ["plan", "--config", CONFIG, "--json"]).stdout)
    err = one_line(["plan", "--config", str(plan)])
    assert err.startswith("error: step_latency_s: unknown field"), err


@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama-3.1-8b", "--gpus", "3"],
    ["plan", "--model", "llama-3.3-70b", "--gpus", "2"],
])
def test_a_job_no_plan_fits_is_one_line_exit_2(args: list[str]) -> None:
    err = one_line(args, 2)
    assert "fit" in err


@pytest.mark.parametrize("args,option", [
    (["plan", "--config", CONFIG, "--frontier", "actor_train", "--evaluate",
      "examples/layouts/verl-colocated-8b.yaml"], "--evaluate"),
    (["plan", "--config", CONFIG, "--frontier", "actor_train", "--explain"], "--explain"),
    (["plan", "--config", CONFIG, "--json", "--explain"], "--explain"),
    (["simulate", "--steps", "2", "--json", "--log"], "--log"),
    (["simulate", "--steps", "2", "--json", "--notes"], "--notes"),
])
def test_options_that_would_be_ignored_are_refused(args: list[str], option: str) -> None:
    err = one_line(args)
    assert err.startswith(f"error: {option}: cannot be combined with "), err
    assert "(allowed: " in err


def test_a_job_yaml_given_to_simulate_says_it_is_not_a_scenario() -> None:
    err = one_line(["simulate", "--config", CONFIG])
    assert err.startswith("error: --config: llama-3.1-8b-ppo.yaml is a job file"), err
    assert "examples/scenarios/" in err


@pytest.mark.parametrize("option", ["--csv", "--plot"])
def test_simulate_refuses_an_unwritable_output_before_the_run(option: str) -> None:
    out = "/proc/nereus-out" + (".csv" if option == "--csv" else ".png")
    r = runner.invoke(app, ["simulate", "--steps", "2", option, out])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""  # nothing simulated, nothing printed
    assert r.stderr.startswith(f"error: {option}: cannot write {out}"), r.stderr
