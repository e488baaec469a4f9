"""The runtime tests' shared fixture: ``clean``, for modules whose ``pool`` fixture starts a
worker pool (one Ray session per module, each module choosing its size)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nereus.runtime.workers import WorkerPool

from runtime_testlib import leaves_nothing


@pytest.fixture()
def clean(pool: WorkerPool) -> Iterator[WorkerPool]:
    """After the test, failing ones included: nothing left behind (``leaves_nothing``)."""
    with leaves_nothing(pool):
        yield pool
