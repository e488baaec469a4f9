"""What every command shares: one-line errors with exit codes, and the Rich console."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console

from nereus.errors import InfeasibleError, InputError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_INPUT = 2        # bad input: a field with a value that is not allowed
EXIT_INFEASIBLE = 3   # a transition that cannot run (commands say where they use it)
EXIT_RUN_FAILED = 4   # a run on real workers that failed (a worker died, a collective failed)

# Tables are wide; when output goes to a pipe or a file, do not squeeze them into 80 columns.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def one_line_errors(fn: F) -> F:
    """Turn input errors into one line on stderr and exit 2; keep tracebacks for real bugs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            raise fail(str(e)) from None
        except InfeasibleError as e:
            raise fail(str(e)) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None

    return wrapper  # type: ignore[return-value]


FIGURE_FORMATS = (".png", ".pdf", ".svg")


def output_path(path: Path | None, field: str, suffixes: tuple[str, ...]) -> Path | None:
    """Check an output file before the work that fills it: a known suffix, an existing
    folder, not a folder itself (a typo should not cost a finished run)."""
    if path is None:
        return None
    if path.suffix.lower() not in suffixes:
        raise InputError(field, f"unsupported file type {path.suffix or '(none)'!r}", suffixes)
    if path.is_dir():
        raise InputError(field, f"{path} is a folder", "a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(field, f"no folder {parent} to write {path.name} in")
    return path


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
