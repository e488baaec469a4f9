"""The build backend: setuptools', plus mypy when ``NEREUS_MYPYC=1`` asks for the compiled
transition scheduler (``setup.py``). Only then does a build need mypy, so only then is it
asked for: a plain ``pip install .`` fetches nothing more."""

from __future__ import annotations

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # the backend's other hooks, unchanged

# The mypy that type-checks the project (pyproject.toml, dev extras) compiles it
MYPYC = ["mypy>=2.4,<2.5"]
# set while setuptools runs setup.py only to ask what the build needs (mypy is not there yet)
ASKING = "NEREUS_BUILD_ASKING"


def _requires(ask, config_settings):
    os.environ[ASKING] = "1"
    try:
        base = ask(config_settings)
    finally:
        del os.environ[ASKING]
    return base + (MYPYC if os.environ.get("NEREUS_MYPYC") == "1" else [])


def get_requires_for_build_wheel(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)
