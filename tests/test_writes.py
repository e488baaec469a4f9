"""Output files are written whole or not at all (``nereus.writes.whole_file``)."""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from nereus.writes import whole_file


class _Failed(Exception):
    pass


def _fail_midway(path: Path) -> None:
    with pytest.raises(_Failed), whole_file(path) as f:
        f.write("step,end_s\n0,1.5\n1,")
        raise _Failed  # a full disk, a size limit, Ctrl-C: the rows stop mid-way


def test_a_failed_write_leaves_the_old_file_and_no_part_file(tmp_path: Path) -> None:
    out = tmp_path / "steps.csv"
    out.write_text("the run before\n")
    _fail_midway(out)
    assert out.read_text() == "the run before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.csv"]


def test_a_failed_write_of_a_new_file_leaves_nothing(tmp_path: Path) -> None:
    _fail_midway(tmp_path / "steps.csv")
    assert list(tmp_path.iterdir()) == []


def test_a_whole_write_replaces_the_file_and_keeps_its_permissions(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    out.write_bytes(b"old")
    out.chmod(0o640)
    with whole_file(out, "wb") as f:
        f.write(b"\x89PNG new")
    assert out.read_bytes() == b"\x89PNG new"
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_new_file_gets_the_usual_permissions_not_the_temporary_files(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        with whole_file(tmp_path / "new.csv") as f:
            f.write("a\n")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "new.csv").stat().st_mode) == 0o644  # mkstemp's is 0600


def test_a_link_stays_a_link_and_its_file_gets_the_contents(tmp_path: Path) -> None:
    real = tmp_path / "runs" / "steps.csv"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(real)
    with whole_file(link) as f:
        f.write("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_a_named_pipe_is_written_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", f"print(open({str(fifo)!r}).read(), end='')"],
                              stdout=subprocess.PIPE, text=True)
    with whole_file(fifo) as f:
        f.write("through the pipe\n")
    out, _ = reader.communicate(timeout=30)
    assert out == "through the pipe\n"
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced by a regular file


def test_simulate_over_a_file_size_limit_leaves_no_cut_csv(tmp_path: Path) -> None:
    """The fuzzer's case: `ulimit -f 1; nereus simulate --csv big.csv` said 'file too large'
    (exit 2) and left 1,024 bytes ending mid-row."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    r = subprocess.run([sys.executable, "-m", "nereus", "simulate", "--scenario", "stationary",
                        "--steps", "20", "--policies", "static", "--csv", "big.csv"],
                       cwd=tmp_path, preexec_fn=limit, capture_output=True, text=True,
                       timeout=600, check=False)
    assert r.returncode == 2, r.stderr
    assert "file too large" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []
