"""``nereus transition``: which job file is wrong, why it is infeasible in --json, sizes of a
tiny model, and --execute with nothing to move."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
TINY = ["--model", "tiny-llama", "--device", "cpu"]


def stage(name: str, tp: int, pp: int, replicas: list[list[int]]) -> dict:
    return {"name": name, "tp": tp, "pp": pp, "dp": len(replicas), "gpus": replicas}


def plan_file(tmp: Path, name: str, stages: list[dict]) -> str:
    p = tmp / name
    p.write_text(json.dumps({"stages": stages}))
    return str(p)


@pytest.fixture()
def tiny_plans(tmp_path: Path) -> tuple[str, str]:
    paths = []
    for gpus in (2, 4):
        r = runner.invoke(app, ["plan", *TINY, "--gpus", str(gpus), "--json"])
        assert r.exit_code == 0, r.output
        p = tmp_path / f"tiny{gpus}.json"
        p.write_text(r.stdout)
        paths.append(str(p))
    return paths[0], paths[1]


def test_a_bad_job_spec_names_which_file(tmp_path: Path) -> None:
    lay = tmp_path / "layout.yaml"  # a --evaluate layout, not a job spec
    lay.write_text("actor_gen: {tp: 1, pp: 1, dp: 2}\n")
    good = "examples/llama-3.1-8b-ppo.yaml"
    for args, which in (([str(lay), good], "current"), ([good, str(lay)], "target")):
        r = runner.invoke(app, ["transition", *args])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: {which}.model: required field is missing"), r.stderr


def test_infeasible_json_carries_the_reason(tmp_path: Path) -> None:
    # two frozen models swap their GPUs, each filling them: no memory-safe order exists
    cur = plan_file(tmp_path, "a.json", [stage("reference_infer", 1, 4, [[0, 1, 2, 3]]),
                                         stage("reward_infer", 1, 4, [[4, 5, 6, 7]])])
    tgt = plan_file(tmp_path, "b.json", [stage("reference_infer", 1, 4, [[4, 5, 6, 7]]),
                                         stage("reward_infer", 1, 4, [[0, 1, 2, 3]])])
    r = runner.invoke(app, ["transition", cur, tgt, "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 3, r.output
    out = json.loads(r.stdout)
    assert out["feasible"] is False and "GPU" in out["reason"]
    assert out["reason"] in r.stderr


def test_a_tiny_models_sizes_are_in_mib(tiny_plans: tuple[str, str]) -> None:
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY])
    assert r.exit_code == 0, r.output
    assert "0.00 GiB" not in r.stdout and " MiB" in r.stdout
    assert "peak memory 0.0 GiB" not in r.stdout


def test_execute_with_nothing_to_move_starts_no_workers(monkeypatch: pytest.MonkeyPatch,
                                                        tiny_plans: tuple[str, str]) -> None:
    import nereus.runtime

    def no_run(*args: object, **kwargs: object) -> int:
        raise AssertionError("workers started for an empty schedule")

    monkeypatch.setattr(nereus.runtime, "cli_execute", no_run)
    same = [tiny_plans[0], tiny_plans[0]]
    r = runner.invoke(app, ["transition", *same, *TINY, "--execute"])
    assert r.exit_code == 0, r.output
    assert "nothing to execute" in r.stdout
    r = runner.invoke(app, ["transition", *same, *TINY, "--execute", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["executed"] is False and out["primitives"] == []
