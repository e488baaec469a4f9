"""``nereus simulate`` end to end through Typer."""

import csv
import json

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.sim import traces as T

runner = CliRunner()


EXTRA = {"mean_step_s", "restart_s", "lost_s", "paused_s", "checkpoint_s",
         "calib_error_at_step_10"}


def _run(*args):
    return runner.invoke(app, ["simulate", *args])


def test_json_output_has_the_exact_shape():
    r = _run("--scenario", "stationary", "--steps", "12", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["scenario"] == "stationary" and out["source"] == "simulated"
    assert list(out["policies"]) == ["static", "replan_always", "nereus", "oracle"]
    # the four numbers, then what the table prints beside them
    assert set(out["policies"]["nereus"]) == {"tokens_per_s", "transitions", "transition_s",
                                             "restarts"} | EXTRA


def test_static_verl_runs_when_named_and_the_error_lists_it():
    r = _run("--scenario", "stationary", "--steps", "3", "--policies", "static,static_verl",
             "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(out["policies"]) == ["static", "static_verl"]
    bad = _run("--policies", "verl")
    assert bad.exit_code == 2 and "static_verl" in bad.output


@pytest.mark.parametrize("args, field", [
    (["--scenario", "nope"], "--scenario"),
    (["--policies", "static,best"], "--policies"),
    (["--gamma", "2"], "--gamma"),
    (["--plot", "out.gif"], "--plot"),
    (["--config", "/nonexistent.yaml"], "--config"),
    (["--steps", "0"], "--steps"),
])
def test_bad_input_is_one_line_and_exit_2(args, field):
    r = _run(*args)
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}")


def test_config_with_trace_files_plot_and_csv(tmp_path):
    T.save_lengths(T.growth(14, 1000, 1400, seed=2), tmp_path / "len.csv")
    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,16\n300,0-7\n")
    (tmp_path / "drift.csv").write_text("start_step,end_step,op_class,factor\n"
                                        "3,8,allreduce.inter,0.5\n")
    (tmp_path / "run.yaml").write_text(
        "name: mine\n"
        "job: {model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: 8}}\n"
        "lengths: {csv: len.csv}\n"
        "availability: {csv: pool.csv}\n"
        "drift: {csv: drift.csv}\n"
        "hidden_efficiency: {gemm: 0.5}\n"
        "restart: {startup_s: 60}\n"
        "notes: {availability: 'a made-up loss'}\n")
    png, rows = tmp_path / "out.png", tmp_path / "rows.csv"
    r = _run("--config", str(tmp_path / "run.yaml"), "--plot", str(png), "--csv", str(rows),
             "--policies", "static,nereus")
    assert r.exit_code == 0, r.output
    assert "mine" in r.output and "simulated" in r.output
    notes = _run("--config", str(tmp_path / "run.yaml"), "--notes")
    assert notes.exit_code == 0 and "a made-up loss" in notes.output, notes.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(rows) as f:
        got = list(csv.DictReader(f))
    assert {g["policy"] for g in got} == {"static", "nereus"} and len(got) == 28
    assert {g["source"] for g in got} == {"simulated"}
    static = [g for g in got if g["policy"] == "static"]
    assert int(static[-1]["plan_gpus"]) <= 8


def test_config_errors_name_the_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("job: {model: llama-3.1-8b, gpus: 16}\nlengths: {growht: {}}\n")
    r = _run("--config", str(p))
    assert r.exit_code == 2 and "lengths.growht" in r.output
    p.write_text("job: {model: llama-3.1-8b, gpus: 16}\n"
                 "lengths: {growth: {}, stationary: {}}\n")
    r = _run("--config", str(p))
    assert r.exit_code == 2 and r.output.startswith("error: lengths")
    p.write_text("job: {model: llama-3.1-8b, gpus: 16}\nhidden_efficiency: {flops: 0.5}\n")
    r = _run("--config", str(p))
    assert r.exit_code == 2 and "hidden_efficiency.flops" in r.output


_JOB = "job: {model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: 8}}\n"


@pytest.mark.parametrize("body, field", [
    ("drift: {congestion: {length: [120, 40]}}", "drift.congestion.length"),
    ("seed: -1", "seed"),
    ("lengths: {csv: inf.csv}", "lengths row 2"),
    ("lengths: {csv: nan.csv}", "lengths row 2"),
    ("noise: 1e308", "noise"),
    ("noise: .nan", "noise"),
    ("lengths: {growth: {max_ratio: .inf}}", "lengths.growth.max_ratio"),
    ("lengths: {growth: {max_ratio: 1e308}}", "lengths.growth.max_ratio"),
    ("hidden_efficiency: {gemm: 5}", "hidden_efficiency.gemm"),
    ("hidden_efficiency: {gemm: .inf}", "hidden_efficiency.gemm"),
    ("restart: {startup_s: .inf}", "restart.startup_s"),
    ("control: {delta_len: .nan}", "control.delta_len"),
    ("steps: 100000000", "steps"),
])
def test_bad_yaml_values_are_one_line_naming_the_field(tmp_path, body, field):
    (tmp_path / "inf.csv").write_text("step,response_len_mean,response_len_max\n0,100,inf\n")
    (tmp_path / "nan.csv").write_text("step,response_len_mean,response_len_max\n0,100,nan\n")
    p = tmp_path / "bad.yaml"
    p.write_text(_JOB + body + "\n")
    r = _run("--config", str(p), "--policies", "static")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, field", [
    (["--seed", "-1"], "--seed"),
    (["--seed", "0"], "--seed"),            # with --config: the file's seed would win
    (["--scenario", "drift"], "--scenario"),
])
def test_options_config_ignores_or_bad_seed_are_refused(tmp_path, args, field):
    p = tmp_path / "ok.yaml"
    p.write_text(_JOB + "steps: 3\n")
    r = _run("--config", str(p), *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), r.output
    assert "Traceback" not in r.output


