"""``nereus simulate``: the plot names the run it came from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from nereus.cli import app

if TYPE_CHECKING:
    from nereus.sim.scenarios import Scenario
    from nereus.sim.simulator import SimResult

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenarios" / "node-outage-8b.yaml"


@pytest.fixture()
def titles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The title of every figure ``simulate --plot`` saves (the file itself is written)."""
    from matplotlib.figure import Figure

    seen: list[str] = []
    save = Figure.savefig

    def record(self: Figure, *args: object, **kwargs: object) -> None:
        seen.append(self.axes[0].get_title())
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    return seen


@pytest.mark.parametrize("args,says,not_says", [
    (["--config", str(SCENARIO)],
     "nereus simulate --config node-outage-8b.yaml (scenario node-outage-8b) --steps 3",
     "--scenario"),
    (["--scenario", "stationary", "--seed", "2"],
     "nereus simulate --scenario stationary --seed 2 --steps 3", "--config"),
])
def test_the_plot_title_names_the_run_as_given(tmp_path: Path, titles: list[str],
                                               args: list[str], says: str,
                                               not_says: str) -> None:
    """A --config run's plot said ``--scenario node-outage-8b``: a command that does not
    exist (the built-in scenarios have other names)."""
    out = tmp_path / "steps.png"
    r = runner.invoke(app, ["simulate", *args, "--steps", "3", "--policies", "static",
                            "--plot", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert len(titles) == 1
    assert titles[0].startswith(says) and not_says not in titles[0], titles[0]
    assert titles[0].endswith("(simulated)")


def test_json_and_csv_carry_what_the_table_prints(tmp_path: Path) -> None:
    """--json left out mean step, restart, lost, paused and checkpoint seconds and the
    calibrator's error; the table and the CSV had no checkpoint seconds."""
    import csv
    import json

    rows = tmp_path / "rows.csv"
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "12",
                            "--policies", "static,nereus", "--csv", str(rows), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for name in ("static", "nereus"):
        p = out["policies"][name]
        for k in ("tokens_per_s", "mean_step_s", "transitions", "transition_s", "restarts",
                  "restart_s", "lost_s", "paused_s", "checkpoint_s", "calib_error_at_step_10"):
            assert k in p, (name, k)
    assert out["policies"]["nereus"]["calib_error_at_step_10"] > 0
    assert out["policies"]["static"]["calib_error_at_step_10"] is None  # no calibrator
    with open(rows) as f:
        got = list(csv.DictReader(f))
    by = {}
    for g in got:
        by[g["policy"]] = by.get(g["policy"], 0.0) + float(g["checkpoint_s"])
    assert by["nereus"] == pytest.approx(out["policies"]["nereus"]["checkpoint_s"])
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "12",
                            "--policies", "static"])
    assert r.exit_code == 0, r.output
    assert "checkpoint s" in r.stdout


def test_json_and_csv_name_the_run_they_come_from(tmp_path: Path) -> None:
    """--gamma, --steps and --seed reached only the plot's title: --json of --gamma 0.1
    --steps 3 read as the defaults' did, and the CSV's rows named no scenario."""
    import csv
    import json

    def run(*args: str) -> tuple[dict, list[dict[str, str]]]:
        rows = tmp_path / "rows.csv"
        r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--policies", "static",
                                "--csv", str(rows), "--json", *args])
        assert r.exit_code == 0, r.output
        with open(rows) as f:
            return json.loads(r.stdout), list(csv.DictReader(f))

    out, rows = run("--steps", "3", "--gamma", "0.1", "--seed", "2")
    assert out["run"] == {"scenario": "stationary", "steps": 3, "seed": 2, "gamma": 0.1,
                          "policies": ["static"], "command": "nereus simulate --scenario "
                          "stationary --seed 2 --steps 3 --gamma 0.1 --policies static"}
    assert out["scenario"] == "stationary" and out["source"] == "simulated"
    assert {k for k in out["policies"]["static"]} >= {"tokens_per_s", "transitions",
                                                      "transition_s", "restarts"}
    assert [(g["scenario"], g["seed"], g["gamma"], g["policy"], g["step"]) for g in rows] == \
        [("stationary", "2", "0.1", "static", str(k)) for k in range(3)]
    default, rows = run("--steps", "2")
    assert default["run"]["gamma"] == 0.5 and default["run"]["seed"] == 0
    assert default["run"]["steps"] == 2 and default["run"] != out["run"]
    assert {(g["seed"], g["gamma"]) for g in rows} == {("0", "0.5")}


