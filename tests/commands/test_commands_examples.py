"""``nereus examples``: the example configs ship in the package (an installed nereus has no
source tree beside it), copy out whole, plan and simulate from where they land, and never
overwrite a user's file unasked."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nereus.cli import app
from nereus.commands.examples import shipped

runner = CliRunner()
REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_package_ships_every_example_of_the_source_tree() -> None:
    in_tree = sorted(str(p.relative_to(REPO_EXAMPLES)) for p in REPO_EXAMPLES.rglob("*")
                     if p.is_file() and p.suffix in (".yaml", ".csv"))
    assert in_tree and sorted(shipped()) == in_tree


def test_the_wheel_takes_every_example() -> None:
    """Under an editable install ``shipped()`` reads the source tree, so the test above holds
    whatever the wheel takes: check pyproject's package-data covers every example file."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = REPO_EXAMPLES.resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["nereus"]
    package = root / "src" / "nereus"
    taken = {p for g in globs for p in package.glob(g) if p.is_file()}
    examples = {p for p in (package / "examples").rglob("*") if p.is_file()}
    assert examples and examples <= taken, sorted(map(str, examples - taken))


def test_copied_examples_plan_and_simulate_from_where_they_land(tmp_path: Path) -> None:
    dest = tmp_path / "mine"
    r = runner.invoke(app, ["examples", str(dest)])
    assert r.exit_code == 0, r.output
    assert f"wrote {len(shipped())} files under {dest}" in r.stdout
    r = runner.invoke(app, ["plan", "--config", str(dest / "qwen3-14b-grpo.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    # a scenario's trace files are found beside it, wherever it was copied
    r = runner.invoke(app, ["simulate", "--config", str(dest / "scenarios/file-traces-8b.yaml"),
                            "--steps", "3", "--policies", "static", "--json"])
    assert r.exit_code == 0, r.output


def test_existing_files_are_kept_unless_forced(tmp_path: Path) -> None:
    assert runner.invoke(app, ["examples", str(tmp_path)]).exit_code == 0
    mine = tmp_path / "llama-3.1-8b-ppo.yaml"
    mine.write_text("model: mine\n")
    r = runner.invoke(app, ["examples", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("error: DEST: ") and "--force" in r.stderr, r.stderr
    assert mine.read_text() == "model: mine\n"  # nothing written: the refusal comes first
    assert runner.invoke(app, ["examples", str(tmp_path), "--force"]).exit_code == 0
    assert mine.read_text() == (REPO_EXAMPLES / "llama-3.1-8b-ppo.yaml").read_text()


def test_a_file_as_the_folder_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    r = runner.invoke(app, ["examples", str(f)])
    assert r.exit_code == 2 and r.stderr.startswith("error: DEST: "), r.output
    assert f"{f} is a file" in r.stderr


def test_a_device_as_the_folder_is_named_as_one() -> None:
    r = runner.invoke(app, ["examples", "/dev/null"])
    assert r.exit_code == 2 and "/dev/null is a character device" in r.stderr, r.output


def test_a_file_where_a_sub_folder_goes_is_named_before_anything_is_written(
        tmp_path: Path) -> None:
    (tmp_path / "layouts").write_text("mine")
    r = runner.invoke(app, ["examples", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert f"{tmp_path / 'layouts'} is a file, not a folder" in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["layouts"]  # nothing written


def test_python_dash_m_runs_the_cli() -> None:
    r = subprocess.run([sys.executable, "-m", "nereus", "--version"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0 and r.stdout.startswith("nereus "), r.stderr


def test_the_hint_quotes_a_folder_the_shell_would_split(tmp_path: Path) -> None:
    dest = tmp_path / "sp ace"
    r = runner.invoke(app, ["examples", str(dest)])
    assert r.exit_code == 0, r.output
    job = shlex.quote(str(dest / "llama-3.1-8b-ppo.yaml"))
    scenario = shlex.quote(str(dest / "scenarios" / "node-outage-8b.yaml"))
    assert job.startswith("'") and f"try: nereus plan --config {job} --explain" in r.stdout
    assert f"nereus simulate --config {scenario}" in r.stdout


def test_without_a_folder_they_land_where_every_example_path_points(
        tmp_path: Path, monkeypatch) -> None:
    """The default was nereus-examples/, while the README, the help and the files' own
    comments say examples/...: a user who ran `nereus examples` could run none of them."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["examples"])
    assert r.exit_code == 0, r.output
    job = Path("examples") / "llama-3.1-8b-ppo.yaml"
    assert job.is_file()
    r = runner.invoke(app, ["plan", "--config", str(job), "--json"])
    assert r.exit_code == 0, r.output
