"""What every command shares: one-line errors with exit codes, and the Rich console."""

from __future__ import annotations

import errno
import functools
import inspect
import os
import re
import stat
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer
import typer.core
from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from typer.core import TyperCommand
from typer.models import ArgumentInfo, OptionInfo

from nereus.errors import (
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    InfeasibleError,
    InputError,
)
from nereus.files import is_dir, os_reason, path_stat
from nereus.interrupts import Terminated

F = TypeVar("F", bound=Callable[..., Any])

# Tables are wide; when output goes to a pipe or a file, do not squeeze them into 80 columns,
# and print each line of text whole (soft wrap): a line broken at 160 columns mid-sentence no
# longer greps as one.
class _Console(Console):
    """Rich's console, less its own exit when the reader of its stream quits (``| head``):
    Rich exits 1 there, which is a command's own outcome (transition: "the state differs").
    The BrokenPipeError goes on, as ``print``'s does, to ``nereus.cli``, which ends every
    command alike on it."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


console = _Console(width=None if sys.stdout.isatty() else 160,
                   soft_wrap=not sys.stdout.isatty())
err_console = _Console(stderr=True, width=None if sys.stderr.isatty() else 200,
                       soft_wrap=not sys.stderr.isatty())


class FitTable(Table):
    """A table that stays whole in a narrow terminal. Where its boxed form is wider than the
    console, it drops the box for a rule under the header and one space between columns,
    headers wrap at their spaces, and only the ``fold`` columns (names, lists) fold onto more
    lines: every other column is as wide as its widest cell and its header's longest word,
    so no number or id is ever cut to an ellipsis (Rich's no-wrap columns were, below about
    110 columns: ``nereus plan`` printed empty tp, pp and dp cells at 80)."""

    def __init__(self, *args: Any, fold: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fold = frozenset(fold)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        natural = Measurement.get(console, options.update_width(10_000), self).maximum
        if self.columns and natural > options.max_width:
            self.box, self.padding, self.show_edge = box.SIMPLE_HEAD, (0, 0), False
            for c in self.columns:
                c.no_wrap, c.overflow = False, "fold"
                if str(c.header) not in self.fold:
                    words = str(c.header).split() or [""]
                    c.min_width = max([cell_len(str(v)) for v in c.cells]
                                      + [cell_len(w) for w in words])
        yield from super().__rich_console__(console, options)


def plain_flags(params: list[Any]) -> list[Any]:
    """Show no value type beside an on/off flag (``--json``, ``--help``): newer typers print
    ``<bool>`` there, as if the flag took a value (``--json true`` is a usage error)."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", None) is None:
            p.metavar = ""
    return params


def reflowed(text: str) -> str:
    """A docstring's paragraphs as one line each, for the help to wrap at the terminal's
    width: typer keeps the line breaks of every paragraph but the first, and a docstring
    wrapped at 92 columns then renders ragged at 80 (a word or two on every other line). A
    paragraph that starts with ``\\b`` keeps its lines, as in click."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split())
                       for p in paragraphs)


# The click that typer runs on: newer typer vendors its own copy (``typer._click``), older ones
# import click itself; the exceptions must be that module's.
click = getattr(typer.core, "_click", None) or typer.core.click  # type: ignore[attr-defined]


# the bases as names: mypy reads ``click`` (a module chosen at run time) as Any, and takes
# an Any only through a name as a base class
_BadOptionUsage: Any = click.exceptions.BadOptionUsage
_BadParameter: Any = click.exceptions.BadParameter


class OneLineUsageError(_BadOptionUsage):
    """A usage error whose message is already the one line ``field: what (allowed: ...)``: the
    CLI prints it as it is, without click's wording or a pointer to the help."""


def once_only(parser: Any) -> Any:
    """Refuse an option that takes one value given twice: click keeps the last silently, and
    ``plan --config A.yaml --config B.yaml`` planned B alone. Checked as click's parser stores
    each value, so ``--config=B``, ``-c B`` and a value that looks like an option count as
    click reads them. Flags may repeat (``--json --json`` says the same thing again), and so
    may options that collect their values (``multiple``, counts)."""
    for opt in _stored(parser):
        opt.process = _stored_once(opt, opt.process, parser.ctx)
    return parser


def _stored(parser: Any) -> list[Any]:
    """The parser's options that take one value (each once, under all its names)."""
    options = {id(o): o for o in (*parser._long_opt.values(), *parser._short_opt.values())}
    return [o for o in options.values() if o.action == "store"]


def number_kind(param: Any) -> type | None:
    """int or float where ``param`` is an option that takes one, else None."""
    if getattr(param, "param_type_name", None) != "option":
        return None
    kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if kind in (int, float):
        return kind
    # older typers: click's INT and FLOAT types
    return {"integer": int, "float": float}.get(getattr(getattr(param, "type", None), "name", ""))