def test_the_table_says_what_mean_step_adds_up() -> None:
    """mean step s counts checkpoint writes (and transitions, restarts, lost work): the table
    says so rather than leave it to be read as the step alone."""
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "2",
                            "--policies", "static"])
    assert r.exit_code == 0, r.output
    assert "mean step s: the step plus its transitions, restarts, lost work and checkpoint " \
        "writes (pauses excepted); tokens/s: response tokens over that time" \
        in " ".join(r.stdout.split())


def test_minor_ticks_of_a_log_axis_under_a_decade_all_have_labels() -> None:
    """13 to 45 s a step had one label (20): every minor tick gets one within a decade, only
    2x and 5x a power of ten beyond it."""
    from nereus.commands.simplot import minor_label

    assert [minor_label(v, (13.0, 45.0)) for v in (20.0, 30.0, 40.0)] == ["20", "30", "40"]
    assert [minor_label(v, (10.0, 400.0)) for v in (20.0, 30.0, 50.0, 300.0)] == \
        ["20", "", "50", ""]


@pytest.fixture(scope="module")
def churn() -> tuple[Scenario, SimResult]:
    """14 steps of the default scenario: the pool shrinks and grows, a checkpoint is written
    (step 9), static and Nereus restart, Nereus and the oracle move."""
    from nereus.sim.scenarios import builtin, run_scenario

    sc = builtin("default", steps=14)
    return sc, run_scenario(sc, ["static", "nereus", "oracle"], workers=1)


def _panels(monkeypatch: pytest.MonkeyPatch, res: SimResult, sc: Scenario, path: Path
            ) -> list[dict[str, object]]:
    """Each axes of the figure ``plot`` saves: its y label, lines by label, markers."""
    from matplotlib.figure import Figure

    from nereus.commands.simulate import plot

    seen: list[list[dict[str, object]]] = []

    def record(self: Figure, *args: object, **kwargs: object) -> None:
        seen.append([{"ylabel": " ".join(ax.get_ylabel().split()),
                      "lines": {ln.get_label(): ([float(x) for x in ln.get_xdata()],
                                                 [float(y) for y in ln.get_ydata()])
                                for ln in ax.get_lines()},
                      "marks": [[(float(x), float(y)) for x, y in c.get_offsets()]
                                for c in ax.collections]} for ax in self.axes])

    monkeypatch.setattr(Figure, "savefig", record)
    plot(res, sc, path)
    (axes,) = seen
    return axes


def test_the_step_panel_leaves_out_checkpoints_restarts_and_lost_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, churn: tuple[Scenario, SimResult]) -> None:
    """One axis of ``busy_s`` per step: the checkpoint writes and restarts (10x a step) hid
    the policies' differences. The step panel draws the step and its transitions only, a ^ on
    each policy's line where a move came before the step."""
    sc, res = churn
    step_panel = _panels(monkeypatch, res, sc, tmp_path / "steps.png")[0]
    assert "simulated" in step_panel["ylabel"]
    assert "no checkpoint writes, restarts or lost work" in step_panel["ylabel"]
    every = sc.restart.checkpoint_interval_steps
    for i, (name, r) in enumerate(res.results.items()):
        xs, ys = step_panel["lines"][name]
        assert xs == [row.step for row in r.rows]
        assert ys == [row.step_s + row.transition_s for row in r.rows], name
        ckpt = r.rows[every - 1]
        assert ckpt.checkpoint_s > 0 and ys[every - 1] < ckpt.busy_s  # the write left out
        moves = sorted({e.step for e in r.events if e.kind == "move"})
        assert step_panel["marks"][i] == [(k, ys[k]) for k in moves], name
    assert step_panel["marks"][1] and step_panel["marks"][2]  # Nereus and the oracle moved


