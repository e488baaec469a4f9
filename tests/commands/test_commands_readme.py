"""The README's commands run as written: every ``nereus plan`` and ``nereus transition`` line
of the quick start (--execute, which starts Ray workers, is left to the runtime's tests), and
the scenario file the Simulation section points to."""

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, heading
    return [ln.split("  #")[0].strip() for ln in block.group(1).splitlines()
            if ln.startswith("nereus ")]


def run_line(line: str, where: Path) -> None:
    """One README line in folder ``where``: ``nereus ...`` with an optional ``> file``."""
    words = shlex.split(line)[1:]
    out = None
    if ">" in words:
        i = words.index(">")
        words, out = words[:i], words[i + 1]
    r = runner.invoke(app, words)
    assert r.exit_code == 0, (line, r.output)
    if out is not None:
        (where / out).write_text(r.stdout)


def test_quick_start_plan_and_transition_lines_run(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user of the installed package runs them, from an empty folder: the first line
    copies the shipped examples there (it came after the first line that read them)."""
    monkeypatch.chdir(tmp_path)
    lines = [ln for ln in readme_block("Quick start")
             if ln.startswith(("nereus examples", "nereus plan", "nereus transition"))
             and "--execute" not in ln]
    assert len(lines) >= 10 and lines[0] == "nereus examples"
    run_line(lines[0], tmp_path)
    assert (tmp_path / "examples" / "llama-3.1-8b-ppo.yaml").is_file()
    for line in lines[1:]:
        run_line(line, tmp_path)
    assert (tmp_path / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_scenario_file_the_readme_names_runs() -> None:
    lines = [ln for ln in readme_block("Simulation") if "--config" in ln]
    assert lines
    for line in lines:
        words = shlex.split(line)
        cfg = words[words.index("--config") + 1]
        assert (ROOT / cfg).is_file(), cfg
        r = runner.invoke(app, ["simulate", "--config", str(ROOT / cfg), "--steps", "3",
                                "--policies", "static,nereus", "--json"])
        assert r.exit_code == 0, r.output