class NotAnInteger(_BadParameter):
    """An integer option's value that is no integer's text; ``given``: the text."""

    def __init__(self, given: str, ctx: Any, param: Any) -> None:
        super().__init__(f"{given!r} is not an integer", ctx=ctx, param=param)
        self.given = given


def integers_only(parser: Any) -> Any:
    """Refuse ``--gpus 16.0`` as a config's ``gpus: 16.0`` is refused: newer typers read an
    int option's text with pydantic, which takes a float's text without a fraction, and
    planned 16 GPUs. The text must be what ``int`` reads, as click's INT (older typers) read
    it; the rest (``2.5``, ``abc``) typer refuses on its own."""
    for opt in _stored(parser):
        if number_kind(opt.obj) is int:
            opt.process = _integer_text(opt.obj, opt.process, parser.ctx)
    return parser


def _integer_text(param: Any, process: Callable[[Any, Any], None], ctx: Any
                  ) -> Callable[[Any, Any], None]:
    def checked(value: Any, state: Any) -> None:
        # resilient parsing (shell completion) reads what is typed so far, refusing nothing
        if isinstance(value, str) and not getattr(ctx, "resilient_parsing", False):
            try:
                int(value)
            except ValueError:
                raise NotAnInteger(value, ctx, param) from None
        process(value, state)
    return checked


def _stored_once(opt: Any, process: Callable[[Any, Any], None], ctx: Any
                 ) -> Callable[[Any, Any], None]:
    def once(value: Any, state: Any) -> None:
        # resilient parsing (shell completion) reads what is typed so far, refusing nothing
        if opt.dest in state.opts and not getattr(ctx, "resilient_parsing", False):
            name = (opt._long_opts or opt._short_opts)[0]  # -c and --config: --config
            raise OneLineUsageError(name, str(InputError(
                name, f"given twice ({state.opts[opt.dest]!r}, then {value!r})", "once")), ctx)
        process(value, state)
    return once


# a required argument in the usage line: newer typers write ``{CURRENT}`` (and
# ``{CURRENT}...`` for several)
_REQUIRED_PIECE = re.compile(r"\{([^{}]+)\}(\.\.\.)?")


class Command(TyperCommand):
    """Every ``nereus`` command: help without a type beside its flags (:func:`plain_flags`),
    paragraphs that wrap at the terminal's width (:func:`reflowed`), and a usage line that
    names a required argument as click does (``CURRENT TARGET``), not in braces, which read
    as a set to pick from."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            self.help = reflowed(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_flags(super().get_params(ctx))

    def make_parser(self, ctx: Any) -> Any:
        return integers_only(once_only(super().make_parser(ctx)))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [_REQUIRED_PIECE.sub(r"\1\2", p) for p in super().collect_usage_pieces(ctx)]


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


# Options that name a file: an error about the file as a whole (missing, not YAML, not a
# mapping) is raised naming the field, and the command line calls it by its option.
FILE_OPTIONS = frozenset({"config", "evaluate", "profile"})


def one_line_errors(fn: F) -> F:
    """Turn input errors, a job that fits nowhere included, into one line on stderr and exit 2;
    keep tracebacks for real bugs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            if e.field in FILE_OPTIONS:  # the file as a whole: the option that named it
                e = InputError(f"--{e.field}", e.problem, e.allowed)
            raise fail(str(e)) from None
        except OSError as e:
            # a file the user named that the system refuses (a folder on the way they cannot
            # enter) where a check looked at it without nereus.files: still the user's input
            field = _naming(fn, kwargs, e)
            if field is None:
                raise  # a file of nereus's own: a bug
            # read or written: which, only the call that failed knew
            raise fail(str(InputError(field, f"cannot access {e.filename}: {os_reason(e)}",
                                      "a path this user may read, and write where it is an "
                                      "output"))) from None
        except InfeasibleError as e:
            raise fail(str(e)) from None
        except KeyboardInterrupt:
            raise fail("interrupted", EXIT_INTERRUPTED) from None
        except Terminated:  # SIGTERM where the command set ``sigterm_raises``
            raise fail("terminated", EXIT_TERMINATED) from None

    return wrapper  # type: ignore[return-value]


