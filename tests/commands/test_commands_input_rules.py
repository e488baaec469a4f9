"""The input rules a fuzzing run found broken, end to end: each bad input is refused in one
line that says what is allowed (exit 2), and nothing is printed before that line."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()


def one_line(args: list[str], allowed: bool = True) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    assert "Traceback" not in r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    assert "(allowed: " in r.stderr or not allowed, r.stderr
    return r.stderr.strip()


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("plans") / "a.json"
    r = runner.invoke(app, ["plan", "--model", "tiny-llama", "--device", "cpu", "--gpus", "4",
                            "--json"])
    assert r.exit_code == 0, r.output
    p.write_text(r.stdout)
    return p


# ---- a JSON key given twice ----

def test_a_plan_that_sets_a_key_twice_is_refused(plan_json: Path, tmp_path: Path) -> None:
    """`transition a.json dup.json` used the later value, silently."""
    dup = tmp_path / "dup.json"
    dup.write_text(plan_json.read_text().replace('"planned_for": {',
                                                 '"planned_for": {"model": "tiny-llama", ', 1))
    err = one_line(["transition", str(plan_json), str(dup)])
    assert err == (f"error: target: {dup} sets 'model' twice in planned_for (allowed: each "
                   "key once per object)"), err


def test_a_config_json_that_sets_a_key_twice_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text('{"hidden_size": 64, "intermediate_size": 160,\n"num_hidden_layers": 4,\n'
                   '"num_attention_heads": 4, "vocab_size": 256,\n"num_hidden_layers": 2}\n')
    err = one_line(["plan", "--model", str(cfg), "--device", "cpu", "--gpus", "4"])
    assert err.startswith(f"error: --model: {cfg} sets 'num_hidden_layers' twice (line 2, then "
                          "line 4)"), err


# ---- simulate's options ----

@pytest.mark.parametrize("args", [["--scenario", ""], ["--scenario", "", "--notes"],
                                  ["--scenario", " "]])
def test_an_empty_scenario_name_is_unknown(args: list[str]) -> None:
    """`--scenario ''` ran the default scenario."""
    err = one_line(["simulate", *args, "--steps", "2"])
    assert err.startswith(f"error: --scenario: unknown scenario {args[1]!r} (allowed: default, "
                          ), err


@pytest.mark.parametrize("args, line", [
    (["--steps", "0"], "--steps: must be >= 1, got 0 (allowed: an integer >= 1)"),
    (["--seed", "-1"], "--seed: must be >= 0, got -1 (allowed: an integer >= 0)"),
    (["--gamma", "2"], "--gamma: must be in [0, 1], got 2.0 (allowed: a number in [0, 1])"),
    (["--gamma", "nan"], "--gamma: must be in [0, 1], got nan (allowed: a number in [0, 1])"),
])
def test_a_simulate_option_out_of_range_says_what_is_allowed(args: list[str],
                                                             line: str) -> None:
    assert one_line(["simulate", *args]) == f"error: {line}"


@pytest.mark.parametrize("option, value", [("--scenario", "churn"), ("--seed", "3")])
def test_an_option_the_scenario_file_sets_says_what_is_allowed(option: str, value: str,
                                                               tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("job: {model: tiny-llama, gpus: 4, cluster: {device: cpu}}\n")
    err = one_line(["simulate", "--config", str(cfg), option, value])
    assert err.startswith(f"error: {option}: cannot be combined with --config ("), err


def _scenario(tmp_path: Path, pool: str, lengths_rows: int = 3) -> Path:
    (tmp_path / "pool.csv").write_text("time_s,gpus\n" + pool)
    (tmp_path / "lengths.csv").write_text("step,response_len_mean,response_len_max\n" + "".join(
        f"{k},500,700\n" for k in range(lengths_rows)))
    cfg = tmp_path / "s.yaml"
    cfg.write_text("job: {model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: 8}}\n"
                   "lengths: {csv: lengths.csv}\navailability: {csv: pool.csv}\n")
    return cfg


def test_no_note_is_printed_before_an_error(tmp_path: Path) -> None:
    """'note: --steps 3 is more than the scenario's 2 steps' came before the error line."""
    cfg = _scenario(tmp_path, "0,1\n", lengths_rows=2)
    err = one_line(["simulate", "--config", str(cfg), "--steps", "3"], allowed=False)
    assert "no plan fits" in err, err


def test_the_note_on_too_many_steps_still_comes_on_a_run(tmp_path: Path) -> None:
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "400",
                            "--policies", "static"])
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith("note: --steps 400 is more than the scenario's 300 steps"), \
        r.stderr


