"""``nereus examples``: copy the example job configs, verl layouts and simulation scenarios that
ship with the package into a folder, to start a job's config from.

An installed package has no ``examples/`` beside it (that folder is the source tree's), and the
other commands' help points here. Files that already exist are left alone unless ``--force``.
"""

from __future__ import annotations

import shlex
import stat
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nereus.commands.common import Command, console, one_line_errors
from nereus.errors import InputError
from nereus.files import exists, is_dir, os_reason

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

SUFFIXES = (".yaml", ".csv", ".json")  # configs and traces; nothing else is an example


def shipped() -> dict[str, Traversable]:
    """The examples in the package, by path relative to its examples folder."""
    out: dict[str, Traversable] = {}

    def walk(node: Traversable, rel: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            path = f"{rel}{child.name}"
            if child.is_dir():
                walk(child, path + "/")
            elif child.name.endswith(SUFFIXES):
                out[path] = child

    walk(resources.files("nereus").joinpath("examples"), "")
    return out


def _kind(path: Path) -> str:
    """What ``path``, which exists and is not a folder, is: 'a file', 'a character device'..."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return "not a folder"
    for test, name in ((stat.S_ISREG, "a file"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a folder"


def copy_examples(dest: Path, force: bool = False) -> list[Path]:
    """Write every shipped example under ``dest`` (made if missing) and return the files
    written. Refuses, before writing any, when one exists and ``force`` is off."""
    if exists(dest, "DEST") and not is_dir(dest, "DEST", writing=True):
        raise InputError("DEST", f"{dest} is {_kind(dest)}", "a folder, new or existing")
    files = shipped()
    if not files:  # a broken install: say so rather than copy nothing
        raise InputError("DEST", "this installation of nereus ships no examples",
                         "a reinstall of the package")
    # a sub-folder the examples go into that exists as something else: said as such, before
    # writing any (mkdir would fail with "file exists" on the file inside it)
    subs = {"/".join(parts[:k]) for parts in (rel.split("/") for rel in files)
            for k in range(1, len(parts))}
    for sub in (dest / s for s in sorted(subs)):  # a folder before those inside it
        if exists(sub, "DEST") and not is_dir(sub, "DEST", writing=True):
            raise InputError("DEST", f"{sub} is {_kind(sub)}, not a folder",
                             "a DEST whose sub-folders for the examples are folders or new")
    there = [rel for rel in files if exists(dest / rel, "DEST")]
    if there and not force:
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise InputError("DEST", f"{dest / there[0]}{more} already exist{'s' * (not more)}",
                         "a new folder, or --force to overwrite")
    written = []
    for rel, src in files.items():
        out = dest / rel
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read_bytes())
        except OSError as e:
            raise InputError("DEST", f"cannot write {out}: {os_reason(e)}",
                             "a folder you can write") from None
        written.append(out)
    return written


def register(app: typer.Typer) -> None:
    @app.command("examples", cls=Command)
    @one_line_errors
    def examples_cmd(
        # text, not a Path: Path("") is the working folder, and ``nereus examples ""`` (an
        # unset shell variable) copied every example into it
        # examples/ by default: the paths the README, the help and the files' own comments
        # use (nereus plan --config examples/llama-3.1-8b-ppo.yaml)
        dest: str = typer.Argument("examples", metavar="DEST", show_default=True,
                                   help="folder to copy them into (made if missing)"),
        force: bool = typer.Option(False, "--force", help="overwrite files that exist"),
    ) -> None:
        """Copy the example job configs (nereus plan --config), verl layouts (--evaluate) and
        simulation scenarios (nereus simulate --config) into DEST."""
        if not dest.strip():
            raise InputError("DEST", "empty", "a folder path, new or existing; . for the "
                             "working folder")
        folder = Path(dest)
        written = copy_examples(folder, force)
        files = "file" if len(written) == 1 else "files"
        console.print(f"wrote {len(written)} {files} under {folder}:", highlight=False,
                      markup=False)
        for p in written:
            console.print(f"  {p}", highlight=False, markup=False)
        job = folder / "llama-3.1-8b-ppo.yaml"
        scenario = folder / "scenarios" / "node-outage-8b.yaml"
        # quoted: a folder with a space or a quote in its name pastes back as one argument
        console.print(f"try: nereus plan --config {shlex.quote(str(job))} --explain\n"
                      f"     nereus simulate --config {shlex.quote(str(scenario))}",
                      highlight=False, markup=False)
