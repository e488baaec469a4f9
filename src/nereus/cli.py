"""``nereus``: plan, transition, simulate (and run, once ``nereus.commands.run`` exists). Each
command is a thin shell over one layer.

Bad input (a job that fits nowhere included) prints one line naming the option or field and
what is allowed, and exits 2 with no traceback; a transition that cannot run exits 3. A
reader of stdout that quits (``| head``) ends every command silently with 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
from pydantic import BaseModel
from typer.core import TyperGroup

from nereus import __version__
from nereus.commands import register
from nereus.commands.common import (
    NotAnInteger,
    OneLineUsageError,
    err_console,
    number_kind,
    once_only,
    plain_flags,
    release_pipes,
)
from nereus.commands.common import click as _click
from nereus.commands.jobopts import OPTION_OF
from nereus.errors import EXIT_INPUT, EXIT_OUTPUT_CLOSED, InputError
from nereus.files import os_reason
from nereus.spec.cluster import MAX_DEVICES
from nereus.spec.job import ClusterConfig, JobConfig, WorkloadConfig

_exc = _click.exceptions
_NoArgsIsHelp = getattr(_exc, "NoArgsIsHelpError", ())  # click >= 8.2 only


class _OneLineGroup(TyperGroup):
    """Usage errors (an unknown option, ``--gpus abc``, a missing argument) as one line, like
    every other bad input, instead of click's usage block and boxed message."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_flags(super().get_params(ctx))

    def make_parser(self, ctx: Any) -> Any:
        return once_only(super().make_parser(ctx))

    def invoke(self, ctx: Any) -> Any:
        """Give a usage error raised without a context the subcommand's: click's parser raises
        a missing option value (``nereus plan --config``) without one, and the error would
        point to ``nereus --help``, which does not list plan's options."""
        try:
            return super().invoke(ctx)
        except _exc.UsageError as e:
            name = ctx.invoked_subcommand
            cmd = self.get_command(ctx, name) if e.ctx is None and name else None
            if cmd is not None:
                e.ctx, e.cmd = _click.Context(cmd, info_name=name, parent=ctx), cmd
            raise
        except OSError as e:
            if e.errno == errno.EPIPE:  # past click, which exits 1 on it: ``main`` ends it
                raise _OutputClosed from e
            raise

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            try:
                return super().main(args, prog_name, complete_var, False, windows_expand_args,
                                    **extra)
            finally:
                release_pipes()
        try:
            rv = self._main(args, prog_name, complete_var, windows_expand_args, **extra)
        except (_OutputClosed, BrokenPipeError):
            # the reader of stdout quit (``| head``), while the command wrote or at the last
            # flush: nothing to say, and, as a tool SIGPIPE ends, a code no command gives
            # (1 is transition's "the state differs")
            _discard_stdout()
            sys.exit(EXIT_OUTPUT_CLOSED)
        except OSError as e:
            # the output refused (stdout on a full disk, a file written after its check
            # passed): an error that names no file is the stream's, not a bug's
            if e.filename is not None or e.errno not in _OUTPUT_ERRNOS:
                raise
            _discard_stdout()
            err_console.print(f"error: cannot write the output: {os_reason(e)}", markup=False,
                              highlight=False, soft_wrap=True)
            sys.exit(EXIT_INPUT)
        except _NoArgsIsHelp as e:
            e.show()  # the help text itself
            sys.exit(e.exit_code)
        except OneLineUsageError as e:
            err_console.print(f"error: {e.message}", markup=False, highlight=False,
                              soft_wrap=True)
            sys.exit(EXIT_INPUT)
        except _exc.UsageError as e:
            if (line := _not_a_number(e)) is not None:
                err_console.print(f"error: {line}", markup=False, highlight=False,
                                  soft_wrap=True)
                sys.exit(EXIT_INPUT)
            where = e.ctx.command_path if e.ctx is not None else "nereus"
            msg = " ".join(e.format_message().split())
            err_console.print(f"error: {msg} (see '{where} --help')", markup=False,
                              highlight=False, soft_wrap=True)
            sys.exit(EXIT_INPUT)
        except _exc.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except typer.Abort:
            err_console.print("error: aborted", markup=False, highlight=False)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def _main(self, args: Sequence[str] | None, prog_name: str | None,
              complete_var: str | None, windows_expand_args: bool, **extra: Any) -> Any:
        """Run the command, release the pipes it wrote, and flush stdout here, so output still
        buffered fails where ``main`` handles it, not past every handler. A command that
        failed already (exit 2 with its one line) exits with its own code: a refused stdout
        adds no second line."""
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args,
                              **extra)
        finally:
            release_pipes()
        try:
            sys.stdout.flush()
        except OSError:
            if not isinstance(rv, int) or rv == 0:
                raise
            _discard_stdout()
        return rv


class _OutputClosed(Exception):
    """The reader of stdout quit while a command wrote (EPIPE), carried past click's own
    handling of it (exit 1, whatever the command) to ``_OneLineGroup.main``."""


# what writing an output stream fails with when the fault is where it goes, not nereus
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so what it still buffers is not written again (and refused
    again, past every handler) when the interpreter exits."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout
        pass


def _not_a_number(e: Exception) -> str | None:
    """``--gpus 2.5`` in the one-line form, naming the option and what it allows (the range a
    job field allows, as its YAML error says it), instead of the parser's "Input should be a
    valid integer"; None for any other usage error."""
    param = getattr(e, "param", None)
    kind = number_kind(param)
    if kind is None or not isinstance(e, _exc.BadParameter):
        return None
    assert param is not None  # number_kind(None) is None
    option = next((o for o in param.opts if o.startswith("--")), param.opts[0])
    # typer converts with pydantic, whose error keeps the value; click's did not
    errors = getattr(e.__cause__, "errors", None)
    given = errors()[0].get("input") if callable(errors) and errors() else None
    if isinstance(e, NotAnInteger):  # a float's text, which pydantic took
        given = e.given
    what = "an integer" if kind is int else "a number"
    problem = f"{given!r} is not {what}" if isinstance(given, str) else f"not {what}"
    return str(InputError(option, problem, _ALLOWS.get(option, what)))


def _field_allows(field: str) -> str | None:
    """What the job YAML allows in ``field`` (``workload.prompts_per_step``), from its schema."""
    *section, name = field.split(".")
    schema: dict[str, type[BaseModel]] = {"": JobConfig, "cluster": ClusterConfig,
                                          "workload": WorkloadConfig}
    info = schema[".".join(section)].model_fields.get(name)
    return info.description if info is not None else None


# What each job option allows, as its YAML field says it; --gpus takes a count only (a YAML
# may list device ids).
_ALLOWS = {option: allows for field, option in OPTION_OF.items()
           if (allows := _field_allows(field)) is not None}
_ALLOWS["--gpus"] = f"a pool size 1..{MAX_DEVICES:,}"


app = typer.Typer(
    name="nereus",
    cls=_OneLineGroup,
    help="Keep an RL post-training job on its best TP/PP/DP plan while it runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",  # help text is Rich markup on every typer (older ones: plain)
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"nereus {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Nereus: keep an RL post-training job on its best TP/PP/DP plan while it runs."""


register(app)

if __name__ == "__main__":  # python -m nereus.cli: without this it ran nothing and exited 0
    app(prog_name="nereus")
