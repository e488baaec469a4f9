"""Ctrl-C held over work that must not be cut in half; SIGTERM made an exception where a
command has clean-up to do.

Starting Ray and importing it are such work: a Ray shut down half-started crashed the process
(SIGSEGV) and left its agents running, and a Ctrl-C inside ``import ray`` left a half-imported
module whose exit hook printed a traceback after nereus's one-line "interrupted".
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[Callable[[], bool]]:
    """Hold a first Ctrl-C until the block ends; yields whether one came. A second acts at
    once. Outside the main thread (where Python delivers no signal), or where SIGINT is
    ignored, it holds nothing."""
    before = signal.getsignal(signal.SIGINT) \
        if threading.current_thread() is threading.main_thread() else signal.SIG_IGN
    if before is signal.SIG_IGN:  # not this thread's to hold, or ignored (nohup, `cmd &`)
        yield lambda: False
        return
    seen: list[int] = []
    # None: a handler set outside Python, which cannot be put back; Python's own stands in
    again = signal.default_int_handler if before is None else before

    def hold(signum: int, frame: object) -> None:
        seen.append(signum)
        signal.signal(signal.SIGINT, again)

    signal.signal(signal.SIGINT, hold)
    try:
        yield lambda: bool(seen)
    finally:
        if signal.getsignal(signal.SIGINT) is hold:
            signal.signal(signal.SIGINT, again)


class Terminated(BaseException):
    """SIGTERM arrived inside ``sigterm_raises``. Not an Exception, so no ``except Exception``
    swallows it; ``one_line_errors`` ends the command on it (exit 143)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Make SIGTERM raise ``Terminated`` while the block runs, so its ``finally`` clauses run
    (worker processes stopped) before the process ends; Python's default dies at once and
    leaves them running. A second SIGTERM during that clean-up is ignored. Outside the main
    thread, or where SIGTERM is ignored or handled already, nothing changes."""
    before = signal.getsignal(signal.SIGTERM) \
        if threading.current_thread() is threading.main_thread() else signal.SIG_IGN
    if before is not signal.SIG_DFL:  # not this thread's, ignored, or someone else's handler
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up runs once, whole
        raise Terminated

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