def test_the_gap_panel_adds_up_all_mean_step_counts_behind_the_oracle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, churn: tuple[Scenario, SimResult]) -> None:
    """The time lost behind the oracle so far, in minutes: checkpoint writes, restarts and
    lost work in it (its last value is the difference of the busy times the table's mean step
    s averages), an x on each policy's line where a restart came before the step."""
    sc, res = churn
    gap_panel = _panels(monkeypatch, res, sc, tmp_path / "steps.png")[1]
    assert gap_panel["ylabel"] == "time behind oracle so far, min (simulated)"
    oracle = res.results["oracle"]
    for i, (name, r) in enumerate(res.results.items()):
        ((label, (xs, ys)),) = [(k, v) for k, v in gap_panel["lines"].items()
                                if k.startswith(f"{name} (")]
        assert xs == [row.step for row in r.rows]
        assert ys[-1] * 60 == pytest.approx(r.busy_s - oracle.busy_s, rel=1e-9, abs=1e-6)
        assert ys[-1] * 60 == pytest.approx(len(r.rows) * (r.mean_step_s - oracle.mean_step_s),
                                            rel=1e-9, abs=1e-6)
        restarts = sorted({e.step for e in r.events if e.kind == "restart"})
        assert gap_panel["marks"][i] == [(k, ys[k]) for k in restarts], name
        if name != "oracle":
            assert f"{ys[-1]:+,.1f} min at the end" in label
    assert res.results["static"].restarts and res.results["nereus"].restarts
    assert gap_panel["lines"]["oracle (the reference)"][1] == [0.0] * len(oracle.rows)


def test_without_the_oracle_the_gaps_are_behind_the_fastest_policy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, churn: tuple[Scenario, SimResult]) -> None:
    from nereus.sim.simulator import SimResult

    sc, res = churn
    two = SimResult(res.scenario, {n: res.results[n] for n in ("static", "nereus")})
    gap_panel = _panels(monkeypatch, two, sc, tmp_path / "steps.png")[1]
    assert gap_panel["ylabel"] == "time behind nereus so far, min (simulated)"
    static, nereus = res.results["static"], res.results["nereus"]
    assert static.busy_s > nereus.busy_s
    _, ys = gap_panel["lines"]["nereus (the reference)"]
    assert ys == [0.0] * len(nereus.rows)
    ((_, ys),) = [v for k, v in gap_panel["lines"].items() if k.startswith("static (")]
    assert ys[-1] * 60 == pytest.approx(static.busy_s - nereus.busy_s, rel=1e-9)


def test_gaps_of_a_long_run_are_drawn_in_hours() -> None:
    from nereus.commands.simplot import gap_unit

    assert gap_unit([0.0, -60.0, 4.9 * 3600]) == ("min", 60.0)
    assert gap_unit([0.0, -5 * 3600.0]) == ("h", 3600.0)
    assert gap_unit([]) == ("min", 60.0)


def test_the_context_panel_draws_the_pool_of_the_trace_and_the_lengths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, churn: tuple[Scenario, SimResult]) -> None:
    """The pool each step ended on (the scenario's availability, aligned to steps: the same
    for every policy) and the mean response length on a twin axis."""
    from nereus.sim.scenarios import simulator

    sc, res = churn
    *_, pool_panel, length_axis = _panels(monkeypatch, res, sc, tmp_path / "steps.png")
    events = simulator(sc).events
    trace = [float(len(ev.changes[-1][2] if ev.changes else ev.pool)) for ev in events]
    xs, ys = pool_panel["lines"]["GPUs in the pool"]
    assert xs == list(range(sc.steps)) and ys == trace
    assert len(set(ys)) > 1  # the pool changed
    for r in res.results.values():
        assert [float(row.pool_gpus) for row in r.rows] == trace
    _, ys = length_axis["lines"]["mean response length"]
    assert ys == [row.response_len_mean for row in res.results["static"].rows]
    # the pause before step 0 (3 GPUs, which no plan fits, for the first 5 minutes) has a
    # mark: the pool a step ended on cannot show it
    paused = [row.step for row in res.results["static"].rows if row.paused_s > 0]
    assert paused and pool_panel["marks"] == [[(float(k), 0.0) for k in paused]]
    assert pool_panel["ylabel"] == "GPUs in the pool (simulated)"
    assert length_axis["ylabel"] == "mean response length, tokens (simulated)"


