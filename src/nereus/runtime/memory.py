"""The bytes a worker holds, counted against its capacity.

A CPU device slot has no memory limit of its own, so the runtime enforces the configured
capacity by counting: every arena and every buffer of the runtime's own data movement (staging
and probe buffers) is reserved here before it is allocated and released after it is freed. A GPU
worker counts the same way (its capacity is 90 % of the device's memory by default), so the
transition's memory bound is checked on both.

The engine's transients (activations, gradients, KV cache: what a stage operation allocates
while it runs) are not reserved here, so a CPU worker does not refuse them past its capacity;
they are measured instead (``nereus.engine.measure``; on CPU a stage's peak is what this
counter holds plus the transients' peak) and bounded by the planner's memory check. Transitions
and stage operations never overlap on a worker (its calls run one at a time), so a transition's
count is not disturbed by them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch


class CapacityError(RuntimeError):
    """A worker was asked to hold more bytes than its capacity."""

    def __init__(self, device_id: int, need: int, held: int, capacity: int, what: str):
        self.device_id, self.need, self.held, self.capacity = device_id, need, held, capacity
        self.what = what
        super().__init__(f"worker {device_id}: {what} needs {need} bytes, holds {held} of "
                         f"{capacity}")

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:  # crosses processes via Ray
        return (CapacityError, (self.device_id, self.need, self.held, self.capacity, self.what))


@dataclass(frozen=True)
class MemoryStats:
    held: int       # bytes of live state and buffers
    peak: int       # the largest ``held`` since the last reset
    capacity: int
    cached: int = 0  # freed arena memory kept for reuse (CPU workers; see ArenaCache)
    # a GPU worker's torch.cuda.max_memory_allocated since the last reset (measured, unlike
    # the counted bytes above); None on a CPU worker
    device_peak: int | None = None


class ByteCounter:
    """Thread-safe count of held bytes with its peak; ``reserve`` refuses past ``capacity``."""

    def __init__(self, device_id: int, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1 byte")
        self.device_id = device_id
        self.capacity = int(capacity)
        self._held = 0
        self._peak = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, what: str = "allocation") -> None:
        with self._lock:
            if self._held + nbytes > self.capacity:
                raise CapacityError(self.device_id, nbytes, self._held, self.capacity, what)
            self._held += nbytes
            self._peak = max(self._peak, self._held)

    def release(self, nbytes: int) -> None:
        with self._lock:
            if nbytes > self._held:
                raise RuntimeError(f"worker {self.device_id}: releasing {nbytes} bytes, "
                                   f"holds {self._held}")
            self._held -= nbytes

    def set_capacity(self, capacity: int) -> None:
        with self._lock:
            if capacity < self._held:
                raise CapacityError(self.device_id, 0, self._held, capacity, "new capacity")
            self.capacity = int(capacity)

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._held

    def stats(self) -> MemoryStats:
        with self._lock:
            return MemoryStats(self._held, self._peak, self.capacity)


def block_bytes(t: torch.Tensor) -> int:
    """Bytes of the memory block ``t`` lives in (more than ``t``'s own when ``t`` is a view of
    part of it): what holding ``t`` keeps resident."""
    return int(t.untyped_storage().nbytes())


def _storage_refs(t: torch.Tensor) -> int:
    """Tensors sharing ``t``'s memory, ``t`` included."""
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata)) - 1


class ArenaCache:
    """Freed arena buffers of a CPU worker, kept for the next arena of about the same size.

    Why: a fresh allocation is faulted in page by page on its first write, and on a virtual
    machine a 4 KiB page fault costs microseconds, so receiving a replica into new memory took
    2-3 times as long as the transfer itself. Reusing memory is what CUDA's caching allocator
    does for GPU workers. A buffer is cached only when nothing else still views it (an engine
    holding views of a dropped unit keeps its memory to itself); cached bytes count against
    the worker's capacity together with live ones and are freed first when live state needs
    the room. A block handed out for a smaller arena stays whole (resident), but its holder
    counts the arena's bytes, as the transition planner does: the slack, at most ``max_slack``
    of the arena, is not counted, so work that fits by the planner's bytes is not refused.
    """

    def __init__(self, max_slack: float = 0.25):
        self.max_slack = max_slack  # reuse a block at most this fraction larger than needed
        self._blocks: list[torch.Tensor] = []
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(b.numel() for b in self._blocks)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A cached buffer of at least ``nbytes`` (a view of its first ``nbytes``; the block
        behind it, up to ``max_slack`` larger, stays resident while the view lives), or None."""
        with self._lock:
            fits = [b for b in self._blocks
                    if nbytes <= b.numel() <= nbytes * (1 + self.max_slack)]
            if not fits:
                return None
            best = min(fits, key=lambda b: b.numel())
            # by identity: list.remove would compare tensors elementwise
            self._blocks = [b for b in self._blocks if b is not best]
        return best[:nbytes]

    def give(self, buffer: torch.Tensor) -> bool:
        """Keep ``buffer``'s memory if nothing but ``buffer`` (and the block it views)
        references it; True when cached."""
        block = buffer if buffer._base is None else buffer._base
        expected = 1 if block is buffer else 2
        if block.dtype != torch.uint8 or block.dim() != 1 or _storage_refs(block) != expected:
            return False
        with self._lock:
            self._blocks.append(block)
        return True

    def evict(self, keep_at_most: int) -> None:
        """Free cached blocks, largest first, until at most ``keep_at_most`` bytes stay."""
        with self._lock:
            self._blocks.sort(key=lambda b: b.numel())
            while self._blocks and sum(b.numel() for b in self._blocks) > keep_at_most:
                self._blocks.pop()

    def clear(self) -> None:
        self.evict(0)