def _naming(fn: Callable[..., Any], kwargs: Mapping[str, Any], e: OSError) -> str | None:
    """The option (``--config``) or argument (``current``) whose value is the path an
    OSError is about, or a folder it lies in (``--model DIR``); None if no input names it."""
    if not isinstance(e.filename, (str, bytes, os.PathLike)):
        return None
    bad = Path(os.path.abspath(os.fsdecode(e.filename)))
    params = inspect.signature(fn).parameters
    for name, value in kwargs.items():
        if not isinstance(value, (str, Path)) or str(value).strip() in ("", "."):
            continue  # not a path, or the working folder, in which every relative path lies
        given = Path(os.path.abspath(value))
        if bad != given and given not in bad.parents:
            continue
        info = params[name].default if name in params else None
        if isinstance(info, ArgumentInfo):
            return info.metavar or name  # as the usage line and the command's errors say it
        decls = info.param_decls if isinstance(info, OptionInfo) else None
        longs = [d for d in decls or () if d.startswith("--")]
        return longs[0] if longs else "--" + name.replace("_", "-")
    return None


def with_default(text: str, default: object) -> str:
    """Option help ending in ``[default: ...]`` for an option whose Python default is None
    (so that a config file can set it): escaped, since Typer renders help as Rich markup, in
    which a bare ``[default: ppo]`` is a style tag and vanishes."""
    return f"{text} {escape(f'[default: {default}]')}"


def refuse_together(first: str, first_on: bool, second: str, second_on: bool,
                    allowed: str) -> None:
    """Refuse two options that cannot be honoured together, rather than silently ignore one;
    the error names the second and says what is allowed instead."""
    if first_on and second_on:
        raise InputError(second, f"cannot be combined with {first}", allowed)


FIGURE_FORMATS = (".png", ".pdf", ".svg")


def output_path(given: str | Path | None, field: str, suffixes: tuple[str, ...]
                ) -> Path | None:
    """Check an output file before the work that fills it: a known suffix, an existing
    folder, not a folder itself (a typo should not cost a finished run). ``given`` as typed:
    an option declared as a Path has lost a trailing slash (``--gantt g.png/`` reads as
    ``g.png``, and g.png was written), so output options are declared as strings and this
    makes the Path."""
    if given is None:
        return None
    text = os.fspath(given)
    if text in ("", "."):  # typer reads an empty argument ("$UNSET") as Path("") == "."
        raise InputError(field, "the path is empty or '.' (the working folder)",
                         f"a file path ending in {' or '.join(suffixes)}")
    path = Path(text)
    # a folder's path whatever is there: it ends in a separator, '.' or '..'
    if os.path.basename(text) in ("", ".", ".."):
        raise InputError(field, f"{text} names a folder, not a file",
                         f"a file path ending in {' or '.join(suffixes)}")
    # before the suffix: a directory has none, and that is not the problem
    if is_dir(path, field, writing=True):
        raise InputError(field, f"{path} is a directory",
                         f"a file path ending in {' or '.join(suffixes)}")
    if path.suffix.lower() not in suffixes:
        raise InputError(field, f"unsupported file type {path.suffix or '(none)'!r}", suffixes)
    parent = path.parent if str(path.parent) else Path(".")
    if not is_dir(parent, field, writing=True):
        raise InputError(field, f"no folder {parent} to write {path.name} in",
                         "a path in an existing folder")
    return path


# write ends of named pipes given as outputs, held open until the command returns (see
# ``writable``; ``release_pipes`` closes them)
_HELD_PIPES: list[int] = []


def release_pipes() -> None:
    """Close the write ends ``writable`` held: the command has written its outputs, and each
    pipe's reader sees its end once nereus closes its last write end."""
    while _HELD_PIPES:
        try:
            os.close(_HELD_PIPES.pop())
        except OSError:  # closed already
            pass


def writable(path: Path | None, field: str) -> None:
    """Refuse, before any work, an output file that cannot be written (a read-only folder,
    /proc): the results must not be printed and then lost to a traceback.

    A named pipe is written when something reads it: one with no reader is refused at once
    (opening it to write would wait for one, with nothing printed). One with a reader keeps
    this check's write end open until the command returns (``release_pipes``): closing it
    here would end the reader's input before the output is written."""
    if path is None:
        return
    st = path_stat(path, field, writing=True)
    if st is not None and stat.S_ISFIFO(st.st_mode):
        try:
            _HELD_PIPES.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as e:
            if e.errno == errno.ENXIO:
                raise InputError(field, f"{path} is a named pipe that nothing reads",
                                 "a file, or a pipe something reads") from None
            raise InputError(field, f"cannot write {path}: {os_reason(e)}",
                             "a file in a folder you can write") from None
        return
    existed = st is not None
    try:
        with path.open("ab"):
            pass
    except OSError as e:
        raise InputError(field, f"cannot write {path}: {os_reason(e)}",
                         "a file in a folder you can write") from None
    if not existed:
        path.unlink(missing_ok=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
