"""``nereus`` (the console script) and ``python -m nereus``.

The command's modules (numpy, pydantic, matplotlib, ...) take a second or two to import; a
Ctrl-C in that time printed a 35-line traceback. It is the same one line as a Ctrl-C later.
"""

import sys

EXIT_INTERRUPTED = 130  # as nereus.commands.common says it (128 + SIGINT), without its imports


def main() -> None:
    try:
        from nereus.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    app(prog_name="nereus")


if __name__ == "__main__":
    main()
