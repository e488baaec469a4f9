"""Workers, capacity and communicators on a real local Ray session (one per module)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import ray
import torch
from ray.util import placement_group_table

from nereus.errors import InputError
from nereus.runtime import movement as mv
from nereus.runtime.comm import Rendezvous, close_groups, open_groups
from nereus.runtime.inventory import detect_inventory
from nereus.runtime.loading import seeded_meta
from nereus.runtime.memory import CapacityError
from nereus.runtime.state import StateSpec, arena_layout
from nereus.runtime.workers import NCCL_ERROR_HANDLING, WorkerContext, WorkerPool
from nereus.spec.model import MODEL_PRESETS, Head

from runtime_testlib import (
    gone,
    leaves_nothing,
    listening_ports,
    pids,
    worker_pool,
    worker_resources,
)

CAPACITY = 4 * 1024**2


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with worker_pool(__name__, 4, capacity_bytes=CAPACITY) as p:
        yield p


@pytest.fixture(autouse=True)
def no_leaks(pool: WorkerPool) -> Iterator[None]:
    """Every test leaves no group, no parked backend and no extra listening port behind."""
    with leaves_nothing(pool, clear=False):
        yield


def _whoami(ctx: WorkerContext, x: int, *, y: int) -> tuple[int, str, int]:
    return ctx.device_id, str(ctx.device), x + y


def test_one_worker_per_slot_and_call_runs_fn_with_the_context(pool: WorkerPool) -> None:
    infos = pool.infos()
    assert sorted(infos) == [0, 1, 2, 3]
    assert len({i.pid for i in infos.values()}) == 4
    assert all(i.capacity_bytes == CAPACITY for i in infos.values())
    got = {d: ray.get(pool.submit(d, _whoami, d, y=10)) for d in range(4)}
    assert got == {d: (d, "cpu", d + 10) for d in range(4)}
    inv = detect_inventory()
    assert inv.kind == "cpu" and inv.devices >= 4 and "ray" in inv.source
    # an NCCL error aborts the communicator and raises; it does not end the worker's process
    assert pool.run_all(_env, NCCL_ERROR_HANDLING) == {d: "2" for d in range(4)}


def _env(ctx: WorkerContext, name: str) -> str | None:
    return os.environ.get(name)


def test_capacity_is_enforced_by_counting_held_bytes(pool: WorkerPool) -> None:
    spec = StateSpec(MODEL_PRESETS["tiny-llama"], Head.LM, True)
    one = arena_layout(spec, 1, 1, 0, 0).nbytes  # ~2.4 MB: one fits in 4 MiB, two do not
    assert one < CAPACITY < 2 * one
    assert ray.get(pool.submit(0, mv.place_seeded, "a", spec, (1, 1), (0, 0), 1)) == one
    try:
        with pytest.raises(CapacityError):
            ray.get(pool.submit(0, mv.place_seeded, "b", spec, (1, 1), (0, 0), 1))
        mem = pool.memory()[0]
        assert mem.held == one and mem.peak <= mem.capacity
        assert ray.get(pool.submit(0, mv.held_units)) == {"a": one}
    finally:  # the unit goes, a failing check included (later tests expect an empty worker)
        ray.get(pool.submit(0, mv.destroy_member, "a"))
    assert pool.memory()[0].held == 0


def _sum_in(ctx: WorkerContext, name: str) -> float:
    g = ctx.groups[name]
    t = torch.tensor([float(ctx.device_id + 1)])
    g.all_reduce(t)
    return float(t.item())


def _gather_ids(ctx: WorkerContext, name: str) -> list[int]:
    g = ctx.groups[name]
    outs = [torch.zeros(1, dtype=torch.int64) for _ in range(g.size)]
    g.all_gather(outs, torch.tensor([ctx.device_id]))
    return [int(o.item()) for o in outs]


def test_groups_among_any_subset_without_a_global_world(pool: WorkerPool) -> None:
    groups = {"a": (2, 0, 3), "b": (1, 3), "c": (0, 1)}
    with Rendezvous() as rv:
        setup = open_groups(pool, groups, rv)
    assert set(setup) == set(groups) and all(0 < s < 30 for s in setup.values())
    try:
        refs = {d: pool.submit(d, _sum_in, "a") for d in groups["a"]}
        sums = {d: ray.get(r) for d, r in refs.items()}
        assert sums == {d: 3.0 + 1.0 + 4.0 for d in groups["a"]}
        refs = {d: pool.submit(d, _gather_ids, "a") for d in groups["a"]}
        assert all(ray.get(r) == [2, 0, 3] for r in refs.values())  # group-local rank order
        refs = {d: pool.submit(d, _sum_in, "b") for d in groups["b"]}
        assert {d: ray.get(r) for d, r in refs.items()} == {1: 6.0, 3: 6.0}
        assert worker_resources(pool)[0][1] == 2  # worker 0 is in "a" and "c"
    finally:
        close_groups(pool, groups)


def test_rendezvous_port_is_held_then_released() -> None:
    rv = Rendezvous()
    assert rv.port in listening_ports()
    rv.close()
    assert rv.port not in listening_ports()


def test_pool_grows_and_shrinks_with_its_processes(pool: WorkerPool) -> None:
    pool.grow([4, 5])
    try:
        assert pool.device_ids == (0, 1, 2, 3, 4, 5)
        new = pids(pool)
        assert ray.get(pool.submit(5, _whoami, 1, y=1))[0] == 5
    finally:  # back to the module's four workers, a failing check included
        pool.shrink([4, 5])
    assert pool.device_ids == (0, 1, 2, 3)
    assert gone([new[4], new[5]])


def _free_slots(expected: float) -> float:
    """The free device slots once Ray's view has settled on ``expected`` (or 20 s passed)."""
    deadline = time.monotonic() + 20
    while ray.available_resources().get("nereus_slot", 0) != expected \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return ray.available_resources().get("nereus_slot", 0)


