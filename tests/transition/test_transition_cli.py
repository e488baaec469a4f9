"""``nereus transition``: tables, --json, --gantt, exit 3 when infeasible, exit 2 on bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from typer.testing import CliRunner

from nereus.cli import app
from nereus.plan.types import Plan

from transition_testlib import example_a, sp

runner = CliRunner()


def write(tmp: Path, name: str, plan: Plan) -> Path:
    p = tmp / name
    p.write_text(plan.to_json())
    return p


@pytest.fixture()
def plans(tmp_path: Path) -> tuple[Path, Path]:
    cur, tgt = example_a()
    return write(tmp_path, "cur.json", cur), write(tmp_path, "tgt.json", tgt)


def test_tables_and_ltran(plans: tuple[Path, Path]) -> None:
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b"])
    assert r.exit_code == 0, r.output
    assert "primitives per model-stage" in r.output and "critic_train" in r.output
    assert "L_tran =" in r.output and "(estimated)" in r.output
    assert "Extend" in r.output and "Merge" in r.output


# the keys --json prints (its help documents them): the schedule's, then the figures the
# tables print beside it, with their sources
JSON_KEYS = {"source", "estimated_s", "feasible", "primitives", "loads_on_first_read",
             "peak_memory", "bytes_moved", "sources"}


def test_json_has_exactly_the_documented_shape(plans: tuple[Path, Path]) -> None:
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == JSON_KEYS
    assert out["source"] == "estimated"
    assert out["feasible"] is True and out["estimated_s"] > 0
    assert set(out["peak_memory"]) == {"gpu", "bytes", "capacity_bytes"}
    assert set(out["bytes_moved"]) == {s.stage for s in example_a()[0].stages}
    assert set(out["sources"]) == {"peak_memory", "bytes_moved"}
    assert sorted(p["op"] for p in out["primitives"]) == ["Extend"] * 4 + ["Merge"] * 2
    for p in out["primitives"]:
        assert set(p) == {"op", "stage", "gpus", "start_s", "end_s", "staged"}
        assert p["end_s"] >= p["start_s"] >= 0 and all(isinstance(g, int) for g in p["gpus"])


def test_gantt_chart_is_written(plans: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "g.png"
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--gantt", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_sizes_the_state(plans: tuple[Path, Path], tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "gpus": 16}))  # the old pool
    r = runner.invoke(app, ["transition", *map(str, plans), "--config", str(cfg), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["feasible"] is True


def test_infeasible_exits_3_with_the_reason(tmp_path: Path) -> None:
    cur = Plan((sp("reference_infer", 1, 4, [range(4)]), sp("reward_infer", 1, 4, [range(4, 8)])))
    tgt = Plan((sp("reference_infer", 1, 4, [range(4, 8)]), sp("reward_infer", 1, 4, [range(4)])))
    a, b = write(tmp_path, "a.json", cur), write(tmp_path, "b.json", tgt)
    r = runner.invoke(app, ["transition", str(a), str(b), "--model", "llama-3.1-8b"])
    assert r.exit_code == 3
    assert "infeasible" in r.output and "reward_infer" in r.output and "GPU" in r.output
    r = runner.invoke(app, ["transition", str(a), str(b), "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 3
    assert json.loads(r.stdout.splitlines()[0])["feasible"] is False


@pytest.mark.parametrize("args,field", [
    (["missing.json", "missing2.json", "--model", "llama-3.1-8b"], "current"),
    (["{cur}", "{tgt}"], "--model"),
    (["{cur}", "{txt}", "--model", "llama-3.1-8b"], "target"),
    (["{cur}", "{other}", "--model", "llama-3.1-8b"], "target.stages"),
    (["{cur}", "{tgt}", "--model", "no-such-model"], "model"),
])
def test_bad_input_exits_2_with_one_line(args: list[str], field: str,
                                         plans: tuple[Path, Path], tmp_path: Path) -> None:
    txt = tmp_path / "t.txt"
    txt.write_text("x")
    other = write(tmp_path, "o.json", Plan((sp("actor_gen", 1, 4, [range(4)]),)))
    subs = {"cur": str(plans[0]), "tgt": str(plans[1]), "txt": str(txt), "other": str(other)}
    r = runner.invoke(app, ["transition", *(a.format(**subs) for a in args)])
    assert r.exit_code == 2, r.output
    assert field in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_two_job_specs_are_planned_and_moved(tmp_path: Path) -> None:
    """A pool that doubles, planned by the planner on both sides."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "gpus": 16}))
    b.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "gpus": 32}))
    r = runner.invoke(app, ["transition", str(a), str(b), "--json"])
    assert r.exit_code in (0, 3), r.output
    out = json.loads(r.stdout.splitlines()[0])
    assert set(out) == JSON_KEYS
    if out["feasible"]:
        assert out["primitives"]
        assert max(g for p in out["primitives"] for g in p["gpus"]) >= 16  # new GPUs in use
    c = tmp_path / "c.yaml"
    c.write_text(yaml.safe_dump({"model": "qwen3-14b", "gpus": 32}))
    r = runner.invoke(app, ["transition", str(a), str(c)])
    assert r.exit_code == 2 and "target.model" in r.output