def test_the_log_help_says_where_a_decision_within_a_step_is_charged() -> None:
    """--log said a decision logged at step k is charged to row k + 1; after an
    out-of-memory crash in step k the restart is logged at step k (the crashed step's
    telemetry) and charged to row k, where the step runs again."""
    r = runner.invoke(app, ["simulate", "--help"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.replace("│", " ").split())
    assert "charges its move or restart to step k + 1" in text, text
    assert "(it ran out of memory and runs again, or a first step that lost GPUs) is " \
        "logged at step k and charged to step k" in text, text



def test_each_logged_decision_is_one_line_at_any_width() -> None:
    """The log was wrapped at the 160 columns of a console that is not a terminal (a pipe, a
    file): a decision of 400 characters took three lines, and grep for its step found its
    first. Every decision is one line: its trigger, ``--``, its verdict and its source."""
    import re

    r = runner.invoke(app, ["simulate", "--scenario", "churn", "--steps", "60", "--log"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    # the decisions come after the calibrator's line, each one line
    log = lines[next(i for i, t in enumerate(lines) if t.startswith("Nereus calibrator")) + 1:]
    assert log and all(re.match(r"(static|replan_always|nereus|oracle): step \d+ ", t)
                       for t in log), log
    assert all(" -- " in t and t.endswith("(estimated)") for t in log), log
    assert max(len(t) for t in log) > 160  # a line the old console broke


def test_the_json_command_runs_the_same_run_again(tmp_path: Path) -> None:
    """``run.command`` left out --policies, and with --config printed ``--config FILE
    (scenario NAME)``, which no shell runs. It is a command line: run again, it gives the same
    numbers, the --config path as given (a space in it quoted)."""
    import json
    import shlex
    import shutil

    spaced = tmp_path / "my scenarios"
    shutil.copytree(SCENARIO.parent, spaced)
    for args in (["--scenario", "churn", "--seed", "3", "--steps", "4", "--gamma", "0.3",
                  "--policies", "nereus"],
                 ["--config", str(spaced / SCENARIO.name), "--steps", "4",
                  "--policies", "oracle,static"]):
        r = runner.invoke(app, ["simulate", *args, "--json"])
        assert r.exit_code == 0, r.output
        first = json.loads(r.stdout)
        argv = shlex.split(first["run"]["command"])
        assert argv[:2] == ["nereus", "simulate"], argv
        assert argv[2:] == args, argv  # every option of the run, in order
        again = runner.invoke(app, [*argv[1:], "--json"])
        assert again.exit_code == 0, again.output
        second = json.loads(again.stdout)
        assert second["run"] == first["run"]
        assert {n: p["tokens_per_s"] for n, p in second["policies"].items()} == \
            {n: p["tokens_per_s"] for n, p in first["policies"].items()}


def test_the_csv_says_which_steps_each_transition_came_before(tmp_path: Path) -> None:
    """The oracle's transitions are free: its rows' transition_s were all 0 while the table
    counted its moves, and no column showed them. ``transitions`` counts the moves before each
    step: summed, every policy's transitions in --json."""
    import csv
    import json

    rows = tmp_path / "rows.csv"
    r = runner.invoke(app, ["simulate", "--scenario", "churn", "--steps", "60",
                            "--csv", str(rows), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    with open(rows) as f:
        got = list(csv.DictReader(f))
    for name, p in out["policies"].items():
        mine = [g for g in got if g["policy"] == name]
        assert sum(int(g["transitions"]) for g in mine) == p["transitions"], name
    oracle = [g for g in got if g["policy"] == "oracle"]
    assert out["policies"]["oracle"]["transitions"] > 0
    assert all(float(g["transition_s"]) == 0 for g in oracle)  # free: the count shows them

@pytest.mark.parametrize("example", sorted((ROOT / "examples" / "scenarios").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_example_scenario_runs(example: Path) -> None:
    import json

    r = runner.invoke(app, ["simulate", "--config", str(example), "--steps", "3",
                            "--policies", "static,nereus", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["source"] == "simulated" and set(out["policies"]) == {"static", "nereus"}


def test_the_file_traces_example_meets_every_trace_it_names() -> None:
    """The shipped example's run ended at 2,456 s, before its pool's loss at 1 h, and its
    drift slowed allreduce.inter, which no step of its plans uses: the four policies came out
    equal. Its pool now changes inside the run, its drift slows what the plan runs, and the
    policies differ."""
    import json

    from nereus.plan.search import best_plan
    from nereus.sim.scenarios import load_scenario, simulator

    cfg = ROOT / "examples" / "scenarios" / "file-traces-8b.yaml"
    sc = load_scenario(cfg)
    sim = simulator(sc)
    met = [(k, len(ch[-1])) for k, e in enumerate(sim.events) for ch in e.changes]
    # the loss and the return, both inside the run (--csv shows them at steps 23 and 41)
    assert [n for _, n in met] == [8, 16] and 15 < met[0][0] < met[1][0] < 45, met
    (period, *_), truth = sc.drift.periods, sim.truth
    k, full = period.start_step, tuple(range(16))
    mean, longest = sc.lengths.mean[k], sc.lengths.longest[k]
    plan = best_plan(truth.job_at(full, mean, longest), truth.hidden)
    slow = truth.price(plan, full, k, mean, longest).step_s
    usual = truth.price(plan, full, k - 1, mean, longest).step_s  # same lengths, no drift
    assert slow > 1.05 * usual, (slow, usual)
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static,nereus",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)["policies"]
    assert out["static"]["restarts"] == 1 and out["nereus"]["transitions"] >= 1
    assert out["nereus"]["tokens_per_s"] > 1.1 * out["static"]["tokens_per_s"]


def test_steps_beyond_a_lengths_file_are_refused_naming_steps(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "scenarios" / "file-traces-8b.yaml").read_text())
    for name in ("lengths.csv", "file-traces-pool.csv", "drift.csv"):
        (tmp_path / name).write_text((ROOT / "examples" / "scenarios" / name).read_text())
    data["steps"] = 200  # the file has 60
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    assert "steps" in r.stderr and "60" in r.stderr and "Traceback" not in r.output


def test_a_bad_lengths_row_names_its_file_row_and_columns(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "scenarios" / "file-traces-8b.yaml").read_text())
    for name in ("file-traces-pool.csv", "drift.csv"):
        (tmp_path / name).write_text((ROOT / "examples" / "scenarios" / name).read_text())
    (tmp_path / "lengths.csv").write_text("step,response_len_mean,response_len_max\n"
                                          "0,500,700\n1,600,500\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "lengths.csv" in line and "row 3" in line and "response_len_max" in line
    assert len(line.splitlines()) == 1


JOB = {"model": "llama-3.1-8b", "algo": "ppo", "gpus": 16,
       "cluster": {"device": "h100-sxm-80gb", "devices_per_node": 8}}


def _scenario(folder: Path, file: str = "s.yaml", **fields: object) -> Path:
    """A scenario YAML of the 16-GPU job and ``fields`` (its name, traces...)."""
    import yaml

    cfg = folder / file
    cfg.write_text(yaml.safe_dump({"job": JOB, **fields}))
    return cfg


def test_scenario_text_prints_as_written_not_as_rich_markup(tmp_path: Path) -> None:
    """A description with "[/]" was a MarkupError traceback; a name "[red]run[/red]" printed
    as "run"; notes lost their brackets too."""
    cfg = _scenario(tmp_path, name="[red]run[/red]", description="pool from [/] scheduler log",
                    notes={"availability": "see [bold]x"})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static"])
    assert r.exit_code == 0, r.output
    assert "[red]run[/red]: pool from [/] scheduler log -- 2 steps" in r.stdout
    assert "[red]run[/red]: 2 steps (simulated)" in r.stdout  # the table's title
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--notes"])
    assert r.exit_code == 0, r.output
    assert "[red]run[/red]: pool from [/] scheduler log -- 2 steps" in r.stdout
    assert "see [bold]x" in r.stdout


def test_a_dollar_in_the_scenario_or_file_name_is_drawn_as_written(tmp_path: Path,
                                                                 titles: list[str]) -> None:
    """matplotlib read "$x^{$" as a formula: a ParseSyntaxException after the run, exit 1,
    the table lost."""
    cfg = _scenario(tmp_path, "c_$y^{$.yaml", name="spot $x^{$")
    out, rows = tmp_path / "d.png", tmp_path / "d.csv"
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static", "--plot", str(out), "--csv", str(rows)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG" and rows.stat().st_size > 0
    assert "--config c_$y^{$.yaml (scenario spot $x^{$)" in titles[0]


@pytest.mark.parametrize("as_json", [False, True])
def test_a_plot_that_cannot_be_saved_is_one_line_after_the_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool) -> None:
    """A save failure other than OSError was a traceback, and the results were not printed
    yet: the run was lost."""
    import json

    from matplotlib.figure import Figure

    def fail(self: Figure, *args: object, **kwargs: object) -> None:
        raise ValueError("cannot lay out the title\nsecond line")

    monkeypatch.setattr(Figure, "savefig", fail)
    rows = tmp_path / "d.csv"
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "2",
                            "--policies", "static", "--csv", str(rows),
                            "--plot", str(tmp_path / "d.png"), *(["--json"] if as_json else [])])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [
        f"error: --plot: cannot draw {tmp_path / 'd.png'}: cannot lay out the title"]
    if as_json:
        assert json.loads(r.stdout)["policies"]["static"]["tokens_per_s"] > 0
    else:
        assert "stationary: 2 steps (simulated)" in r.stdout
        assert f"wrote per-step rows to {rows}" in r.stdout
    assert rows.stat().st_size > 0


@pytest.mark.parametrize("option,target", [("--csv", "lengths.csv"),
                                           ("--csv", "sub/../file-traces-pool.csv"),
                                           ("--csv", "link.csv")])
def test_an_output_that_is_an_input_of_the_scenario_is_refused(tmp_path: Path, option: str,
                                                               target: str) -> None:
    """--csv lengths.csv overwrote the scenario's lengths trace, silently."""
    ex = ROOT / "examples" / "scenarios"
    for name in ("lengths.csv", "file-traces-pool.csv", "drift.csv"):
        (tmp_path / name).write_text((ex / name).read_text())
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").hardlink_to(tmp_path / "drift.csv")
    cfg = tmp_path / "s.yaml"
    cfg.write_text((ex / "file-traces-8b.yaml").read_text())
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")}
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static", option, str(tmp_path / target)])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert line.startswith(f"error: {option}: ") and "overwrite" in line
    assert len(line.splitlines()) == 1 and r.stdout == ""
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.csv")} == before


def test_an_output_that_is_the_scenarios_spot_trace_is_refused(tmp_path: Path) -> None:
    """A spot trace of the user's own is an input too (here one named .csv, as --csv writes)."""
    import json

    from nereus.sim.traces import spot_counts

    counts, tick = spot_counts()
    spot = tmp_path / "spot.csv"
    spot.write_text(json.dumps({"metadata": {"gap_seconds": tick}, "data": counts}))
    before = spot.read_bytes()
    cfg = _scenario(tmp_path, availability={"spot": {"file": "spot.csv", "start_tick": 3372}})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static", "--csv", str(spot)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: --csv: {spot} is the scenario's "
                               "availability.spot.file"), r.stderr
    assert spot.read_bytes() == before


def test_churn_on_one_node_says_it_needs_two(tmp_path: Path) -> None:
    """It said "min_nodes: leaves no node to take away (allowed: 1..0)"."""
    cfg = _scenario(tmp_path, job={**JOB, "gpus": 8}, availability={"churn": {}})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "churn" in line and "at least 2" in line
    assert "job.gpus" in line and "1..0" not in line


def test_one_step_is_counted_in_the_singular() -> None:
    """The header line and the table's title said "1 steps"."""
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "1",
                            "--policies", "static"])
    assert r.exit_code == 0, r.output
    assert "-- 1 step, policy static (simulated)" in r.stdout
    assert "stationary: 1 step (simulated)" in r.stdout
    assert "1 steps" not in r.stdout


def test_lengths_past_the_context_window_are_refused_naming_the_field(tmp_path: Path) -> None:
    """It was "scenario: no plan fits ... fits nowhere ... 99.9 GiB", a memory problem."""
    cfg = _scenario(tmp_path, steps=5, lengths={"growth": {"start": 500, "end": 200000}})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in r.output
    assert line.startswith("error: lengths.growth.end: ")
    assert "context window of 131072 tokens" in line and "GiB" not in line
    (tmp_path / "l.csv").write_text("step,response_len_mean,response_len_max\n0,500,200000\n")
    cfg = _scenario(tmp_path, "c.yaml", lengths={"csv": "l.csv"})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().startswith(f"error: lengths ({tmp_path / 'l.csv'}) row "
                                       "2.response_len_max: prompt 512 + longest response "
                                       "200000 = 200512 tokens exceed")


def test_notes_list_the_sources_without_simulating(monkeypatch: pytest.MonkeyPatch) -> None:
    """--notes ran the whole default simulation (1,000 steps, ~30 s) before listing the
    sources, which are the scenario's and need no run."""
    import nereus.commands.simulate as cmd

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("--notes simulated")

    monkeypatch.setattr(cmd, "run_scenario", no_run)
    monkeypatch.setattr(cmd, "simulator", no_run)
    r = runner.invoke(app, ["simulate", "--notes", "--steps", "3", "--gamma", "0.3"])
    assert r.exit_code == 0, r.output
    assert "parameters and their sources" in r.stdout
    assert "--gamma on the command line (0.3)" in r.stdout  # the options' notes too
    assert "tokens/s" not in r.stdout  # no results table


def test_notes_give_each_parameters_value_beside_its_source() -> None:
    """--notes said 'take a few minutes' and 'computed' where the run uses 180 s and a
    checkpoint of 248.6 GB read at a restart (217.5 GB written): the values are a column."""
    from nereus.commands.simulate import note_value
    from nereus.sim.scenarios import builtin

    sc = builtin("default", steps=3)
    assert note_value(sc, "control.gamma") == "0.5"
    assert note_value(sc, "control.admission") == "true"
    assert note_value(sc, "restart.startup_s") == "180 s"
    assert note_value(sc, "restart.storage_read_bw_per_node") == "2 GB/s per node"
    assert note_value(sc, "restart.checkpoint_interval_steps") == "10 steps"
    assert note_value(sc, "restart.checkpoint_bytes") == "248.6 GB read, 217.5 GB written"
    assert note_value(sc, "lengths") == ""  # a trace: its note is its value
    r = runner.invoke(app, ["simulate", "--notes", "--steps", "3"], env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if "restart.startup_s" in line)
    assert "180 s" in row


@pytest.mark.parametrize("option", [["--csv", "rows.csv"], ["--plot", "steps.png"], ["--log"],
                                    ["--json"]])
def test_notes_refuse_what_needs_a_run(option: list[str], tmp_path: Path) -> None:
    args = [o if not o.endswith((".csv", ".png")) else str(tmp_path / o) for o in option]
    r = runner.invoke(app, ["simulate", "--notes", *args])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: --notes: cannot be combined with {option[0]} "
                               "(allowed: --notes alone"), r.stderr
    assert not any(tmp_path.iterdir())


def test_a_grpo_scenario_without_groups_is_refused_as_plan_refuses_it(tmp_path: Path) -> None:
    """nereus plan refused the GRPO job with one response per prompt (exit 2); nereus
    simulate ran it (exit 0)."""
    cfg = _scenario(tmp_path)
    cfg.write_text(cfg.read_text().replace("algo: ppo", "algo: grpo"))
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: job.workload.responses_per_prompt: 1 response per "
                               "prompt leaves grpo no group"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.output


def test_job_gpus_caps_the_pool_an_availability_file_gives(tmp_path: Path) -> None:
    """gpus: 12 with a file listing 0-15 ran on 16 GPUs (pool_gpus, plan_gpus = 16, 16)."""
    import csv

    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,0-15\n")
    cfg = _scenario(tmp_path, availability={"csv": "pool.csv"})
    cfg.write_text(cfg.read_text().replace("gpus: 16", "gpus: 12"))
    rows = tmp_path / "rows.csv"
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--steps", "2", "--policies",
                            "static", "--csv", str(rows)])
    assert r.exit_code == 0, r.output
    with open(rows) as f:
        got = list(csv.DictReader(f))
    assert got and {g["pool_gpus"] for g in got} == {"12"}
    assert all(int(g["plan_gpus"]) <= 12 for g in got)