def test_a_grow_after_a_shrink_reuses_the_bundle_it_emptied(pool: WorkerPool) -> None:
    """Ray frees a placement group only whole: a worker shrunk out of a batch leaves its
    bundle reserved, so the next grow starts there instead of asking the cluster for a slot
    it may not have; once the batch's last worker goes, its slots are free again."""
    free = ray.available_resources()["nereus_slot"]
    pool.grow([4, 5])
    try:
        pool.shrink([5])
        assert pool.device_ids == (0, 1, 2, 3, 4)
        assert _free_slots(free - 2) == free - 2  # the bundle of 5 is still reserved
        pool.grow([6])
        assert pool.device_ids == (0, 1, 2, 3, 4, 6)
        assert ray.get(pool.submit(6, _whoami, 1, y=1))[0] == 6
        assert pool._slots[6].group.id == pool._slots[4].group.id
        assert _free_slots(free - 2) == free - 2  # no new slot was taken
    finally:
        pool.shrink([4, 5, 6])
    assert pool.device_ids == (0, 1, 2, 3)
    assert _free_slots(free) == free


def _mark(ctx: WorkerContext, key: str) -> None:
    ctx.scratch[key] = True


def _take_mark(ctx: WorkerContext, key: str) -> bool:
    return bool(ctx.scratch.pop(key, False))


def test_run_checks_every_device_before_any_call_starts(pool: WorkerPool) -> None:
    with pytest.raises(InputError, match="no worker for device 99"):
        pool.run({0: (_mark, ("run-check",)), 99: (_mark, ("run-check",))})
    assert ray.get(pool.submit(0, _take_mark, "run-check")) is False  # worker 0 ran nothing


def test_a_failed_grow_leaves_no_worker_and_no_placement_group(pool: WorkerPool,
                                                               monkeypatch) -> None:
    """The new workers do not answer in time: they are killed and their placement group
    removed before the error is raised, and the pool is as it was."""
    free = ray.available_resources()["nereus_slot"]
    spawned: list[tuple[object, object]] = []
    spawn = pool._spawn

    def recording_spawn(device_id: int, group: object, bundle: int) -> object:
        actor = spawn(device_id, group, bundle)
        spawned.append((actor, group))
        return actor

    def timing_out_get(*args: object, **kwargs: object) -> object:
        raise ray.exceptions.GetTimeoutError("no answer in time")

    with monkeypatch.context() as m:
        m.setattr(pool, "_spawn", recording_spawn)
        m.setattr(ray, "get", timing_out_get)
        with pytest.raises(ray.exceptions.GetTimeoutError):
            pool.grow([4, 5])
    assert pool.device_ids == (0, 1, 2, 3)
    assert len(spawned) == 2
    assert placement_group_table(spawned[0][1])["state"] == "REMOVED"
    for actor, _ in spawned:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.info.remote(), timeout=30)
    deadline = time.monotonic() + 20
    while ray.available_resources().get("nereus_slot", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("nereus_slot", 0) == free


def test_a_rename_applies_once_per_token_and_a_clash_changes_nothing() -> None:
    """The executor may send a rename again to finish one a fault cut short: a worker that
    applied it already must not apply it twice (a swap would be undone)."""
    spec = StateSpec(MODEL_PRESETS["tiny-llama"])
    ctx = WorkerContext(0, torch.device("cpu"), 1 << 30)
    a, b = (ctx.allocate(spec, 1, 1, 0, 0, seeded_meta(s)) for s in (1, 2))
    ctx.hold("s/0", a)
    ctx.hold("s/1", b)
    swap = {"s/0": "s/1", "s/1": "s/0"}
    assert ctx.rename(swap, "t1")
    assert ctx.units["s/1"] is a and ctx.units["s/0"] is b
    assert not ctx.rename(swap, "t1")  # the same rename again: nothing changes
    assert ctx.units["s/1"] is a and ctx.units["s/0"] is b
    with pytest.raises(KeyError, match=r"s/1"):
        ctx.rename({"s/0": "s/1"}, "t2")  # would overwrite a held unit
    assert ctx.units == {"s/1": a, "s/0": b}
    ctx.drop("s/1")
    assert ctx.rename({"s/0": "s/1"}, "t2")  # a refused token is not spent
    assert ctx.units == {"s/1": b}
    ctx.drop("s/1")
    assert ctx.memory.stats().held == 0
