"""``nereus`` (the console script) and ``python -m nereus``.

The command's modules (numpy, pydantic, matplotlib, ...) take a second or two to import; a
Ctrl-C in that time printed a 35-line traceback. It is the same one line as a Ctrl-C later.
"""

import sys

from nereus.errors import EXIT_INTERRUPTED  # a light module: the command's imports come below


def main() -> None:
    try:
        from nereus.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
    app(prog_name="nereus")


if __name__ == "__main__":
    main()
