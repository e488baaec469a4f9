"""``python -m nereus``: the ``nereus`` command, where the console script is not on PATH."""

from nereus.cli import app

app(prog_name="nereus")
