"""One module per CLI command; each registers itself on the Typer app."""

from __future__ import annotations

import importlib

import typer

COMMANDS = ("plan", "transition", "simulate", "examples", "run")


def register(app: typer.Typer) -> None:
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"nereus.commands.{name}")
        except ModuleNotFoundError as e:  # a command not built yet
            if e.name == f"nereus.commands.{name}":
                continue
            raise
        module.register(app)
