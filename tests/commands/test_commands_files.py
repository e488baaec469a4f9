"""Files a user names that cannot be read or written (a folder they cannot enter, a file
without read permission, a device or a pipe): one line naming the option or field and what
is allowed, exit 2, never a traceback; and the helpers in ``nereus.files`` and
``nereus.commands.common`` that say so."""

from __future__ import annotations

import errno
import io
import math
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from nereus.cli import app
from nereus.commands.common import FIGURE_FORMATS, Command, one_line_errors, output_path
from nereus.errors import EXIT_OUTPUT_CLOSED, InputError
from nereus.files import existing_file, is_dir, path_stat, read_text

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "llama-3.1-8b-ppo.yaml"
LAYOUT = REPO / "examples" / "layouts" / "verl-colocated-8b.yaml"
SCENARIOS = REPO / "examples" / "scenarios"
TINY = ["--model", "tiny-llama", "--device", "cpu"]
HF_CONFIG = ('{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, '
             '"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, '
             '"vocab_size": 256, "max_position_embeddings": 1024}')


def one_line(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    assert "Traceback" not in r.output and not isinstance(r.exception, OSError), r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    return r.stderr.rstrip("\n")


def _denied(path: object) -> PermissionError:
    return PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))


class Deny:
    """Make paths unreadable the way the system does for a user that is not root: a folder
    that cannot be entered (nothing inside it can be looked at or opened) or a file without
    read permission (it can be looked at, not opened; ``os.access`` says no). As root, whom
    no permission stops, the same errors come from patched ``os.stat``, ``open`` and
    ``os.access``; as anyone else, from ``chmod``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.folders: list[Path] = []
        self.files: list[Path] = []
        self.chmodded: list[tuple[Path, int]] = []
        self.root = os.geteuid() == 0
        if self.root:
            self._patch()

    def folder(self, p: Path) -> Path:
        if self.root:
            self.folders.append(p.resolve())
        else:
            self._lock(p, 0o000)
        return p

    def file(self, p: Path) -> Path:
        if self.root:
            self.files.append(p.resolve())
        else:
            self._lock(p, 0o000)
        return p

    def _lock(self, p: Path, mode: int) -> None:
        self.chmodded.append((p, p.stat().st_mode))
        p.chmod(mode)

    def restore(self) -> None:
        for p, mode in reversed(self.chmodded):
            p.chmod(mode)

    def _inside(self, path: object) -> bool:
        if isinstance(path, int):
            return False
        p = Path(os.path.abspath(os.fsdecode(path)))  # type: ignore[arg-type]
        return any(f in p.parents for f in self.folders)

    def _unreadable(self, path: object) -> bool:
        if isinstance(path, int):
            return False
        p = Path(os.path.abspath(os.fsdecode(path)))  # type: ignore[arg-type]
        return self._inside(path) or p in self.files

    def _patch(self) -> None:
        real_stat, real_open, real_access = os.stat, io.open, os.access

        def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
            if self._inside(path):
                raise _denied(path)
            return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

        def opener(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
            if self._unreadable(file):
                raise _denied(file)
            return real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

        def access(path: object, mode: int, *args: object, **kwargs: object) -> bool:
            if self._unreadable(path):
                return False
            return real_access(path, mode, *args, **kwargs)  # type: ignore[arg-type]

        def path_open(path: Path, mode: str = "r", *args: object, **kwargs: object) -> object:
            return opener(path, mode, *args, **kwargs)

        self.mp.setattr(os, "stat", stat)
        self.mp.setattr(io, "open", opener)
        self.mp.setattr("builtins.open", opener)
        # Python 3.10's Path.open calls the io.open it bound at import, not the patched one
        self.mp.setattr(Path, "open", path_open)
        self.mp.setattr(os, "access", access)


@pytest.fixture()
def deny(monkeypatch: pytest.MonkeyPatch) -> Iterator[Deny]:
    d = Deny(monkeypatch)
    yield d
    d.restore()


@pytest.fixture()
def plan_json(tmp_path: Path) -> Path:
    r = runner.invoke(app, ["plan", *TINY, "--gpus", "2", "--json"])
    assert r.exit_code == 0, r.output
    p = tmp_path / "plan.json"
    p.write_text(r.stdout)
    return p


def _locked(tmp_path: Path, *files: Path) -> Path:
    """A folder holding copies of ``files``, to be locked."""
    folder = tmp_path / "locked"
    folder.mkdir()
    for f in files:
        shutil.copy(f, folder / f.name)
    return folder


# ---- a folder that cannot be entered ----

@pytest.mark.parametrize("args,field,name", [
    (["plan", "--config", "{d}/cfg.yaml"], "--config", "cfg.yaml"),
    (["plan", "--config", str(CONFIG), "--evaluate", "{d}/lay.yaml"], "--evaluate", "lay.yaml"),
    (["plan", "--config", str(CONFIG), "--profile", "{d}/plan.json"], "--profile", "plan.json"),
    (["simulate", "--config", "{d}/cfg.yaml"], "--config", "cfg.yaml"),
    (["transition", "{d}/plan.json", "{plan}", *TINY], "current", "plan.json"),
    (["transition", "{plan}", "{d}/plan.json", *TINY], "target", "plan.json"),
    (["transition", "{plan}", "{plan}", "--config", "{d}/cfg.yaml"], "--config", "cfg.yaml"),
    (["plan", "--model", "{d}/config.json", "--gpus", "2", "--device", "cpu"], "--model",
     "config.json"),
])
def test_a_file_in_a_folder_that_cannot_be_entered_is_one_line(
        tmp_path: Path, deny: Deny, plan_json: Path, args: list[str], field: str,
        name: str) -> None:
    """`Path.is_dir()` and `exists()` raise PermissionError there (Python 3.11): a
    traceback, exit 1."""
    folder = _locked(tmp_path, plan_json)
    shutil.copy(CONFIG, folder / "cfg.yaml")
    shutil.copy(LAYOUT, folder / "lay.yaml")
    (folder / "config.json").write_text(HF_CONFIG)
    deny.folder(folder)
    err = one_line([a.format(d=folder, plan=plan_json) for a in args])
    assert err == (f"error: {field}: cannot read {folder / name}: permission denied "
                   "(allowed: a readable file)"), err


def test_a_model_folder_whose_config_cannot_be_read_is_one_line(tmp_path: Path,
                                                                deny: Deny) -> None:
    """`--model DIR`: DIR/config.json in a folder that cannot be entered."""
    model = tmp_path / "mymodel"
    model.mkdir()
    (model / "config.json").write_text(HF_CONFIG)
    deny.folder(model)
    err = one_line(["plan", "--model", str(model), "--gpus", "2", "--device", "cpu"])
    assert err.startswith(f"error: --model: cannot read {model / 'config.json'}: "
                          "permission denied"), err


@pytest.mark.parametrize("args,field,name", [
    (["simulate", "--csv", "{d}/out.csv", "--steps", "2"], "--csv", "out.csv"),
    (["simulate", "--plot", "{d}/out.png", "--steps", "2"], "--plot", "out.png"),
    (["transition", "{plan}", "{plan}", *TINY, "--gantt", "{d}/g.png"], "--gantt", "g.png"),
])
def test_an_output_in_a_folder_that_cannot_be_entered_is_one_line(
        tmp_path: Path, deny: Deny, plan_json: Path, args: list[str], field: str,
        name: str) -> None:
    folder = _locked(tmp_path)
    deny.folder(folder)
    err = one_line([a.format(d=folder, plan=plan_json) for a in args])
    assert err == (f"error: {field}: cannot write {folder / name}: permission denied "
                   "(allowed: a file in a folder you can write)"), err


@pytest.mark.parametrize("args,field,name", [
    (["simulate", "--csv", "{p}", "--steps", "2"], "--csv", "out.csv"),
    (["simulate", "--plot", "{p}", "--steps", "2"], "--plot", "out.png"),
    (["transition", "{plan}", "{plan}", *TINY, "--gantt", "{p}"], "--gantt", "g.png"),
])
@pytest.mark.parametrize("end", ["/", "/."])
def test_an_output_path_naming_a_folder_is_refused_before_the_work(
        tmp_path: Path, plan_json: Path, args: list[str], field: str, name: str,
        end: str) -> None:
    """`--gantt g.png/` wrote g.png: the path, read as a Path, had lost its slash."""
    given = f"{tmp_path / 'out' / name}{end}"
    (tmp_path / "out").mkdir()
    suffixes = (".csv",) if field == "--csv" else FIGURE_FORMATS
    err = one_line([a.format(p=given, plan=plan_json) for a in args])
    assert err == (f"error: {field}: {given} names a folder, not a file (allowed: a file path "
                   f"ending in {' or '.join(suffixes)})"), err
    assert not any((tmp_path / "out").iterdir())


# ---- a file without read permission ----

@pytest.mark.parametrize("args,field", [
    (["plan", "--config", "{f}"], "--config"),
    (["plan", "--config", str(CONFIG), "--evaluate", "{f}"], "--evaluate"),
    (["plan", "--config", str(CONFIG), "--profile", "{f}"], "--profile"),
    (["transition", "{f}", "{plan}", *TINY], "current"),
    (["transition", "{plan}", "{f}", *TINY], "target"),
    (["transition", "{plan}", "{plan}", "--config", "{f}"], "--config"),
    (["simulate", "--config", "{f}", "--steps", "2"], "--config"),
])
def test_a_file_without_read_permission_is_the_projects_one_line(
        tmp_path: Path, deny: Deny, plan_json: Path, args: list[str], field: str) -> None:
    """Typer's own check said "Invalid value for '--config' / '-c': path ... is not
    readable.", not the one line every other bad file gets; files.read_text, which does say
    it, let PermissionError through."""
    f = tmp_path / ("cfg.json" if field in ("current", "target") else "cfg.yaml")
    shutil.copy(plan_json if field in ("current", "target") else CONFIG, f)
    deny.file(f)
    err = one_line([a.format(f=f, plan=plan_json) for a in args])
    assert err == (f"error: {field}: cannot read {f}: permission denied "
                   "(allowed: a readable file)"), err


def test_a_hugging_face_config_without_read_permission_is_one_line(tmp_path: Path,
                                                                   deny: Deny) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(HF_CONFIG)
    deny.file(cfg)
    err = one_line(["plan", "--model", str(cfg), "--gpus", "2", "--device", "cpu"])
    assert err.startswith(f"error: --model: cannot read {cfg}: permission denied"), err


def test_a_trace_file_a_scenario_names_that_cannot_be_read_is_one_line(tmp_path: Path,
                                                                       deny: Deny) -> None:
    sc = tmp_path / "sc"
    shutil.copytree(SCENARIOS, sc)
    deny.file(sc / "lengths.csv")
    err = one_line(["simulate", "--config", str(sc / "file-traces-8b.yaml"), "--steps", "2"])
    assert f"cannot read {sc / 'lengths.csv'}: permission denied" in err, err


# ---- something that is not a regular file ----

@pytest.mark.parametrize("args,field", [
    (["plan", "--config", "{f}"], "--config"),
    (["plan", "--config", str(CONFIG), "--evaluate", "{f}"], "--evaluate"),
    (["simulate", "--config", "{f}"], "--config"),
])
@pytest.mark.parametrize("kind", ["/dev/null", "/dev/zero", "fifo"])
def test_a_device_or_a_pipe_is_not_a_regular_file(tmp_path: Path, args: list[str], field: str,
                                                  kind: str) -> None:
    """`--config /dev/null` said 'no file at /dev/null', which is there; a named pipe would
    block a read until something wrote to it, and /dev/zero never ends."""
    if kind == "fifo":
        f = tmp_path / "job.yaml"
        os.mkfifo(f)
        what = "a named pipe"
    else:
        if not os.path.exists(kind):
            pytest.skip(f"no {kind} here")
        f, what = Path(kind), "a character device"
    err = one_line([a.format(f=f) for a in args])
    assert err == f"error: {field}: {f} is not a regular file ({what}) (allowed: a file)", err


@pytest.mark.parametrize("kind", ["/dev/null", "fifo"])
def test_transition_names_a_device_or_a_pipe_given_as_a_plan(tmp_path: Path, plan_json: Path,
                                                             kind: str) -> None:
    """It said 'no file at /dev/null'."""
    f = Path(kind)
    if kind == "fifo":
        f = tmp_path / "a.json"
        os.mkfifo(f)
    elif not f.exists():
        pytest.skip(f"no {kind} here")
    what = "a named pipe" if kind == "fifo" else "a character device"
    err = one_line(["transition", str(f), str(plan_json), *TINY])
    assert err == (f"error: current: {f} is not a regular file ({what}) (allowed: a plan "
                   ".json, a layout or a job .yaml)"), err


@pytest.mark.parametrize("args,field", [
    (["simulate", "--steps", "1", "--csv", "{f}"], "--csv"),
    (["simulate", "--steps", "1", "--plot", "{f}"], "--plot"),
    (["transition", "{a}", "{a}", *TINY, "--gantt", "{f}"], "--gantt"),
])
def test_an_output_pipe_that_nothing_reads_is_refused_at_once(tmp_path: Path, plan_json: Path,
                                                              args: list[str],
                                                              field: str) -> None:
    """Opening a named pipe to write waits for a reader: the check before the run did, and the
    command hung with nothing printed. A subprocess, so a hang fails the test."""
    f = tmp_path / ("out.csv" if field == "--csv" else "out.png")
    os.mkfifo(f)
    r = subprocess.run([sys.executable, "-m", "nereus",
                        *[x.format(f=f, a=plan_json) for x in args]],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"error: {field}: {f} is a named pipe that nothing reads (allowed: a "
                        "file, or a pipe something reads)\n"), r.stderr


def test_an_output_pipe_with_a_reader_gets_the_rows_and_the_figure(tmp_path: Path) -> None:
    """A pipe something reads is written as a file is; the check's own write end stays open,
    so the reader does not see its input end before the rows come. A PNG came out empty and
    the run failed after its work ("UnsupportedOperation"): its writer seeks back."""
    rows_f, png_f = tmp_path / "rows.csv", tmp_path / "steps.png"
    got: dict[Path, bytes] = {}
    readers = []
    for f in (rows_f, png_f):
        os.mkfifo(f)
        readers.append(threading.Thread(target=lambda f=f: got.update({f: f.read_bytes()}),
                                        daemon=True))
        readers[-1].start()
    r = subprocess.run([sys.executable, "-m", "nereus", "simulate", "--steps", "2", "--csv",
                        str(rows_f), "--plot", str(png_f)],
                       capture_output=True, text=True, timeout=300, check=False)
    for reader in readers:
        reader.join(60)
    assert r.returncode == 0, r.stderr
    rows = got[rows_f].decode().splitlines()
    assert rows[0].startswith("scenario,seed,") and len(rows) == 1 + 4 * 2, rows[:3]
    assert got[png_f].startswith(b"\x89PNG"), got[png_f][:16]


def test_an_output_pipe_is_closed_when_the_command_returns(tmp_path: Path) -> None:
    """Run in-process (a test, a notebook), the write end the check held stayed open until
    the interpreter exited: the reader never saw the end of its input."""
    f = tmp_path / "rows.csv"
    os.mkfifo(f)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(f.read_text()), daemon=True)
    reader.start()
    r = CliRunner().invoke(app, ["simulate", "--scenario", "stationary", "--steps", "1",
                                 "--csv", str(f)])
    reader.join(30)
    assert r.exit_code == 0, r.output
    assert not reader.is_alive() and got[0].startswith("scenario,seed,"), got


def _no_unbuffered() -> dict[str, str]:
    """The environment without PYTHONUNBUFFERED: stdout buffered, as a user's shell has it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def _closed_stdout(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``nereus ARGS`` with a stdout whose reader quit before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "nereus", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300, env=env,
                              check=False)
    finally:
        os.close(write)


