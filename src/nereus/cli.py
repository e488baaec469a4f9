"""``nereus``: plan, transition, simulate (and run, once ``nereus.commands.run`` exists). Each
command is a thin shell over one layer.

Bad input (a job that fits nowhere included) prints one line naming the option or field and
what is allowed, and exits 2 with no traceback; a transition that cannot run exits 3.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer
import typer.core
from typer.core import TyperGroup

from nereus import __version__
from nereus.commands import register
from nereus.commands.common import EXIT_INPUT, err_console, plain_flags


# The click that typer runs on: newer typer vendors its own copy (``typer._click``), older ones
# import click itself; the exceptions must be that module's.
_click = getattr(typer.core, "_click", None) or typer.core.click  # type: ignore[attr-defined]
_exc = _click.exceptions
_NoArgsIsHelp = getattr(_exc, "NoArgsIsHelpError", ())  # click >= 8.2 only


class _OneLineGroup(TyperGroup):
    """Usage errors (an unknown option, ``--gpus abc``, a missing argument) as one line, like
    every other bad input, instead of click's usage block and boxed message."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plain_flags(super().get_params(ctx))

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

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except _NoArgsIsHelp as e:  # type: ignore[misc]
            e.show()  # the help text itself
            sys.exit(e.exit_code)
        except _exc.UsageError as e:
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


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
