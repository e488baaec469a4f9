"""``nereus simulate`` end to end through Typer."""

import csv
import json

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.sim import traces as T

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, ["simulate", *args])


def test_json_output_has_the_exact_shape():
    r = _run("--scenario", "stationary", "--steps", "12", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["scenario"] == "stationary" and out["source"] == "simulated"
    assert list(out["policies"]) == ["static", "replan_always", "nereus", "oracle"]
    assert set(out["policies"]["nereus"]) == {"tokens_per_s", "transitions", "transition_s",
                                             "restarts"}


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
             "--policies", "static,nereus", "--notes")
    assert r.exit_code == 0, r.output
    assert "mine" in r.output and "simulated" in r.output and "a made-up loss" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(rows) as f:
        got = list(csv.DictReader(f))
    assert {g["policy"] for g in got} == {"static", "nereus"} and len(got) == 28
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