@pytest.mark.parametrize("fields,start", [
    ({"lengths": {"csv": "l.csv"}}, 7),        # the lengths file has 5 steps
    ({"lengths": {"csv": "l.csv"}}, 5),        # step 5 is the first past them
    ({"steps": 3}, 4),                         # steps: in the file
])
def test_a_drift_period_past_the_run_is_refused_naming_its_row(tmp_path: Path,
                                                               fields: dict[str, object],
                                                               start: int) -> None:
    """A drift row starting past the run's last step was dropped with a note only --notes
    printed: the run said nothing, and the user believed the drift was simulated."""
    (tmp_path / "l.csv").write_text("step,response_len_mean,response_len_max\n"
                                    + "".join(f"{k},500,700\n" for k in range(5)))
    (tmp_path / "d.csv").write_text("start_step,end_step,op_class,factor\n"
                                    f"1,3,gemm,0.5\n{start},{start + 4},gemm,0.5\n")
    cfg = _scenario(tmp_path, drift={"csv": "d.csv"}, **fields)
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in r.output
    last = fields.get("steps", 5)
    assert line.startswith(f"error: drift ({tmp_path / 'd.csv'}) row 3.start_step: {start} is "
                           f"past the run's last step {last - 1}"), line
    assert line.endswith(f"(allowed: 0..{last - 1}, or a longer run)"), line


