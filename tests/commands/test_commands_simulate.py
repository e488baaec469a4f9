"""``nereus simulate``: the plot names the run it came from."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app

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


@pytest.mark.parametrize("example", sorted((ROOT / "examples" / "scenarios").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_example_scenario_runs(example: Path) -> None:
    import json

    r = runner.invoke(app, ["simulate", "--config", str(example), "--steps", "3",
                            "--policies", "static,nereus", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["source"] == "simulated" and set(out["policies"]) == {"static", "nereus"}


def test_steps_beyond_a_lengths_file_are_refused_naming_steps(tmp_path: Path) -> None:
    import yaml

    data = yaml.safe_load((ROOT / "examples" / "scenarios" / "file-traces-8b.yaml").read_text())
    for name in ("lengths.csv", "pool.csv", "drift.csv"):
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
    for name in ("pool.csv", "drift.csv"):
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
