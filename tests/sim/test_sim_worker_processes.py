"""``nereus simulate``'s worker processes end with it, however it ends (Linux: /proc)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or os.cpu_count() == 1,
                                reason="reads processes from /proc; one CPU runs no workers")


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            state, ppid = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if int(ppid) == pid and state != "Z":
            out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(until, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not until():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_workers_end_with_the_parent(tmp_path, sig):
    """SIGTERM to the parent alone ended it at once and left both workers simulating, then
    blocked on a queue no one reads, holding stdout open (``$(nereus simulate)`` hung). Now
    the parent stops them and says so in one line (exit 143); killed outright, the kernel
    ends them (PR_SET_PDEATHSIG)."""
    err = tmp_path / "err.txt"
    # the whole default run (1000 steps: minutes), seeded; it is stopped once it has workers
    with open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "nereus", "simulate", "--seed", "0"],
                                stdout=subprocess.DEVNULL, stderr=e, start_new_session=True)
    kids: list[int] = []

    def started() -> bool:
        kids[:] = _children(proc.pid)
        return len(kids) >= 2

    try:
        assert _wait(started, 120), err.read_text()
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
        assert _wait(lambda: not any(_alive(k) for k in kids), 30), \
            f"workers {[k for k in kids if _alive(k)]} outlived the parent"
        if sig == signal.SIGTERM:
            assert (code, err.read_text()) == (143, "error: terminated\n")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the parent's group: orphans included
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