def test_a_drift_period_that_ends_past_the_run_is_cut_and_runs(tmp_path: Path) -> None:
    """One that starts inside the run still runs (cut at its end, as the notes say)."""
    (tmp_path / "d.csv").write_text("start_step,end_step,op_class,factor\n1,30,gemm,0.5\n")
    cfg = _scenario(tmp_path, steps=3, drift={"csv": "d.csv"})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--notes"])
    assert r.exit_code == 0, r.output
    assert "1 period cut to end at step 3" in r.stdout.replace("\n", " ").replace("│", "")


def test_an_availability_file_that_changes_only_after_the_run_is_refused(tmp_path: Path
                                                                         ) -> None:
    """A pool file whose only change comes after the run's last step (on the nominal clock)
    was run as a constant pool, without a word: the outage the user wrote was never met."""
    (tmp_path / "l.csv").write_text("step,response_len_mean,response_len_max\n"
                                    + "".join(f"{k},500,700\n" for k in range(5)))
    (tmp_path / "pool.csv").write_text("time_s,gpus\n0,0-15\n99999999,0-7\n")
    cfg = _scenario(tmp_path, lengths={"csv": "l.csv"}, availability={"csv": "pool.csv"})
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in r.output
    assert line.startswith("error: availability.csv: the first change of the job's pool in "
                           f"{tmp_path / 'pool.csv'}, at 99999999 s, comes after the run ends: "
                           "its 5 steps take about "), line
    assert "(allowed: a change before " in line, line
    # --steps cuts the run short on purpose (as it cuts drift periods): it runs
    r = runner.invoke(app, ["simulate", "--config", str(cfg), "--policies", "static",
                            "--steps", "2"])
    assert r.exit_code == 0, r.output


