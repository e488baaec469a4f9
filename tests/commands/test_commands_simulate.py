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
