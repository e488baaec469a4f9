"""A checkpoint save that fails halfway leaves the previous one of that tag intact."""

from pathlib import Path

import pytest

from nereus.cost.candidate import Layout
from nereus.runtime.checkpoint import Checkpointer
from nereus.transition.emu import Emu, Holds


class _Pool:
    """Stands in for the workers: writes one file per stage, or fails when told to."""

    def __init__(self) -> None:
        self.fail = False

    def run(self, calls):
        if self.fail:
            raise RuntimeError("worker 1 died")
        for fn, args in calls.values():
            Path(args[1]).mkdir(parents=True, exist_ok=True)
            (Path(args[1]) / f"shard-{args[4]}").write_text("state")
        return {}


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path) -> None:
    ck = Checkpointer(tmp_path / "ckpt", timeout_s=10)
    pool = _Pool()
    unit = Emu("actor_train/0", "actor_train", "actor", Layout(1, 2), (0, 1), Holds.THETA_OMEGA)
    first = ck.save(pool, {"actor_train": [unit]}, tag=5)
    assert sorted(p.name for p in (first / "actor_train").iterdir()) == ["shard-0", "shard-1"]
    pool.fail = True
    with pytest.raises(RuntimeError, match="died"):
        ck.save(pool, {"actor_train": [unit]}, tag=5)
    assert ck.latest() == first
    assert sorted(p.name for p in (first / "actor_train").iterdir()) == ["shard-0", "shard-1"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step-5"]  # no leftovers
    pool.fail = False
    assert ck.save(pool, {"actor_train": [unit]}, tag=5) == first
