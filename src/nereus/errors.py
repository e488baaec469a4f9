"""Errors every layer raises for input a user can fix, and the checks and words their messages
share.

The CLI turns an :class:`InputError` into one line on stderr and exit code 2, with no traceback.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

# the command line's exit codes (the CLI's, and the console script's before it loads)
EXIT_INPUT = 2        # bad input: a field with a value that is not allowed
EXIT_INFEASIBLE = 3   # a transition that cannot run (commands say where they use it)
EXIT_RUN_FAILED = 4   # a run on real workers that failed (a worker died, a collective failed)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_OUTPUT_CLOSED = 141  # stdout's reader quit (``| head``): 128 + SIGPIPE, as a shell
#                          reports a tool SIGPIPE ended; no command's own outcome
EXIT_TERMINATED = 143  # SIGTERM, where a command stops its workers first (sigterm_raises)


class InputError(ValueError):
    """A value a user supplied is not allowed: names the field and what is allowed."""

    def __init__(self, field: str, problem: str, allowed: str | Iterable[object] | None = None):
        self.field = field
        self.problem = problem
        if allowed is not None and not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.allowed = allowed
        msg = f"{field}: {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
        super().__init__(msg)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Rebuilt from its fields when it crosses a process boundary (raised in a Ray worker).
        return (type(self), (self.field, self.problem, self.allowed))


class InfeasibleError(RuntimeError):
    """The job cannot run under the given resources: says which part fits nowhere and why."""


def first_line(e: BaseException) -> str:
    """An exception's first non-blank line, or its type's name when it says nothing: what a
    one-line error keeps of a library's multi-line message."""
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)


def is_integer(v: object) -> bool:
    """An integer (numpy's too), not a bool (which Python counts as one)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_finite_real(v: object) -> bool:
    """A finite number (numpy's too), not a bool or a string (``math.isfinite`` raises
    TypeError on those)."""
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float (10**400): no finite float
        return False


def count(n: float, word: str, plural: str | None = None, fmt: str = "") -> str:
    """``n`` and ``word``, plural unless ``n`` is 1: "1 step", "2 steps", "1,000 steps"
    (``fmt=","``); ``plural`` where adding an s is wrong."""
    return f"{n:{fmt}} {word if n == 1 else plural or word + 's'}"
