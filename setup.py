"""The optional compiled build: ``NEREUS_MYPYC=1 pip install .`` compiles the transition
scheduler (``nereus.transition.search``, ``bound``) and its pricing of primitives
(``nereus.transition.cost``) with mypyc into C extensions, about twice as fast as the same code
interpreted (``benchmarks/transition_schedule.py`` prints which one ran). Without it, the
package is pure Python. The same source runs either way; the compiled modules shadow the ``.py``
files next to them, so an editable install compiled once must be installed again after they
change."""

import os

from setuptools import setup

COMPILED = ["src/nereus/transition/search.py", "src/nereus/transition/bound.py",
            "src/nereus/transition/cost.py"]

ext_modules = []
# (not while the backend only asks what the build needs: mypy comes after that)
if os.environ.get("NEREUS_MYPYC") == "1" and not os.environ.get("NEREUS_BUILD_ASKING"):
    from mypyc.build import mypycify  # the build backend asks for mypy (_build/backend.py)

    ext_modules = mypycify(["--config-file", "_build/mypyc.ini", *COMPILED],
                           group_name="nereus_transition", opt_level="3")

setup(ext_modules=ext_modules)
