"""The compiled build (``NEREUS_MYPYC=1`` at install, setup.py): where it was asked for, the
scheduler runs compiled, so a build that quietly fell back to the interpreted code cannot pass
for it (CI installs it so, and every other test then runs the compiled scheduler)."""

import os

from nereus.transition import bound, cost, search


def test_a_compiled_build_runs_compiled() -> None:
    asked = os.environ.get("NEREUS_MYPYC") == "1"
    assert search.COMPILED == asked, (search.__file__, asked)
    for module in (bound, cost):
        assert module.__file__.endswith(".py") != asked, module.__file__

