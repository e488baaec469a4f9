"""Checkpoint failures: a save that fails halfway leaves the previous one of that tag intact; a
restore that cannot keep what it would load counts no bytes."""

import os
from pathlib import Path

import pytest

from nereus.cost.candidate import Layout
from nereus.runtime.checkpoint import SLOW_IO_BW, Checkpointer
from nereus.runtime.workers import GRACE_S
from nereus.transition.emu import Emu, Holds


class _Pool:
    """Stands in for the workers: writes one file per stage, or fails when told to; records
    how long each batch of calls was given."""

    capacity_bytes = 5 * 10**9

    def __init__(self) -> None:
        self.fail = False
        self.timeouts: list[float | None] = []

    def run(self, calls, timeout_s=None):
        self.timeouts.append(timeout_s)
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


def _copy(root: Path, name: str, tag: int, shard: str) -> Path:
    p = root / name
    (p / "actor_train").mkdir(parents=True)
    (p / "actor_train" / shard).write_text("state")
    (p / "COMPLETE").write_text(str(tag))
    return p


def test_a_crash_between_the_two_renames_of_a_swap_is_finished(tmp_path) -> None:
    """The old copy was moved aside and the new one not yet renamed in: the new one is the
    checkpoint, and the old one goes."""
    root = tmp_path / "ckpt"
    _copy(root, ".step-5.old-100", 5, "old")
    _copy(root, ".step-5.partial-100", 5, "new")
    (root / ".step-6.partial-101" / "actor_train").mkdir(parents=True)  # a save still writing
    ck = Checkpointer(root, timeout_s=10)
    assert ck.latest() == root / "step-5"
    assert [p.name for p in (root / "step-5" / "actor_train").iterdir()] == ["new"]
    assert sorted(p.name for p in root.iterdir()) == [".step-6.partial-101", "step-5"]


def test_a_crash_after_moving_the_old_copy_aside_without_a_new_one_puts_it_back(
        tmp_path) -> None:
    root = tmp_path / "ckpt"
    _copy(root, ".step-5.old-100", 5, "old")
    _copy(root, "step-4", 4, "four")
    ck = Checkpointer(root, timeout_s=10)
    assert ck.latest() == root / "step-5"  # the highest step, whatever the files' times
    assert (root / "step-5").is_dir() and not (root / ".step-5.old-100").exists()
    assert [p.name for p in (root / "step-5" / "actor_train").iterdir()] == ["old"]


def test_copies_left_beside_a_complete_checkpoint_are_removed_by_the_next_save(tmp_path) -> None:
    root = tmp_path / "ckpt"
    _copy(root, "step-5", 5, "kept")
    _copy(root, ".step-5.old-100", 5, "old")
    ck = Checkpointer(root, timeout_s=10)
    unit = Emu("actor_train/0", "actor_train", "actor", Layout(1, 2), (0, 1), Holds.THETA_OMEGA)
    ck.save(_Pool(), {"actor_train": [unit]}, tag=7)
    assert sorted(p.name for p in root.iterdir()) == ["step-5", "step-7"]


def test_a_restore_onto_a_unit_the_worker_holds_is_refused_and_counts_no_bytes(tmp_path) -> None:
    """One worker context in this process, a one-member DCP save and load: loading under an
    id the worker already holds fails before it allocates (it used to load a second arena,
    fail to keep it, and leave its bytes counted); under a new id it loads bitwise."""
    import torch

    from nereus.runtime.checkpoint import dcp_load, dcp_save
    from nereus.runtime.comm import Rendezvous
    from nereus.runtime.movement import place_seeded
    from nereus.runtime.state import StateSpec, gather
    from nereus.runtime.workers import WorkerContext
    from nereus.spec.model import MODEL_PRESETS

    spec = StateSpec(MODEL_PRESETS["tiny-llama"])
    ctx = WorkerContext(0, torch.device("cpu"), 1 << 30)
    one = place_seeded(ctx, "u", spec, (1, 1), (0, 0), seed=3)
    path = str(tmp_path / "u")
    with Rendezvous("127.0.0.1", timeout_s=30) as rv:
        dcp_save(ctx, "u", path, rv.address, "save/", 0, 1, 30.0, sync_files=False)
        with pytest.raises(KeyError, match="already holds unit u"):
            dcp_load(ctx, "u", spec, (1, 1), (0, 0), 0, path, rv.address, "load/", 0, 1, 30.0)
        assert ctx.memory.stats().held == one and set(ctx.units) == {"u"}
        dcp_load(ctx, "v", spec, (1, 1), (0, 0), 0, path, rv.address, "again/", 0, 1, 30.0)
    assert ctx.memory.stats().held == 2 * one
    assert gather([ctx.units["v"]]).equal(gather([ctx.units["u"]]))


def test_the_latest_checkpoint_is_the_highest_step_whatever_the_files_times(tmp_path) -> None:
    """Step 9's marker written before step 10's, then both given the same time (a file system
    with coarse timestamps), then step 9's touched last (a copy): step 10 is the latest."""
    root = tmp_path / "ckpt"
    _copy(root, "step-9", 9, "nine")
    _copy(root, "step-10", 10, "ten")
    for name, t in (("step-9", 2_000_000_000), ("step-10", 1_000_000_000)):
        marker = root / name / "COMPLETE"
        marker.touch()
        os.utime(marker, (t, t))
    assert Checkpointer(root, timeout_s=10).latest() == root / "step-10"


def test_a_save_waits_on_its_workers_for_a_bounded_time(tmp_path) -> None:
    """A worker stuck in a save fails the save instead of hanging it: its calls are due
    within the collectives' timeout, a full worker's bytes at the slowest assumed storage
    rate, and the grace."""
    ck = Checkpointer(tmp_path / "ckpt", timeout_s=10)
    pool = _Pool()
    unit = Emu("actor_train/0", "actor_train", "actor", Layout(1, 2), (0, 1), Holds.THETA_OMEGA)
    ck.save(pool, {"actor_train": [unit]}, tag=1)
    assert pool.timeouts == [ck.due_s(pool)]
    assert ck.due_s(pool) == 10 + 5e9 / SLOW_IO_BW + GRACE_S
