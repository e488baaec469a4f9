"""``nereus transition``: which job file is wrong, why it is infeasible in --json, sizes of a
tiny model, and --execute with nothing to move."""

import json
from collections.abc import Callable
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
    bad = tmp_path / "job.yaml"  # a job spec without its model
    bad.write_text("gpus: 8\n")
    good = "examples/llama-3.1-8b-ppo.yaml"
    for args, which in (([str(bad), good], "current"), ([good, str(bad)], "target")):
        r = runner.invoke(app, ["transition", *args])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: {which}.model: required field is missing"), r.stderr


def test_a_layout_beside_a_job_spec_is_refused_naming_both(tmp_path: Path) -> None:
    """A layout (the --evaluate format) is a plan to price under a job; a job spec is planned
    with its own: the two do not pair, and the error says which file is which."""
    lay = tmp_path / "layout.yaml"
    lay.write_text("actor_gen: {tp: 1, pp: 1, dp: 2}\n")
    r = runner.invoke(app, ["transition", str(lay), "examples/llama-3.1-8b-ppo.yaml"])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1
    assert "llama-3.1-8b-ppo.yaml is a job file but layout.yaml is a layout file" in r.stderr


def test_infeasible_json_carries_the_reason(tmp_path: Path) -> None:
    # two frozen models that run side by side swap their GPUs: neither may hold the other's
    # GPUs while the other is there, and each keeps its copy until the new one exists
    cur = plan_file(tmp_path, "a.json", [stage("reference_infer", 1, 4, [[0, 1, 2, 3]]),
                                         stage("reward_infer", 1, 4, [[4, 5, 6, 7]])])
    tgt = plan_file(tmp_path, "b.json", [stage("reference_infer", 1, 4, [[4, 5, 6, 7]]),
                                         stage("reward_infer", 1, 4, [[0, 1, 2, 3]])])
    r = runner.invoke(app, ["transition", cur, tgt, "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 3, r.output
    out = json.loads(r.stdout)
    assert out["feasible"] is False and "GPU" in out["reason"]
    assert out["reason"] in r.stderr
    # nor in two: the plan between them would put the two on the same GPUs
    assert out["in_two_moves"] is None and "in two moves" not in r.stderr
    assert out["bytes_moved"] is None and out["peak_memory"] is None  # no schedule to size


def test_an_infeasible_move_says_which_two_moves_fit(tmp_path: Path) -> None:
    """8B PPO from its best plan on 4 GPUs to its best on 8: no order of one move fits, and
    the error said only 'try moving fewer model-stages at a time', which the command had no
    way to do. It now names the two moves that fit (critic training, then the rest)."""
    r4 = [[0, 1, 2, 3]]
    r8 = [[0, 1, 2, 3, 4, 5, 6, 7]]
    cur = plan_file(tmp_path, "a.json", [
        stage("actor_gen", 4, 1, r4), stage("reference_infer", 1, 1, [[g] for g in range(4)]),
        stage("reward_infer", 1, 4, r4), stage("critic_infer", 1, 4, r4),
        stage("actor_train", 2, 2, r4), stage("critic_train", 4, 1, r4)])
    tgt = plan_file(tmp_path, "b.json", [
        stage("actor_gen", 4, 1, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        stage("reference_infer", 1, 1, [[g] for g in range(8)]),
        stage("reward_infer", 1, 8, r8), stage("critic_infer", 1, 8, r8),
        stage("actor_train", 2, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        stage("critic_train", 1, 8, r8)])
    r = runner.invoke(app, ["transition", cur, tgt, "--model", "llama-3.1-8b", "--json"])
    assert r.exit_code == 3, r.output
    two = json.loads(r.stdout)["in_two_moves"]
    assert two["first_moved"] == ["critic_train"]
    assert two["estimated_s"] == pytest.approx(two["first_s"] + two["second_s"])
    assert r.stderr.count("\n") == 1 and "try moving fewer" not in r.stderr  # done instead
    assert (f"in two moves it fits: first critic_train ({two['first_s']:.3f} s), then the "
            f"rest ({two['second_s']:.3f} s)") in r.stderr
    # the plan between them is a plan file the command moves through, one move at a time
    way = tmp_path / "waypoint.json"
    way.write_text(json.dumps(two["waypoint"]))
    for a, b, s in ((cur, str(way), two["first_s"]), (str(way), tgt, two["second_s"])):
        r = runner.invoke(app, ["transition", a, b, "--model", "llama-3.1-8b", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["estimated_s"] == pytest.approx(s)


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


def _texts_outside_or_overlapping(fig) -> list[str]:  # type: ignore[no-untyped-def]
    """Panels whose drawn labels, ticks, title or legend cross the figure's edge, and an axis
    label under a legend."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    edge = fig.bbox
    bad = []
    for i, ax in enumerate(fig.axes):
        b = ax.get_tightbbox(r)  # everything drawn for the panel, its legend included
        if b.x0 < edge.x0 - 1 or b.x1 > edge.x1 + 1 or b.y0 < edge.y0 - 1 or b.y1 > edge.y1 + 1:
            bad.append(f"panel {i} ({ax.xaxis.label.get_text()!r}) cut by the figure's edge")
    for leg in (ax.get_legend() for ax in fig.axes):
        if leg is None:
            continue
        lb = leg.get_window_extent(r)
        for ax in fig.axes:
            if lb.overlaps(ax.xaxis.label.get_window_extent(r)):
                bad.append(f"legend over {ax.xaxis.label.get_text()!r}")
    return bad


@pytest.mark.parametrize("case", ["tiny", "8b", "same"])
def test_the_gantt_chart_cuts_no_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       tiny_plans: tuple[str, str], case: str) -> None:
    """The memory panel's axis label ran off the figure's right edge, and on a short chart
    (four GPUs) the legend sat on the time axis's label."""
    from matplotlib.figure import Figure

    if case == "tiny":
        args = [*tiny_plans, *TINY]
    elif case == "same":  # nothing to move: a figure that says so, not an empty chart
        args = [tiny_plans[0], tiny_plans[0], *TINY]
    else:
        cfg = "examples/llama-3.1-8b-ppo.yaml"
        plans = []
        for extra in ([], ["--gpus", "32", "--response-len", "4096"]):
            r = runner.invoke(app, ["plan", "--config", cfg, *extra, "--json"])
            assert r.exit_code == 0, r.output
            plans.append(tmp_path / f"p{len(plans)}.json")
            plans[-1].write_text(r.stdout)
        args = [*map(str, plans), "--config", cfg]
    problems: list[list[str]] = []
    save = Figure.savefig
    texts: list[str] = []

    def check(self: Figure, *a: object, **k: object) -> None:
        problems.append(_texts_outside_or_overlapping(self))
        texts.extend(t.get_text() for t in self.axes[0].texts)
        save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", check)
    out = tmp_path / "gantt.png"
    r = runner.invoke(app, ["transition", *args, "--gantt", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert problems == [[]]
    assert ("no primitives: the plans are the same" in texts) == (case == "same")


def test_execute_json_has_a_top_level_source_and_ray_is_asked_to_be_quiet(
        monkeypatch: pytest.MonkeyPatch, tiny_plans: tuple[str, str]) -> None:
    """--execute --json had no top-level "source" (every other command's JSON has one),
    Ray's driver printed a token-auth warning and 'Started a local Ray instance' on stderr,
    and a raylet's warning about many workers starting landed in stdout, before the JSON."""
    import os

    import nereus.runtime

    seen: dict[str, object] = {}

    def fake_run(job: object, cur: object, tgt: object, schedule: object, *,
                 as_json: bool, echo: object) -> int:
        seen["ray_level"] = os.environ.get("RAY_LOGGER_LEVEL")
        print("(raylet) WARNING: 8 PYTHON worker processes have been started")  # as Ray does
        row = {"index": 0, "op": "Extend", "stage": "actor_gen", "gpus": [0, 2],
               "estimated_s": 0.01, "measured_s": 0.02, "setup_s": 0.001, "bytes": 1024,
               "start_s": 0.0, "end_s": 0.02}
        echo(json.dumps({"device": "cpu", "bitwise_equal": True, "differences": [],
                         "estimated_s": 0.01, "measured_s": 0.02, "within_capacity": True,
                         "primitives": [row],
                         "sources": {"estimated_s": "estimated (transition cost model)",
                                     "measured_s": "measured (wall clock on the driver)"}}))
        return 0

    monkeypatch.delenv("RAY_LOGGER_LEVEL", raising=False)
    monkeypatch.setattr(nereus.runtime, "cli_execute", fake_run)
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)  # Ray's own lines go to stderr, not into the JSON
    assert "(raylet) WARNING" in r.stderr
    assert out["source"] == "measured"
    assert out["sources"]["estimated_s"].startswith("estimated")
    numbers = {k for k, v in out["primitives"][0].items()
               if isinstance(v, (int, float)) and k != "index"}
    assert numbers <= set(out["sources"]), numbers - set(out["sources"])
    assert seen["ray_level"] == "error"
    monkeypatch.setenv("RAY_LOGGER_LEVEL", "debug")  # the user's own setting wins
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute"])
    assert r.exit_code == 0, r.output
    assert seen["ray_level"] == "debug" and "measured" in r.stdout


@pytest.mark.slow
def test_execute_prints_nothing_of_rays_own(tmp_path: Path) -> None:
    """End to end on local Ray workers (tens of seconds): stderr stays empty."""
    import subprocess
    import sys

    plans = []
    for gpus in (2, 4):
        r = runner.invoke(app, ["plan", *TINY, "--gpus", str(gpus), "--json"])
        plans.append(tmp_path / f"p{gpus}.json")
        plans[-1].write_text(r.stdout)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RAY_")}
    p = subprocess.run([sys.executable, "-m", "nereus", "transition", *map(str, plans),
                        *TINY, "--execute", "--json"], capture_output=True, text=True,
                       env=env, timeout=600, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert json.loads(p.stdout)["source"] == "measured"


CONFIG_8B = "examples/llama-3.1-8b-ppo.yaml"


def _plan_8b(tmp: Path, name: str, *extra: str) -> Path:
    r = runner.invoke(app, ["plan", "--config", CONFIG_8B, *extra, "--json"])
    assert r.exit_code == 0, r.output
    p = tmp / name
    p.write_text(r.stdout)
    return p


def test_a_plan_of_another_job_is_refused_naming_the_file(tmp_path: Path,
                                                          tiny_plans: tuple[str, str]) -> None:
    """A tiny-llama CPU plan priced with the 8B H100 job, and 8B plans priced as qwen3-14b,
    were accepted and then reported infeasible (exit 3)."""
    now = _plan_8b(tmp_path, "now.json")
    r = runner.invoke(app, ["transition", tiny_plans[0], str(now), "--config", CONFIG_8B])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: current: {Path(tiny_plans[0]).name} was planned for "
                               "tiny-llama on cpu (ppo), not for llama-3.1-8b on "
                               "h100-sxm-80gb (ppo)"), r.stderr
    r = runner.invoke(app, ["transition", str(now), str(now), "--model", "qwen3-14b"])
    assert r.exit_code == 2 and "now.json was planned for llama-3.1-8b" in r.stderr, r.output
    assert "--model llama-3.1-8b" in r.stderr  # how to price it with its own job
    # a plan file without the record (an older one) is still taken as it is
    old = json.loads(Path(tiny_plans[0]).read_text())
    del old["planned_for"]
    p = tmp_path / "old.json"
    p.write_text(json.dumps(old))
    r = runner.invoke(app, ["transition", str(p), tiny_plans[1], *TINY])
    assert r.exit_code == 0, r.output


def test_a_plan_is_matched_to_its_job_by_architecture_not_by_name(tmp_path: Path) -> None:
    """A config.json is named after its folder: a smaller model in a folder called
    llama-3.1-8b was taken as the 8B model, and the 8B model's own config.json in a folder
    called hf was refused as another model."""
    import dataclasses

    from nereus.spec.model import MODEL_PRESETS

    def hf_model(folder: str, **shape: int) -> Path:
        d = tmp_path / folder
        d.mkdir(parents=True)
        spec = dataclasses.replace(MODEL_PRESETS["llama-3.1-8b"], **shape)
        (d / "config.json").write_text(json.dumps(spec.to_hf_dict()))
        return d / "config.json"

    fake = hf_model("fake/llama-3.1-8b", num_layers=16)
    r = runner.invoke(app, ["plan", "--model", str(fake), "--gpus", "16", "--json"])
    assert r.exit_code == 0, r.output
    (tmp_path / "fake.json").write_text(r.stdout)
    now = _plan_8b(tmp_path, "now.json")
    r = runner.invoke(app, ["transition", str(tmp_path / "fake.json"), str(now),
                            "--model", "llama-3.1-8b"])
    assert r.exit_code == 2, r.output
    assert "(model architecture differs)" in r.stderr, r.stderr
    same = hf_model("hf", num_layers=32)
    r = runner.invoke(app, ["plan", "--model", str(same), "--gpus", "16", "--json"])
    assert r.exit_code == 0, r.output
    (tmp_path / "hf.json").write_text(r.stdout)
    r = runner.invoke(app, ["transition", str(tmp_path / "hf.json"), str(now), "--config",
                            CONFIG_8B, "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["transition", str(tmp_path / "fake.json"), str(now), "--model",
                            "qwen3-14b"])
    assert r.exit_code == 2 and "--model <the config.json of llama-3.1-8b>" in r.stderr, \
        r.stderr


def test_a_layout_file_is_a_plan_for_transition(tmp_path: Path) -> None:
    """The layout a job runs today (the --evaluate format) was refused as 'a job file'."""
    best = _plan_8b(tmp_path, "best.json")
    layout = "examples/layouts/verl-colocated-8b.yaml"
    r = runner.invoke(app, ["transition", layout, str(best), "--config", CONFIG_8B])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("│ actor_gen "))
    assert "tp=2 pp=1 dp=8" in row  # the layout's own actor_gen, placed under the job
    r = runner.invoke(app, ["transition", str(best), layout, "--config", CONFIG_8B, "--json"])
    assert r.exit_code in (0, 3), r.output  # read and priced; whether it can run is the
    assert "feasible" in json.loads(r.stdout.splitlines()[0])  # transition layer's matter
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor_gen: {tp: 2, pp: 1}\n")
    r = runner.invoke(app, ["transition", str(best), str(bad), "--config", CONFIG_8B])
    assert r.exit_code == 2 and r.stderr.startswith("error: target.actor_gen.dp: "), r.stderr
    # the allowed part names the other entry by the same prefix as the field
    bad.write_text("stages:\n- {name: actor_gen, tp: 1, pp: 1, dp: 1}\n"
                   "- {name: actor_gen, tp: 1, pp: 1, dp: 1}\n")
    r = runner.invoke(app, ["transition", str(best), str(bad), "--config", CONFIG_8B])
    assert r.exit_code == 2 and r.stderr == (
        "error: target.stages.1.name: model-stage 'actor_gen' listed twice (allowed: each "
        "model-stage once (target.stages.0 is actor_gen))\n"), r.stderr


def test_staged_primitives_are_marked_in_the_table_and_the_json(tmp_path: Path) -> None:
    now, n24 = _plan_8b(tmp_path, "now.json"), _plan_8b(tmp_path, "n24.json", "--gpus", "24")
    r = runner.invoke(app, ["transition", str(now), str(n24), "--config", CONFIG_8B])
    assert r.exit_code == 0, r.output
    assert "Split*" in r.stdout or "Merge*" in r.stdout
    assert "* staged through host memory: the GPU holds only the larger shard" in r.stdout
    r = runner.invoke(app, ["transition", str(now), str(n24), "--config", CONFIG_8B, "--json"])
    prims = json.loads(r.stdout)["primitives"]
    assert all(isinstance(p["staged"], bool) for p in prims)
    assert any(p["staged"] for p in prims) and not all(p["staged"] for p in prims)


def test_no_staged_note_without_a_staged_primitive(tiny_plans: tuple[str, str]) -> None:
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY])
    assert r.exit_code == 0, r.output
    assert "staged through host memory" not in r.stdout and "*" not in r.stdout


def _fake_execute(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from nereus.runtime import demo

    def run(job, current, target, schedule, **kwargs):
        timings = [SimpleNamespace(gpus=p.gpus, duration_s=0.3, setup_s=0.01, bytes=1 << 20,
                                   start_s=p.start_s, end_s=p.start_s + 0.3)
                   for p in schedule.primitives]
        report = SimpleNamespace(timings=timings, wall_s=0.3, within_capacity=lambda: True,
                                  peak_bytes={}, device_peak_bytes={})
        return demo.ExecutionCheck(schedule, report, True, (), "cpu")

    monkeypatch.setattr(demo, "execute_transition", run)


def test_execute_says_the_estimate_used_default_efficiencies(
        monkeypatch: pytest.MonkeyPatch, tiny_plans: tuple[str, str]) -> None:
    """0.067 s estimated beside 0.3 s measured, with nothing saying the estimate is not
    calibrated on this machine."""
    _fake_execute(monkeypatch)
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute"])
    assert r.exit_code == 0, r.output
    table_end = r.stdout.rindex("┘")
    note = r.stdout[table_end:].splitlines()[1]
    assert note.startswith("estimated s: with the cost model's default efficiencies, not "
                           "calibrated on this machine"), note
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute", "--json"])
    out = json.loads(r.stdout)
    assert out["estimate_efficiencies"].startswith("default efficiencies (uncalibrated")
    assert "default efficiencies" in out["sources"]["estimated_s"]


def test_execute_that_this_machine_cannot_hold_prints_only_the_error(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """8B plans with --execute printed every table, then the one-line 'state takes ... this
    machine has ...' error."""
    from nereus.errors import InputError
    from nereus.runtime import demo

    def too_big(*args: object, **kwargs: object) -> None:
        raise InputError("model", "llama-3.1-8b: its state takes 913.7 GiB on 32 CPU workers, "
                         "this machine has 23.5 GiB", "a small model for --execute on CPU")

    monkeypatch.setattr(demo, "execute_transition", too_big)
    now = _plan_8b(tmp_path, "now.json")
    nxt = _plan_8b(tmp_path, "next.json", "--gpus", "32", "--response-len", "4096")
    r = runner.invoke(app, ["transition", str(now), str(nxt), "--config", CONFIG_8B,
                            "--execute"])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    *notes, err = r.stderr.splitlines()  # the note: next.json's 32 GPUs grow the config's 16
    assert err.startswith("error: model: llama-3.1-8b: its state takes"), r.stderr
    assert all(n.startswith("note: the plans use GPU ids") for n in notes), r.stderr


def test_execute_refuses_more_workers_than_the_cores_serve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 GPU ids on 2 cores started 64 worker processes and ended after a minute in a
    startup timeout (exit 4); it is refused before anything starts."""
    import os

    plans = []
    for gpus in (2, 64):
        r = runner.invoke(app, ["plan", *TINY, "--gpus", str(gpus), "--json"])
        assert r.exit_code == 0, r.output
        plans.append(tmp_path / f"p{gpus}.json")
        plans[-1].write_text(r.stdout)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    r = runner.invoke(app, ["transition", *map(str, plans), *TINY, "--execute"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: --execute: the plans use 64 GPU ids, so 64 CPU worker "
                               "processes; this machine has 2 cores"), r.stderr
    assert "at most 16 GPUs here" in r.stderr


def test_a_job_spec_that_fits_nowhere_is_named(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(Path(CONFIG_8B).read_text().replace("gpus: 16", "gpus: 1"))
    assert "gpus: 1\n" in one.read_text()
    r = runner.invoke(app, ["transition", CONFIG_8B, str(one)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target (one.yaml): model-stage "), r.stderr


def test_between_job_specs_the_target_is_placed_near_the_current_gpus(tmp_path: Path) -> None:
    # the 8B PPO example on 48 GPUs from 2K to 8K responses: as searched, three concurrent
    # inference stages would take each other's GPUs (infeasible); placed near, they reshard
    # where they are
    import yaml

    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" /
                           "llama-3.1-8b-ppo.yaml").read_text())
    paths = []
    for n in (2048, 8192):
        data = dict(base, gpus=48)
        data["workload"] = dict(base.get("workload") or {}, response_len=n, response_len_max=n)
        p = tmp_path / f"job{n}.yaml"
        p.write_text(yaml.safe_dump(data))
        paths.append(str(p))
    r = runner.invoke(app, ["transition", *paths, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["feasible"] is True
    moved = {p["stage"] for p in out["primitives"] if p["op"] == "Extend"}
    assert not moved & {"reference_infer", "reward_infer", "critic_infer"}


def test_job_specs_that_score_responses_differently_are_refused(tmp_path: Path) -> None:
    """One job scores with a reward model, the other with a rule: the reward model's state
    has nowhere to go, so the pair is refused, naming the field."""
    ppo = Path("examples/llama-3.1-8b-ppo.yaml").read_text()
    rule = tmp_path / "rule.yaml"
    rule.write_text(ppo + "reward: rule\n")
    r = runner.invoke(app, ["transition", "examples/llama-3.1-8b-ppo.yaml", str(rule)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.reward: rule differs from the current model"), \
        r.stderr


def test_plan_files_of_a_rule_reward_job_move_with_reward_rule(tmp_path: Path) -> None:
    """--reward rule builds the job the plans came from: no reward_infer stage to size."""
    paths = []
    for gpus in (2, 4):
        r = runner.invoke(app, ["plan", *TINY, "--algo", "grpo", "--reward", "rule",
                                "--responses-per-prompt", "4", "--gpus", str(gpus), "--json"])
        assert r.exit_code == 0, r.output
        assert "reward_infer" not in r.stdout
        p = tmp_path / f"rule{gpus}.json"
        p.write_text(r.stdout)
        paths.append(str(p))
    assert json.loads(Path(paths[0]).read_text())["planned_for"]["reward"] == "rule"
    r = runner.invoke(app, ["transition", *paths, *TINY, "--algo", "grpo", "--reward", "rule",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["feasible"] and {p["stage"] for p in out["primitives"]} <= {
        "actor_gen", "reference_infer", "actor_train"}
    # without --reward the job would score with a model: the record says how it was planned
    r = runner.invoke(app, ["transition", *paths, *TINY, "--algo", "grpo"])
    assert r.exit_code == 2, r.output
    assert "(grpo, rule reward), not for tiny-llama on cpu (grpo) (reward differs)" in r.stderr
    assert "--reward rule" in r.stderr


def test_plans_past_the_configs_pool_grow_it_and_say_so(tiny_plans: tuple[str, str],
                                                        tmp_path: Path) -> None:
    """Plans made with --gpus past the config's count (the README's growing pool) are priced on
    a cluster that holds them; that used to happen without a word, a typo'd id included."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("model: tiny-llama\ngpus: 2\ncluster: {device: cpu}\n")
    r = runner.invoke(app, ["transition", *tiny_plans, "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert r.stderr == "note: the plans use GPU ids up to 3; tiny.yaml's 2 GPUs are taken as 4\n"
    assert r.stdout.startswith("tiny-llama, PPO on 4 x cpu "), r.stdout
    r = runner.invoke(app, ["transition", tiny_plans[0], tiny_plans[0], "--config", str(cfg)])
    assert r.exit_code == 0 and r.stderr == "", r.output
    long = tmp_path / f"{'a-long-config-name-' * 12}tiny.yaml"  # one line still, for a script
    long.write_text(cfg.read_text())
    r = runner.invoke(app, ["transition", *tiny_plans, "--config", str(long)])
    assert r.exit_code == 0 and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("ids,which,says", [
    # the ids 2-3 of a 4-GPU cluster: the current plan's GPUs 0-1 are not the job's
    ([2, 3], "current", ("current.stages.0.gpus.0: GPU 0 of replica 0 is not in the pool "
                        "tiny.yaml gives (allowed: GPU ids 2-3)")),
    # as many ids as the config's count would take: a list is not grown to the target's 4
    ([0, 1], "target", ("target.stages.0.gpus.2: GPU 2 of replica 2 is not in the pool "
                       "tiny.yaml gives (allowed: GPU ids 0-1)")),
])
def test_plans_outside_a_pool_the_config_lists_are_refused(
        tiny_plans: tuple[str, str], tmp_path: Path, ids: list[int], which: str,
        says: str) -> None:
    """A config that lists its GPU ids says which GPUs the job has; a plan on others was
    priced anyway (only their number was compared, and a list too short was grown like a
    count), where ``plan --evaluate`` refuses the same GPUs."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(f"model: tiny-llama\ngpus: {ids}\ncluster: {{device: cpu, "
                   "devices_per_node: 4}\n")
    r = runner.invoke(app, ["transition", *tiny_plans, "--config", str(cfg)])
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: {says}\n", r.stderr


@pytest.mark.parametrize("field,value,says", [
    ("tp", 0, "error: target.stages.0.tp: 0 is not allowed (allowed: >= 1)"),
    ("gpus", [[70_000]], ("error: target.stages.0.gpus.0.0: 70000 is not allowed (allowed: "
                          "<= 65,535)")),
])
def test_a_value_out_of_bounds_in_a_plan_file_reads_like_every_other(
        tiny_plans: tuple[str, str], tmp_path: Path, field: str, value: object,
        says: str) -> None:
    """pydantic's own 'Input should be greater than or equal to 1' came through, and a plan's
    GPU ids were bounded at 1,048,576 where the cluster's are at 65,535."""
    data = json.loads(Path(tiny_plans[0]).read_text())
    data["stages"][0][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = runner.invoke(app, ["transition", tiny_plans[0], str(bad), *TINY])
    assert r.exit_code == 2 and r.stderr == says + "\n", r.output


def _without_job(path: str, tmp: Path) -> str:
    """``path`` as a plan file written before the record held the whole job."""
    data = json.loads(Path(path).read_text())
    del data["planned_for"]["job"]
    out = tmp / Path(path).name
    out.write_text(json.dumps(data))
    return str(out)


def test_plan_files_without_a_job_offer_the_job_they_record(tiny_plans: tuple[str, str],
                                                             tmp_path: Path) -> None:
    """`nereus transition a.json b.json` said only that --model is needed; the plans record
    which model, device, algorithm and reward they were made for. Files written before the
    record held the whole job still need the job from the options, and say so as they did."""
    old = tmp_path / "old"
    old.mkdir()
    new, tiny_plans = tiny_plans, (_without_job(tiny_plans[0], old),
                                   _without_job(tiny_plans[1], old))
    r = runner.invoke(app, ["transition", *tiny_plans])
    assert r.exit_code == 2, r.output
    assert r.stderr == ("error: --model: needed without --config (allowed: --config the job's "
                        "YAML, or --model tiny-llama --device cpu --algo ppo --reward model "
                        "--execution sync as "
                        "tiny2.json records)\n"), r.stderr
    r = runner.invoke(app, ["transition", *tiny_plans, "--model", "tiny-llama", "--device",
                            "cpu"])
    assert r.exit_code == 0, r.output
    # one file with its job and one without: the job of one is not the other's
    r = runner.invoke(app, ["transition", tiny_plans[0], new[1]])
    assert r.exit_code == 2 and r.stderr.startswith("error: --model: needed without --config"), \
        r.output


def test_execute_when_ray_cannot_start_is_a_failed_run(monkeypatch: pytest.MonkeyPatch,
                                                       tiny_plans: tuple[str, str]) -> None:
    """ray.init's own error (no temp folder) was a 70-line traceback and exit 1, the code
    that means the state differs after the move."""
    import ray

    calls: list[str] = []

    def no_ray(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/proc/nope")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute"])
    assert r.exit_code == 4, r.output
    assert r.stderr == ("error: the transition did not run to its end (RayStartFailed): Ray "
                        "could not start (FileNotFoundError: [Errno 2] No such file or "
                        "directory: '/proc/nope')\n"), r.stderr
    assert calls  # whatever Ray had begun is stopped


def test_execute_refused_by_the_runtime_is_a_failed_run_not_bad_input(
        monkeypatch: pytest.MonkeyPatch, tiny_plans: tuple[str, str]) -> None:
    """The executor's memory check before a primitive raises InfeasibleError; the command
    called it bad input (exit 2)."""
    from nereus.errors import InfeasibleError
    from nereus.runtime import demo

    def refused(*args: object, **kwargs: object) -> None:
        raise InfeasibleError("transition: Merge(actor_train) needs more memory than workers "
                              "[0] have free (0: 10 > 5)")

    monkeypatch.setattr(demo, "execute_transition", refused)
    r = runner.invoke(app, ["transition", *tiny_plans, *TINY, "--execute"])
    assert r.exit_code == 4, r.output
    assert r.stderr.startswith("error: the transition did not run to its end "
                               "(InfeasibleError): transition: Merge(actor_train)"), r.stderr


def test_plan_files_that_record_their_jobs_need_no_job_options(tmp_path: Path) -> None:
    """`nereus transition a.json b.json` of two `nereus plan --json` files needed --config or
    --model, though the files say what job they were planned for; now the job comes from
    their records, and prices the move as --config does (whose note on the grown pool is on
    stderr)."""
    now, n24 = _plan_8b(tmp_path, "now.json"), _plan_8b(tmp_path, "n24.json", "--gpus", "24")
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["transition", str(now), str(n24), *extra])
        assert r.exit_code == 0 and r.stderr == "", r.output
        given = runner.invoke(app, ["transition", str(now), str(n24), *extra,
                                    "--config", CONFIG_8B])
        assert given.exit_code == 0, given.output
        assert r.stdout == given.stdout
    assert r.stdout.startswith('{"source": "estimated"') and '"feasible": true' in r.stdout
    # longer responses: the target is taken with its own workload
    long = _plan_8b(tmp_path, "long.json", "--gpus", "24", "--response-len", "4096")
    r = runner.invoke(app, ["transition", str(now), str(long)])
    assert r.exit_code == 0, r.output


def test_a_layout_that_records_its_job_is_priced_under_it(tmp_path: Path) -> None:
    import yaml

    best = _plan_8b(tmp_path, "best.json")
    layout = yaml.safe_load(Path("examples/layouts/verl-colocated-8b.yaml").read_text())
    layout["planned_for"] = json.loads(best.read_text())["planned_for"]
    lay = tmp_path / "layout.yaml"
    lay.write_text(yaml.safe_dump(layout))
    r = runner.invoke(app, ["transition", str(lay), str(best)])
    assert r.exit_code == 0, r.output
    given = runner.invoke(app, ["transition", str(lay), str(best), "--config", CONFIG_8B])
    assert r.stdout == given.stdout


def _tiny_config(tmp: Path, folder: str) -> Path:
    from nereus.spec.model import MODEL_PRESETS

    d = tmp / folder
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(MODEL_PRESETS["tiny-llama"].to_hf_dict()))
    return d / "config.json"


def test_a_recorded_config_json_that_is_gone_is_one_line(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A model read from a config.json is recorded by its path, which another machine (or a
    later day) may not have: the error names the file, the record and the path."""
    cfg = _tiny_config(tmp_path, "models/hf")
    monkeypatch.chdir(tmp_path)  # a relative path is recorded absolute
    paths = []
    for gpus in (2, 4):
        r = runner.invoke(app, ["plan", "--model", "models/hf", "--device", "cpu", "--gpus",
                                str(gpus), "--json"])
        assert r.exit_code == 0, r.output
        paths.append(tmp_path / f"p{gpus}.json")
        paths[-1].write_text(r.stdout)
    assert json.loads(r.stdout)["planned_for"]["job"]["model"] == str(tmp_path / "models/hf")
    monkeypatch.chdir(tmp_path / "models")
    r = runner.invoke(app, ["transition", *map(str, paths)])
    assert r.exit_code == 0, r.output
    given = runner.invoke(app, ["transition", *map(str, paths), "--model", str(cfg),
                                "--device", "cpu"])
    assert r.stdout == given.stdout
    cfg.unlink()
    r = runner.invoke(app, ["transition", *map(str, paths)])
    assert r.exit_code == 2, r.output
    gone = tmp_path / "models/hf/config.json"
    assert r.stderr == (f"error: current.planned_for.job.model: p2.json was planned for the "
                        f"model in {gone}, which is not on this machine (allowed: the "
                        "config.json back at that path, or the job from --config or "
                        "--model)\n"), r.stderr


@pytest.mark.parametrize("other,field,says", [
    (["--model", "tiny-qwen3"], "model", "tiny-qwen3 differs from the current tiny-llama"),
    (["--execution", "async"], "execution",
     "the RL workflow differs between the jobs the files record"),
    (["--devices-per-node", "1"], "cluster.devices_per_node", "1 differs from the current 2"),
])
def test_recorded_jobs_no_transition_spans_are_refused_naming_the_field(
        tmp_path: Path, other: list[str], field: str, says: str) -> None:
    paths = []
    # the other job's option replaces TINY's (an option given twice is refused)
    other_job = [*TINY[2:], *other] if other[0] == "--model" else [*TINY, *other]
    for name, extra in (("a.json", TINY), ("b.json", other_job)):
        r = runner.invoke(app, ["plan", *extra, "--gpus", "2", "--json"])
        assert r.exit_code == 0, r.output
        paths.append(tmp_path / name)
        paths[-1].write_text(r.stdout)
    r = runner.invoke(app, ["transition", *map(str, paths)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: target.planned_for.job.{field}: {says}"), r.stderr


def _dtype_plans(tmp_path: Path, field: str) -> list[str]:
    """Plan files of two tiny jobs whose workloads differ in ``field`` (bf16, then fp32)."""
    paths = []
    for dtype in ("bf16", "fp32"):
        cfg = tmp_path / f"{dtype}.yaml"
        cfg.write_text(f"model: tiny-llama\ngpus: 2\ncluster: {{device: cpu}}\n"
                       f"workload: {{{field}: {dtype}}}\n")
        r = runner.invoke(app, ["plan", "--config", str(cfg), "--json"])
        assert r.exit_code == 0, r.output
        paths.append(tmp_path / f"{dtype}.json")
        paths[-1].write_text(r.stdout)
    return [str(p) for p in paths]


def test_recorded_jobs_of_other_state_dtypes_are_refused(tmp_path: Path) -> None:
    """The transition moves the state as it is: fp32 parameters are another job's."""
    r = runner.invoke(app, ["transition", *_dtype_plans(tmp_path, "param_dtype")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.planned_for.job.workload.param_dtype: fp32 "
                               "differs from the current bf16"), r.stderr


def test_recorded_jobs_that_differ_in_gradient_dtype_move(tmp_path: Path) -> None:
    """Gradients are no state at a step boundary: a job that keeps them in another dtype holds
    the same state, and the transition between the two plans is priced."""
    r = runner.invoke(app, ["transition", *_dtype_plans(tmp_path, "grad_dtype")])
    assert r.exit_code == 0, r.output


def test_plan_files_of_differing_node_sizes_on_one_node_move(tiny_plans: tuple[str, str]
                                                               ) -> None:
    """Plans for 2 and for 4 GPUs record nodes of 2 and of 4 (the node size defaults to a
    smaller pool): one node, partly in the pool, which the options price as one node of 4."""
    for pair in (tiny_plans, tiny_plans[::-1]):
        r = runner.invoke(app, ["transition", *pair])
        assert r.exit_code == 0, r.output
        given = runner.invoke(app, ["transition", *pair, *TINY])
        assert r.stdout == given.stdout


def test_options_still_override_the_recorded_jobs(tiny_plans: tuple[str, str]) -> None:
    # the options' job is checked against the records, as for files without a job
    r = runner.invoke(app, ["transition", *tiny_plans, "--model", "tiny-qwen3", "--device",
                            "cpu"])
    assert r.exit_code == 2 and "(model differs)" in r.stderr, r.output
    # an option that builds no job alone: the records would have answered without it
    r = runner.invoke(app, ["transition", *tiny_plans, "--algo", "ppo"])
    assert r.exit_code == 2, r.output
    assert r.stderr.endswith("as tiny2.json records, or no job options: both files record "
                             "their jobs)\n"), r.stderr


def test_a_plan_file_without_its_stages_says_they_are_missing(
        tiny_plans: tuple[str, str], tmp_path: Path) -> None:
    """It was read as a layout whose model-stage 'step_latency_s' was no mapping."""
    data = json.loads(Path(tiny_plans[1]).read_text())
    del data["stages"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = runner.invoke(app, ["transition", tiny_plans[0], str(bad)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.stages: required field is missing (allowed: "
                               "a list of mappings of name, tp, pp, dp, gpus, "), r.stderr


def test_a_plan_outside_the_pool_it_records_is_refused(tiny_plans: tuple[str, str],
                                                       tmp_path: Path) -> None:
    data = json.loads(Path(tiny_plans[1]).read_text())
    data["planned_for"]["job"]["gpus"] = 2  # a hand-edited record: the plan uses GPUs 0-3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    r = runner.invoke(app, ["transition", tiny_plans[0], str(bad)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.stages: GPU ids 2-3 are outside the pool "
                               "bad.json records (0-1)"), r.stderr


LAYOUT_8B = Path("examples/layouts/verl-colocated-8b.yaml")


def test_two_layouts_with_a_model_size_the_pool_to_the_layouts(tmp_path: Path) -> None:
    """Without --config the pool was sized to the GPU ids the files use, which a layout
    without ids has none of: 'current.actor_gen: needs 16 GPUs (tp x pp x dp), the pool has
    1', with no option to say more."""
    variant = tmp_path / "L2.yaml"
    variant.write_text(LAYOUT_8B.read_text().replace("{tp: 2, pp: 1, dp: 8}",
                                                     "{tp: 4, pp: 1, dp: 4}"))
    r = runner.invoke(app, ["transition", str(LAYOUT_8B), str(variant), "--model",
                            "llama-3.1-8b", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["feasible"] and {p["stage"] for p in out["primitives"]} == {"actor_gen"}
    assert max(g for p in out["primitives"] for g in p["gpus"]) == 15
    r = runner.invoke(app, ["transition", str(LAYOUT_8B), str(variant), "--model",
                            "llama-3.1-8b"])
    assert r.exit_code == 0, r.output
    assert "llama-3.1-8b, PPO on 16 x h100-sxm-80gb" in r.stdout


def test_a_layout_past_the_largest_cluster_names_its_stage(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("actor_gen: {tp: 8, pp: 1, dp: 100000}\n")
    r = runner.invoke(app, ["transition", str(LAYOUT_8B), str(big), "--model", "llama-3.1-8b"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.actor_gen: needs 800,000 GPUs (tp x pp x dp), "
                               "more than the largest cluster (allowed: tp x pp x dp at most "
                               ), r.stderr


def _hf_config(path: Path, **shape: int) -> Path:
    import dataclasses

    from nereus.spec.model import MODEL_PRESETS

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = dataclasses.replace(MODEL_PRESETS["llama-3.1-8b"], **shape)
    path.write_text(json.dumps(spec.to_hf_dict()))
    return path


def test_models_of_one_name_are_told_apart_by_their_files(tmp_path: Path) -> None:
    """Two configs side by side in a folder called hf were both named hf ('hf differs from
    the current hf'); two config.json files in folders of one name still are, so the error
    shows where each came from."""
    plans = []
    for cfg in (_hf_config(tmp_path / "hf" / "h1.json"),
                _hf_config(tmp_path / "hf" / "h2.json", num_layers=16)):
        r = runner.invoke(app, ["plan", "--model", str(cfg), "--gpus", "8", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["planned_for"]["model"] == cfg.stem
        plans.append(tmp_path / f"{cfg.stem}-plan.json")
        plans[-1].write_text(r.stdout)
    r = runner.invoke(app, ["transition", *map(str, plans)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: target.planned_for.job.model: h2 differs from the "
                               "current h1"), r.stderr
    a = _hf_config(tmp_path / "a" / "hf" / "config.json")
    b = _hf_config(tmp_path / "b" / "hf" / "config.json", num_layers=16)
    jobs = []
    for cfg in (a, b):
        jobs.append(tmp_path / f"{cfg.parent.parent.name}.yaml")
        jobs[-1].write_text(f"model: {cfg.parent}\ngpus: 8\n")
    r = runner.invoke(app, ["transition", *map(str, jobs)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: target.model: hf from {b.parent} differs from the "
                               f"current hf from {a.parent}"), r.stderr


def test_one_config_in_two_files_is_one_model(tmp_path: Path) -> None:
    """The model is its shape: a config.json copied under another name moves nothing."""
    plans = []
    for name in ("one", "copy"):
        cfg = _hf_config(tmp_path / f"{name}.json")
        r = runner.invoke(app, ["plan", "--model", str(cfg), "--gpus", "8", "--json"])
        assert r.exit_code == 0, r.output
        plans.append(tmp_path / f"{name}-plan.json")
        plans[-1].write_text(r.stdout)
    r = runner.invoke(app, ["transition", *map(str, plans), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["primitives"] == []


@pytest.mark.parametrize("text", ["", "# nothing yet\n"])
def test_an_empty_file_is_said_to_be_empty(tmp_path: Path, text: str) -> None:
    """An empty YAML was taken for a job file: 'empty.yaml is a job file but now.json is a
    plan file'."""
    now = _plan_8b(tmp_path, "now.json")
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    r = runner.invoke(app, ["transition", str(now), str(empty)])
    assert r.exit_code == 2, r.output
    # the path as typed (it said the file's name alone)
    assert r.stderr.startswith(f"error: target: {empty} is empty (allowed: "), r.stderr
    empty_json = tmp_path / "empty.json"
    empty_json.write_text("\n")  # was "not valid JSON (Expecting value: line 1, column 1)"
    r = runner.invoke(app, ["transition", str(empty_json), str(now)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: current: "), r.stderr
    assert "empty.json is empty" in r.stderr, r.stderr


def test_a_section_given_as_a_value_lists_its_fields(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama-3.1-8b\ngpus: 16\ncluster: h100\n")
    r = runner.invoke(app, ["transition", str(job), CONFIG_8B])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == ("error: current.cluster: must be a mapping of fields (allowed: "
                                "device, nodes, devices_per_node, device_memory_gib)")


def test_json_carries_the_peak_memory_and_the_bytes_moved(tmp_path: Path) -> None:
    """The table printed the peak memory and the bytes moved per model-stage; --json had
    neither."""
    now = _plan_8b(tmp_path, "now.json")
    args = ["transition", str(LAYOUT_8B), str(now), "--config", CONFIG_8B]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {"source", "estimated_s", "feasible", "primitives",
            "loads_on_first_read"} <= set(out)
    assert out["source"] == "estimated"
    peak = out["peak_memory"]
    assert set(peak) == {"gpu", "bytes", "capacity_bytes"}
    assert 0 < peak["bytes"] <= peak["capacity_bytes"]
    moved, changed = out["bytes_moved"], {p["stage"] for p in out["primitives"]}
    assert set(moved) == {"actor_gen", "reference_infer", "reward_infer", "critic_infer",
                          "actor_train", "critic_train"}  # every model-stage of the job
    assert any(moved[s] > 0 for s in changed)  # a stage only destroyed moves no bytes
    assert all(n == 0 for s, n in moved.items() if s not in changed)
    assert set(out["sources"]) == {"peak_memory", "bytes_moved"}
    assert all(v.startswith("estimated") for v in out["sources"].values())
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    from nereus.transition.sizes import format_bytes

    assert (f"peak memory {format_bytes(peak['bytes'])} on GPU {peak['gpu']} of "
            f"{format_bytes(peak['capacity_bytes'])}") in table.stdout
    for name, n in moved.items():
        row = next(ln for ln in table.stdout.splitlines() if ln.startswith(f"│ {name} "))
        assert (format_bytes(n) if name in changed else "unchanged") in row, row


@pytest.mark.parametrize("option,value,says", [
    ("--algo", "foo", "error: --algo: 'foo' is not allowed"),
    ("--device", "foo", "error: --device: unknown device 'foo'"),
    ("--devices-per-node", "0", "error: --devices-per-node: 0 is not allowed"),
])
def test_a_bad_option_value_is_named_before_the_missing_model(
        tiny_plans: tuple[str, str], tmp_path: Path, option: str, value: str,
        says: str) -> None:
    """`--algo foo` said only that --model is needed; adding --model then led to the option's
    own error. A valid option alone still asks for the job (the records answer without it)."""
    old = tmp_path / "old"
    old.mkdir()
    for pair in (tiny_plans, (_without_job(tiny_plans[0], old),
                              _without_job(tiny_plans[1], old))):
        r = runner.invoke(app, ["transition", *pair, option, value])
        assert r.exit_code == 2, r.output
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(says), r.stderr
        assert "(allowed: " in r.stderr, r.stderr
    r = runner.invoke(app, ["transition", *tiny_plans, "--devices-per-node", "4"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --model: needed"), r.output


def _edited(path: str, tmp: Path, edit: Callable[[dict], None]) -> str:
    """``path``'s plan JSON after ``edit``, written to ``tmp``."""
    data = json.loads(Path(path).read_text())
    edit(data)
    out = tmp / "edited.json"
    out.write_text(json.dumps(data))
    return str(out)


def _set(data: dict, stage: int, field: str, value: object) -> None:
    data["stages"][stage][field] = value


@pytest.mark.parametrize("edit,says", [
    (lambda d: _set(d, 0, "tp", 3),
     ("error: target.stages.0: actor_gen: a replica lists 1 GPU for tp x pp = 3 (allowed: 4 "
      "GPU lists (one per DP replica) of 3 GPU ids each (tp x pp), no GPU in two places)")),
    (lambda d: _set(d, 0, "gpus", [[0], [1], [2], [0]]),
     ("error: target.stages.0: actor_gen: a GPU appears twice (allowed: 4 GPU lists (one per "
      "DP replica) of 1 GPU id each (tp x pp), no GPU in two places)")),
    (lambda d: d.update(stages=[s for s in d["stages"] if s["name"] != "critic_train"]),
     ("error: target.stages: lacks model-stage 'critic_train', which groups lists (allowed: "
      "an entry under stages for every model-stage groups lists, or groups without "
      "critic_train)")),
    # a name no workflow has is the group's own mistake
    (lambda d: d["groups"][0].__setitem__(0, "reference_inferr"),
     ("error: target.groups: names model-stages not in the plan: ['reference_inferr'] "
      "(allowed: actor_gen, reference_infer, reward_infer, critic_infer, actor_train, "
      "critic_train)")),
], ids=["tp", "gpu-twice", "stage-deleted", "group-typo"])
def test_plan_file_errors_say_what_is_allowed(tiny_plans: tuple[str, str], tmp_path: Path,
                                              edit: Callable[[dict], None], says: str) -> None:
    """A replica of the wrong size or a GPU listed twice said no "allowed"; a model-stage
    deleted from stages was blamed on the groups that still named it."""
    bad = _edited(tiny_plans[1], tmp_path, edit)
    for extra in ([], TINY):
        r = runner.invoke(app, ["transition", tiny_plans[0], bad, *extra])
        assert r.exit_code == 2 and r.stderr == says + "\n", r.output


def test_gantt_of_an_infeasible_move_says_no_chart_was_written(tmp_path: Path) -> None:
    """Exit 3 and the reason, but no PNG and no word of it."""
    cur = plan_file(tmp_path, "a.json", [stage("reference_infer", 1, 4, [[0, 1, 2, 3]]),
                                         stage("reward_infer", 1, 4, [[4, 5, 6, 7]])])
    tgt = plan_file(tmp_path, "b.json", [stage("reference_infer", 1, 4, [[4, 5, 6, 7]]),
                                         stage("reward_infer", 1, 4, [[0, 1, 2, 3]])])
    out = tmp_path / "inf.png"
    r = runner.invoke(app, ["transition", cur, tgt, "--model", "llama-3.1-8b", "--gantt",
                            str(out)])
    assert r.exit_code == 3, r.output
    assert not out.exists()
    note, reason = r.stderr.splitlines()
    assert note == (f"note: no Gantt chart written to {out}: the transition is infeasible, so "
                    "there is no schedule to draw")
    assert reason.startswith("error: infeasible transition")
    without = runner.invoke(app, ["transition", cur, tgt, "--model", "llama-3.1-8b"])
    assert without.exit_code == 3 and without.stderr == reason + "\n"


def test_a_plan_that_does_not_fit_memory_is_bad_input_naming_its_stage(tmp_path: Path) -> None:
    """A plan file ``plan --evaluate`` scored ``fits: false`` (actor training unsharded on
    each GPU) was taken as a plan, and the transition to it was infeasible, blamed on a Merge
    of it: no move can reach or leave a plan that itself does not fit."""
    lay = tmp_path / "over.yaml"
    lay.write_text(LAYOUT_8B.read_text().replace("actor_train:     {tp: 4, pp: 2, dp: 2}",
                                                 "actor_train:     {tp: 1, pp: 1, dp: 16}"))
    r = runner.invoke(app, ["plan", "--config", CONFIG_8B, "--evaluate", str(lay), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["fits"] is False, r.output
    over = tmp_path / "over.json"
    over.write_text(r.stdout)
    now = _plan_8b(tmp_path, "now.json")
    for args, which in (([over, now], "current"), ([now, over], "target")):
        r = runner.invoke(app, ["transition", *map(str, args)])
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: {which}.stages.4: over.json's actor_train plan "
                                   "exceeds memory: it needs 166.5 GiB on GPU 0 "), r.stderr
        assert "(estimated)" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = runner.invoke(app, ["transition", str(lay), str(now), "--config", CONFIG_8B])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: current.actor_train: over.yaml's actor_train plan "
                               "exceeds memory"), r.stderr