def test_steps_past_the_scenario_say_the_run_is_the_whole_scenario() -> None:
    """--steps only cuts a scenario short: asking for more ran the whole scenario without a
    word, and the user took it for the longer run."""
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "100000",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["run"]["steps"] == 300
    assert r.stderr == ("note: --steps 100,000 is more than the scenario's 300 steps: all of "
                        "them are simulated\n"), r.stderr
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "3", "--json"])
    assert r.exit_code == 0 and r.stderr == "", r.output
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "100000",
                            "--notes"])  # simulates nothing: no word of what it simulates
    assert r.exit_code == 0 and r.stderr == "", r.output


def test_stderr_to_a_file_gets_no_progress_bar_and_no_blank_line() -> None:
    """The bar is for a terminal: with stderr sent to a file, Rich left an empty line there
    after every run (and a user's log of errors read as one)."""
    r = runner.invoke(app, ["simulate", "--scenario", "stationary", "--steps", "2"])
    assert r.exit_code == 0, r.output
    assert r.stderr == "", repr(r.stderr)


def test_the_policy_table_keeps_every_figure_whole_at_80_columns(
        churn: tuple[Scenario, SimResult]) -> None:
    """At 80 columns the table printed '…' for the policy names and most figures."""
    from io import StringIO

    from rich.console import Console

    from nereus.commands.simulate import summary_table

    sc, res = churn
    out = StringIO()
    Console(file=out, width=80).print(summary_table(sc, res))
    text = out.getvalue()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for name, r in res.results.items():
        (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
        assert f"{r.tokens_per_s:,.0f}" in line and f"{r.mean_step_s:.1f}" in line, text


def test_the_context_panels_legend_sits_above_its_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, churn: tuple[Scenario, SimResult]) -> None:
    """Inside the panel (lower right) it hid the length line and the pause ticks at the end
    of a short run."""
    from matplotlib.figure import Figure

    from nereus.commands.simulate import plot

    seen: list[tuple[float, float]] = []

    def record(self: Figure, *args: object, **kwargs: object) -> None:
        self.canvas.draw()
        ax = self.axes[2]  # the pool and the lengths (its twin is the last axes)
        legend = ax.get_legend()
        assert legend is not None
        seen.append((legend.get_window_extent().y0, ax.get_window_extent().y1))

    monkeypatch.setattr(Figure, "savefig", record)
    sc, res = churn
    plot(res, sc, tmp_path / "steps.png")
    ((legend_bottom, panel_top),) = seen
    assert legend_bottom >= panel_top - 1e-6