def test_stdout_whose_reader_quit_ends_quietly() -> None:
    """``nereus plan --json | head -c 1`` printed a traceback of a BrokenPipeError."""
    r = _closed_stdout(["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--json"],
                       _no_unbuffered())
    assert r.returncode == EXIT_OUTPUT_CLOSED and r.stderr == "", r.stderr


@pytest.mark.parametrize("args", [
    ["transition", "examples/layouts/verl-colocated-8b.yaml",
     "examples/layouts/verl-colocated-8b.yaml", "--config", "examples/llama-3.1-8b-ppo.yaml"],
    ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--explain"],
    ["simulate", "--scenario", "stationary", "--steps", "2", "--log"],
])
def test_a_reader_that_quits_mid_output_ends_every_command_alike(args: list[str]) -> None:
    """With stdout unbuffered (or past a buffer's worth) the write fails inside the command,
    where click and Rich each exit 1 on it: for transition that is "the state differs".
    Every command now ends as a tool SIGPIPE ended: no word, exit 141."""
    r = _closed_stdout(args, {**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == EXIT_OUTPUT_CLOSED == 141 and r.stderr == "", r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("args", [
    ["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--json"],
    ["plan", "--model", "llama-3.1-8b", "--gpus", "16"],
])
def test_an_output_the_system_refuses_is_one_line(args: list[str]) -> None:
    """stdout on a full disk ended in a traceback and exit 1 (the error names no file, and
    was taken for a bug)."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "nereus", *args], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=300,
                           env=_no_unbuffered(), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "error: cannot write the output: no space left on device\n", r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_failed_command_on_a_refused_stdout_says_one_line(tmp_path: Path) -> None:
    """The --csv file and stdout on the same full disk: the command's own error, then a
    second one for stdout."""
    csv = tmp_path / "rows.csv"
    csv.symlink_to("/dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "nereus", "simulate", "--scenario",
                            "stationary", "--steps", "1", "--json", "--csv", str(csv)],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                           env=_no_unbuffered(), check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"error: --csv: cannot write {csv}: no space left on device\n"), \
        r.stderr


# ---- the helpers ----

def test_existing_file_says_what_is_there_instead(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^x: no file at .*nothing \(allowed: an existing "
                       r"file\)$"):
        existing_file(tmp_path / "nothing", "x")
    with pytest.raises(InputError, match=r"is a directory \(allowed: a file\)$"):
        existing_file(tmp_path, "x")
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"is not a regular file \(a named pipe\)"):
        existing_file(fifo, "x")
    f = tmp_path / "f.yaml"
    f.write_text("a: 1\n")
    assert existing_file(f, "x") == f and read_text(f, "x") == "a: 1\n"


def test_a_dangling_link_is_no_file_and_a_link_loop_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert path_stat(tmp_path / "dangling", "x") is None
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(InputError, match=r"^x: cannot read .*/a: too many levels of symbolic "
                                         r"links \(allowed: a readable file\)$"):
        existing_file(tmp_path / "a", "x")


def test_is_dir_says_which_way_a_path_cannot_be_used(tmp_path: Path, deny: Deny) -> None:
    (tmp_path / "locked").mkdir()
    inside = deny.folder(tmp_path / "locked") / "f"
    with pytest.raises(InputError, match="^x: cannot read .*: permission denied"):
        is_dir(inside, "x")
    with pytest.raises(InputError, match="^x: cannot write .*: permission denied"):
        is_dir(inside, "x", writing=True)
    with pytest.raises(InputError, match="^--csv: cannot write .*: permission denied"):
        output_path(inside.with_suffix(".csv"), "--csv", (".csv",))


def _app(body: Callable[[Path], None]) -> typer.Typer:
    a = typer.Typer(add_completion=False)

    @a.command(cls=Command)
    @one_line_errors
    # declared as the commands declare theirs; the parameter's name is not the option's
    def cmd(scenario_file: Path = typer.Option(..., "-c", "--config")) -> None:
        body(scenario_file)

    return a


def test_an_os_error_on_a_path_the_user_gave_names_its_option(tmp_path: Path) -> None:
    """The safety net for checks that look at a file without nereus.files."""
    def body(config: Path) -> None:
        raise _denied(config / "inside")

    r = runner.invoke(_app(body), ["--config", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: --config: cannot access {tmp_path / 'inside'}: permission "
                        "denied (allowed: a path this user may read, and write where it is "
                        "an output)\n"), r.stderr


def test_the_safety_net_names_an_argument_as_its_usage_line_does(tmp_path: Path) -> None:
    """nereus examples said 'dest:' where its usage and its other errors say DEST."""
    app = typer.Typer()

    @app.command(cls=Command)
    @one_line_errors
    def main(dest: Path = typer.Argument(..., metavar="DEST")) -> None:
        raise _denied(dest / "x")

    r = runner.invoke(app, [str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.startswith("error: DEST: cannot access "), r.output


def test_a_path_with_a_nul_byte_is_one_line(tmp_path: Path) -> None:
    """os.stat raises ValueError for it (Path.exists said False): a traceback."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: \"tiny\\0llama\"\ngpus: 2\ncluster: {device: cpu}\n")
    err = one_line(["plan", "--config", str(cfg)])
    assert err == ("error: model: 'tiny\\x00llama' is not a valid path (it holds a NUL byte) "
                   "(allowed: a path without NUL bytes)"), err


def test_a_number_too_large_for_a_float_is_refused_by_name() -> None:
    """math.isfinite(10**400) raises OverflowError: AdamConfig(lr=10**400) was a traceback."""
    from nereus.engine.optim import AdamConfig
    from nereus.errors import is_finite_real

    assert not is_finite_real(10**400) and is_finite_real(10**300)
    with pytest.raises(InputError, match=r"^adam\.lr:"):
        AdamConfig(lr=10**400)


def test_an_os_error_on_a_path_of_nereus_own_stays_a_traceback(tmp_path: Path) -> None:
    """A file the user did not name: a bug, whose traceback is kept."""
    def body(config: Path) -> None:
        raise _denied(tmp_path / "elsewhere")

    r = runner.invoke(_app(body), ["--config", str(tmp_path / "cfg.yaml")])
    assert isinstance(r.exception, PermissionError), r.output


# ---- what pydantic says, in the project's words ----

def test_pydantic_errors_without_a_wording_of_their_own_say_what_is_allowed() -> None:
    """'Input should be a finite number', 'List should have at least 1 item after
    validation, not 0' and 'Input should be a valid tuple' came through as pydantic wrote
    them, with no allowed part."""
    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    from nereus.files import validation_error

    class Spec(BaseModel):
        model_config = ConfigDict(strict=True)
        noise: float = Field(0.0, allow_inf_nan=False)
        stages: list[int] = Field(default_factory=lambda: [1], min_length=1)
        length: tuple[int, int] = Field((1, 2), strict=False)
        pair: tuple[int, int] = (1, 2)

    def said(data: dict) -> str:
        with pytest.raises(ValidationError) as info:
            Spec.model_validate(data)
        return str(validation_error(info.value, Spec))

    assert said({"noise": math.nan}) == "noise: nan is not allowed (allowed: a finite number)"
    assert said({"stages": []}) == "stages: has no items (allowed: at least 1)"
    assert said({"length": [1, 2, 3]}) == "length: has 3 items (allowed: at most 2)"
    assert said({"pair": "ab"}) == "pair: 'ab' is not a list (allowed: a list)"


def test_a_section_given_as_a_value_lists_the_fields_it_takes() -> None:
    """``cluster: h100`` said only 'cluster: must be a mapping of fields'."""
    from pydantic import BaseModel, ConfigDict

    from nereus.files import validate

    class Inner(BaseModel):
        model_config = ConfigDict(extra="forbid")
        device: str = "x"
        nodes: int = 1

    class Outer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        cluster: Inner = Inner()
        many: list[Inner] = []
        table: dict[str, float] = {}

    def said(data: dict) -> str:
        with pytest.raises(InputError) as info:
            validate(Outer, data)
        return str(info.value)

    assert said({"cluster": "h100"}) == ("cluster: must be a mapping of fields (allowed: "
                                         "device, nodes)")
    assert said({"many": [{}, 3]}) == "many.1: must be a mapping of fields (allowed: device, nodes)"
    # no fields to list: a free-form section
    assert said({"table": 3}) == ("table: must be a mapping of fields (allowed: a mapping of "
                                  "name: value pairs)")


def test_an_empty_json_file_is_said_to_be_empty(tmp_path: Path) -> None:
    """It said 'is not valid JSON (Expecting value: line 1, column 1)'."""
    from nereus.files import read_json

    p = tmp_path / "plan.json"
    p.write_text(" \n")
    with pytest.raises(InputError, match=r"^current: .*plan\.json is empty \(allowed: a JSON "
                       r"document\)$"):
        read_json(p, "current")