def test_negative_seed_on_a_builtin_scenario_is_one_line():
    r = _run("--seed", "-1", "--steps", "2")
    assert r.exit_code == 2 and r.output.strip() == ("error: --seed: must be >= 0, got -1 "
                                                     "(allowed: an integer >= 0)")


@pytest.mark.parametrize("pool, problem", [
    ("0,0\n", "never gives a GPU"),
    ("0,1\n", "no plan fits the largest pool"),
])
def test_errors_building_the_simulator_are_one_line(tmp_path, pool, problem):
    """Found while the simulator is built (before any step runs): nothing is printed first."""
    (tmp_path / "pool.csv").write_text("time_s,gpus\n" + pool)
    (tmp_path / "run.yaml").write_text(
        "job: {model: llama-3.1-8b, gpus: 16, cluster: {devices_per_node: 8}}\n"
        "steps: 3\n"
        "availability: {csv: pool.csv}\n")
    r = _run("--config", str(tmp_path / "run.yaml"))
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and problem in lines[0], r.output


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_scenario_says_it_is_empty(tmp_path, text):
    """It said "must be a mapping of fields", and named no file."""
    p = tmp_path / "empty.yaml"
    p.write_text(text)
    r = _run("--config", str(p))
    assert r.exit_code == 2, r.output
    assert r.output.strip() == (f"error: --config: {p} is empty (allowed: a scenario YAML "
                                "(nereus examples writes two, under scenarios/))"), r.output


@pytest.mark.parametrize("gpus, availability, field", [
    (3, "", "job.gpus"),                              # the whole job fits no plan
    (16, "availability: {csv: pool.csv}\n", "availability"),  # the trace never gives 16
])
def test_no_plan_on_the_largest_pool_names_the_field_to_change(tmp_path, gpus, availability,
                                                                field):
    """It said ``scenario:``, a field the file does not have, where ``job.gpus`` was too few
    (or the trace never gave the job enough of them)."""
    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,1\n")
    (tmp_path / "run.yaml").write_text(
        f"job: {{model: llama-3.1-8b, gpus: {gpus}, cluster: {{devices_per_node: 8}}}}\n"
        "steps: 3\n" + availability)
    r = _run("--config", str(tmp_path / "run.yaml"), "--policies", "static")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: no plan fits"), r.output
    assert "(allowed: " in lines[0]


@pytest.mark.parametrize("trace, text, problem", [
    ("lengths", "step,response_len_mena,response_len_max\n0,500,700\n",
     "lengths: {csv} has an unknown column 'response_len_mena' in its header"),
    ("availability", "time_s,gpus\n0,16\n300,8,12\n",
     "availability row 3: 3 fields in {csv}"),
], ids=["misspelt-header", "stray-field"])
def test_a_trace_file_with_a_column_it_does_not_read_is_one_line_and_exit_2(tmp_path, trace,
                                                                             text, problem):
    """It ran: the misspelt column was only reported as the one it replaced, and the stray
    field dropped (``300,8,12`` read as 8 GPUs)."""
    (tmp_path / "trace.csv").write_text(text)
    problem = problem.format(csv=tmp_path / "trace.csv")  # resolved beside run.yaml
    (tmp_path / "run.yaml").write_text(_JOB + f"{trace}: {{csv: trace.csv}}\nsteps: 3\n")
    r = _run("--config", str(tmp_path / "run.yaml"), "--policies", "static")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {problem}"), r.output
    assert "allowed:" in lines[0] and "Traceback" not in r.output