def test_repeated_gpu_ids_in_a_pool_file_are_refused(tmp_path: Path) -> None:
    """'0-15 15' was read as 16 GPUs and '0 0 1 2' as 3, silently."""
    err = one_line(["simulate", "--config", str(_scenario(tmp_path, "0,0-15 15\n"))])
    pool = tmp_path / "pool.csv"  # the path the scenario names, from the scenario's folder
    assert err.startswith(f"error: availability ({pool}) row 2.gpus: device id 15 listed "
                          "more than once (allowed: distinct device ids"), err


def test_a_pool_file_without_gpus_names_the_file(tmp_path: Path) -> None:
    err = one_line(["simulate", "--config", str(_scenario(tmp_path, "0,0\n"))])
    assert err == (f"error: availability ({tmp_path / 'pool.csv'}): the trace never gives a "
                   "GPU (allowed: at "
                   "least one row with GPUs)"), err


def test_a_congestion_of_shortest_above_longest_says_what_is_allowed(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("job: {model: tiny-llama, gpus: 4, cluster: {device: cpu}}\n"
                   "drift: {congestion: {length: [120, 40]}}\n")
    assert one_line(["simulate", "--config", str(cfg)]) == (
        "error: drift.congestion.length: shortest 120 > longest 40 (allowed: [shortest, "
        "longest] steps, shortest <= longest)")


@pytest.mark.parametrize("section", ["job: [1, 2]", "job: h100", "notes: [a]"])
def test_a_free_form_section_that_is_no_mapping_says_what_is_allowed(section: str,
                                                                     tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(section + "\n" + ("" if section.startswith("job") else
                                     "job: {model: tiny-llama, gpus: 4}\n"))
    err = one_line(["simulate", "--config", str(cfg)])
    assert "must be a mapping of fields (allowed: " in err, err


def test_a_scenario_without_a_job_says_what_the_job_is(tmp_path: Path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text("steps: 3\n")
    err = one_line(["simulate", "--config", str(cfg)])
    assert err.startswith("error: job: required field is missing (allowed: "), err


# ---- files that are missing, empty paths ----

@pytest.mark.parametrize("args, field", [
    (["plan", "--config", ""], "--config"),
    (["simulate", "--config", ""], "--config"),
    (["transition", "", "b.json"], "current"),
])
def test_an_empty_path_is_no_directory(args: list[str], field: str) -> None:
    """It said '. is a directory'."""
    assert one_line(args) == (f"error: {field}: the path is empty or '.' (the working folder) "
                              "(allowed: a file path)")


def test_a_missing_example_says_how_to_get_the_examples(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's quick start names examples/... paths, which a wheel user lacks."""
    monkeypatch.chdir(tmp_path)
    err = one_line(["plan", "--config", "examples/llama-3.1-8b-ppo.yaml"])
    assert err == ("error: --config: no file at examples/llama-3.1-8b-ppo.yaml; `nereus "
                   "examples` copies the shipped examples into ./examples (allowed: an "
                   "existing file)"), err


def test_a_missing_file_says_what_is_allowed(tmp_path: Path) -> None:
    err = one_line(["simulate", "--config", str(tmp_path / "nope.yaml")])
    assert err == (f"error: --config: no file at {tmp_path / 'nope.yaml'} (allowed: an "
                   "existing file)")


# ---- a plan record at odds with itself ----

@pytest.mark.parametrize("key, value", [("model", "llama-3.1-8b"),
                                        ("architecture", "80 layers")])
def test_a_record_whose_names_contradict_its_job_is_refused(plan_json: Path, tmp_path: Path,
                                                            key: str, value: str) -> None:
    """planned_for.model said another model than planned_for.job.model, and transition
    priced the move as the job's (the architectures matched)."""
    data = json.loads(plan_json.read_text())
    data["planned_for"][key] = value
    edited = tmp_path / "t.json"
    edited.write_text(json.dumps(data))
    err = one_line(["transition", str(plan_json), str(edited)])
    assert err.startswith(f"error: target.planned_for.{key}: t.json records {value!r}, but "
                          "its planned_for.job says "), err


def test_an_empty_output_path_is_said_so() -> None:
    """`--csv ''` (an unset shell variable) said '. is a directory'."""
    err = one_line(["simulate", "--steps", "2", "--csv", ""])
    assert err == ("error: --csv: the path is empty or '.' (the working folder) (allowed: a "
                   "file path ending in .csv)")


def test_a_model_stage_given_twice_in_a_plan_says_what_is_allowed(plan_json: Path,
                                                                   tmp_path: Path) -> None:
    data = json.loads(plan_json.read_text())
    data["stages"].append(dict(data["stages"][0]))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(data))
    err = one_line(["transition", str(plan_json), str(twice)])
    assert "listed twice" in err and err.endswith("(allowed: each model-stage once)"), err
