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
