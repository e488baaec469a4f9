"""Byte counting and arena reuse inside one worker context (no Ray)."""

from __future__ import annotations

import pytest
import torch

from nereus.runtime.loading import seeded_meta
from nereus.runtime.memory import ArenaCache, ByteCounter, CapacityError
from nereus.runtime.state import StateSpec, arena_layout
from nereus.runtime.workers import WorkerContext
from nereus.spec.model import MODEL_PRESETS, Head

SPEC = StateSpec(MODEL_PRESETS["tiny-llama"])
ONE = arena_layout(SPEC, 1, 1, 0, 0).nbytes


def _ctx(capacity: int) -> WorkerContext:
    return WorkerContext(0, torch.device("cpu"), capacity)


def test_counter_refuses_past_capacity_and_keeps_its_peak() -> None:
    c = ByteCounter(3, 100)
    c.reserve(60)
    with pytest.raises(CapacityError) as e:
        c.reserve(41, "x")
    assert e.value.device_id == 3 and e.value.held == 60
    c.release(60)
    c.reserve(100)
    assert c.stats().peak == 100
    with pytest.raises(RuntimeError):
        c.release(101)
    with pytest.raises(CapacityError):
        c.set_capacity(50)


def test_freed_arena_is_reused_and_counted_within_capacity() -> None:
    ctx = _ctx(3 * ONE)
    a = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))
    ptr = a.buffer.data_ptr()
    ctx.hold("a", a)
    del a
    assert ctx.drop("a") == ONE
    st = ctx.memory_stats()
    assert st.held == 0 and st.cached == ONE
    b = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))
    assert b.buffer.data_ptr() == ptr and ctx.memory_stats().cached == 0
    ctx.hold("b", b)
    del b
    # live plus cached bytes never pass the capacity: the cache gives way to live state
    c = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))
    ctx.hold("c", c)
    del c
    ctx.drop("b")
    assert ctx.memory_stats().cached == ONE
    d = ctx.allocate(SPEC, 2, 1, 0, 0, seeded_meta(1))  # a different size: not from the cache
    st = ctx.memory_stats()
    assert st.held + st.cached <= st.capacity
    ctx.free(d)


def test_memory_still_viewed_elsewhere_is_not_reused() -> None:
    ctx = _ctx(4 * ONE)
    a = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))
    ctx.hold("a", a)
    kept = a.params["model.norm.weight"]  # e.g. the engine still holds a view
    del a
    ctx.drop("a")
    assert ctx.memory_stats().cached == 0
    kept.fill_(1.0)
    b = ctx.allocate(SPEC, 1, 1, 0, 0, seeded_meta(1))
    b.buffer.fill_(0)
    assert bool((kept == 1.0).all())


def test_cache_takes_the_smallest_block_that_fits() -> None:
    cache = ArenaCache(max_slack=0.5)
    for n in (100, 140, 400):
        assert cache.give(torch.empty(n, dtype=torch.uint8))
    assert cache.take(90).numel() == 90 and cache.bytes == 540
    assert cache.take(130).numel() == 130 and cache.bytes == 400  # among blocks of other sizes
    assert cache.take(1000) is None
    cache.evict(100)
    assert cache.bytes == 0 or cache.bytes <= 100


def test_a_reused_larger_block_counts_its_arena_bytes_not_its_slack() -> None:
    """A smaller arena placed in a cached larger block counts the arena's bytes (what the
    transition planner counts), and releases the same when it goes: the slack is not counted,
    so an arena that fits by the planner's bytes is not refused because of it."""
    small_spec = StateSpec(MODEL_PRESETS["tiny-llama"], Head.SCALAR, trainable=True)
    big = arena_layout(SPEC, 1, 2, 0, 1).nbytes
    small = arena_layout(small_spec, 1, 2, 0, 1).nbytes
    assert big * 0.8 < small < big  # within the cache's slack: the block is reused
    ctx = _ctx(big + small)
    a = ctx.allocate(SPEC, 1, 2, 0, 1, seeded_meta(1))
    ctx.hold("a", a)
    del a
    ctx.drop("a")
    b = ctx.allocate(small_spec, 1, 2, 0, 1, seeded_meta(1))
    ctx.hold("b", b)
    assert b.buffer.untyped_storage().nbytes() == big and b.nbytes == small  # reused
    del b
    st = ctx.memory_stats()
    assert st.held == small and st.cached == 0
    # the arenas sum to the capacity: the big one fits beside the small one in its block
    c = ctx.allocate(SPEC, 1, 2, 0, 1, seeded_meta(1))
    assert ctx.memory_stats().held == big + small
    ctx.free(c)
    assert ctx.drop("b") == small
    st = ctx.memory_stats()
    assert st.held == 0 and st.cached <= st.capacity


def test_a_split_that_cannot_allocate_its_staging_buffers_gives_every_byte_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocation error is what the caller sees, the new arena and the staging bytes are
    released, and the source unit stays."""
    from nereus.runtime import movement as mv
    from nereus.runtime.comm import GroupSpec, StoreAddress
    from nereus.runtime.splitting import staging_bytes

    ctx = _ctx(1 << 30)
    mv.place_seeded(ctx, "src", SPEC, (2, 1), (0, 0), seed=5)
    before = ctx.memory.stats().held
    members = ((0, 0), (1, 0))
    assert staging_bytes(SPEC, 2, 1, members, (1, 1), mv.BUCKET_BYTES) > 0

    class NoStagingMemory:
        def __getattr__(self, name: str) -> object:
            return getattr(torch, name)

        def empty(self, *args: object, **kwargs: object) -> torch.Tensor:
            raise MemoryError("no room for the staging buffers")

    monkeypatch.setattr(mv, "torch", NoStagingMemory())
    never_joined = GroupSpec("split", StoreAddress("127.0.0.1", 1), (0, 1), "split/", 1.0)
    with pytest.raises(MemoryError, match="staging"):
        mv.split_member(ctx, never_joined, "src", "dst", (1, 1), members)
    assert ctx.memory.stats().held == before
    assert set(ctx.units) == {"src"}