def _mangled(plan: dict, how: str) -> dict:
    s0 = plan["stages"][0]
    if how == "stages":
        plan["stages"] = 5
    elif how == "flat_gpus":
        s0["gpus"] = [g for r in s0["gpus"] for g in r]
    elif how == "text_gpu":
        s0["gpus"][0][0] = "a"
    elif how == "float_tp":
        s0["tp"] = 4.5
    elif how == "unknown_field":
        s0["colour"] = "red"
    elif how == "groups":
        plan["groups"] = [["no_such_stage"]]
    elif how == "twice":
        plan["stages"].append(dict(s0))
    elif how == "replicas":
        s0["dp"] += 1
    elif how == "gpu_twice":
        s0["gpus"][-1][-1] = s0["gpus"][0][0]
    return plan


@pytest.mark.parametrize("how,field", [
    ("stages", "current.stages"), ("flat_gpus", "current.stages.0.gpus"),
    ("text_gpu", "current.stages.0.gpus.0.0"), ("float_tp", "current.stages.0.tp"),
    ("unknown_field", "current.stages.0.colour"), ("groups", "current.groups"),
    ("twice", "current.stages"), ("replicas", "current.stages.0"),
    ("gpu_twice", "current.stages.0"),
])
def test_malformed_plan_files_are_one_line_errors(how: str, field: str,
                                                  plans: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mangled(json.loads(plans[0].read_text()), how)))
    r = runner.invoke(app, ["transition", str(bad), str(plans[1]), "--model", "llama-3.1-8b"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {field}") and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("out,problem", [("nowhere/g.png", "no folder"),
                                         ("g.txt", "unsupported file type")])
def test_a_bad_gantt_path_is_refused_before_planning(out: str, problem: str,
                                                     plans: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--gantt", str(tmp_path / out)])
    assert r.exit_code == 2 and problem in r.output and "--gantt" in r.output


def test_job_specs_refuse_options_they_carry(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "gpus": 16}))
    b.write_text(yaml.safe_dump({"model": "llama-3.1-8b", "gpus": 32,
                                 "cluster": {"devices_per_node": 4}}))
    r = runner.invoke(app, ["transition", str(a), str(a), "--device", "h200-141gb"])
    assert r.exit_code == 2 and "--device" in r.output
    r = runner.invoke(app, ["transition", str(a), str(b)])
    assert r.exit_code == 2 and "devices_per_node" in r.output
    r = runner.invoke(app, ["transition", str(a), str(a), "--devices-per-node", "0"])
    assert r.exit_code == 2 and "--devices-per-node" in r.output  # 0 is given, not absent


def test_a_gantt_path_that_cannot_be_written_is_refused_before_planning(
        plans: tuple[Path, Path], tmp_path: Path) -> None:
    """/proc exists but takes no new files: was every table printed, then a traceback."""
    if not sys.platform.startswith("linux"):
        pytest.skip("needs /proc")
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--gantt", "/proc/nereus-gantt.png"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: --gantt: cannot write /proc/nereus-gantt.png")
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    out = tmp_path / "fresh.png"  # the check leaves no empty file behind when it passes
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b", "--json",
                            "--gantt", str(out)])
    assert r.exit_code == 0 and out.read_bytes()[:4] == b"\x89PNG"


def test_plans_of_another_algo_name_the_plan_field(plans: tuple[Path, Path]) -> None:
    """PPO plans under --algo grpo: the plan file's stage is named, not a bare 'stage'."""
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--algo", "grpo"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: current.stages.") and "grpo does not have" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_a_gpu_id_past_the_largest_cluster_names_the_plan(plans: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    far = write(tmp_path, "far.json", Plan((sp("actor_gen", 1, 1, [[70_000]]),)))
    r = runner.invoke(app, ["transition", str(far), str(far), "--model", "llama-3.1-8b"])
    assert r.exit_code == 2 and r.output.startswith("error: current.stages"), r.output


def test_bytes_moved_is_labelled_estimated(plans: tuple[Path, Path]) -> None:
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b"])
    assert r.exit_code == 0, r.output
    assert "bytes moved (estimated)" in r.output


def _fake_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """--execute without workers: every primitive 'measured' at fixed numbers."""
    from nereus.runtime import demo

    def run(job, current, target, schedule, **kwargs):
        timings = [SimpleNamespace(gpus=p.gpus, duration_s=0.25, setup_s=0.125, bytes=3 << 20,
                                   start_s=p.start_s, end_s=p.start_s + 0.25)
                   for p in schedule.primitives]
        report = SimpleNamespace(timings=timings, wall_s=1.5, within_capacity=lambda: True,
                                  peak_bytes={}, device_peak_bytes={})
        return demo.ExecutionCheck(schedule, report, True, (), "cpu")

    monkeypatch.setattr(demo, "execute_transition", run)


def test_execute_table_says_which_columns_are_measured(plans: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_run(monkeypatch)
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--execute"])
    assert r.exit_code == 0, r.output
    assert "setup s (measured)" in r.output and "MiB (measured)" in r.output
    assert "0.1250" in r.output and "3.0" in r.output  # the measured numbers themselves
    assert "measured 1.5000 s (measured)" in r.output and "bitwise equal" in r.output
    # the estimate is the H100's, the workers are CPU processes: said, not set side by side
    assert "for h100-sxm-80gb, the device the plans were made for" in r.output
    r = runner.invoke(app, ["transition", *map(str, plans), "--model", "llama-3.1-8b",
                            "--execute", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["primitives"][0]["setup_s"] == 0.125 and out["bitwise_equal"] is True
    assert out["sources"]["setup_s"].startswith("measured")
    assert out["sources"]["bytes"].startswith("counted")  # summed, not measured
    assert out["estimated_for"] == "h100-sxm-80gb" and out["device"] == "cpu"
