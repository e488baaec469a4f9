"""``nereus``: plan, transition, simulate, run. Each command is a thin shell over one layer.

Bad input prints one line naming the field and what is allowed, and exits 2 with no traceback.
"""

from __future__ import annotations

import typer

from nereus.commands import register

app = typer.Typer(
    name="nereus",
    help="Keep an RL post-training job on its best TP/PP/DP plan while it runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Nereus: keep an RL post-training job on its best TP/PP/DP plan while it runs."""


register(app)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
