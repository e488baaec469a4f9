"""The bytes a worker holds, counted against its capacity.

A CPU device slot has no memory limit of its own, so the runtime enforces the configured
capacity by counting: every arena and every transient buffer is reserved here before it is
allocated and released after it is freed. A GPU worker counts the same way (its capacity is 90 %
of the device's memory by default), so the transition's memory bound is checked on both.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


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
    held: int
    peak: int
    capacity: int


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
