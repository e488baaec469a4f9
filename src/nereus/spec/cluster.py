"""The cluster (nodes x devices per node) and the pool of device ids a job may use now."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from itertools import groupby

from nereus.errors import InputError
from nereus.spec.device import DeviceSpec

# The largest cluster Nereus plans for: past it a count is a typo (and the planner, which
# enumerates per device, would run for hours or run out of memory instead of saying so).
MAX_DEVICES = 65_536          # devices in the whole cluster
MAX_DEVICES_PER_NODE = 64     # devices in one node (8 on today's GPU servers)


@dataclass(frozen=True)
class Cluster:
    """Homogeneous nodes; device ``i`` sits on node ``i // devices_per_node``."""

    device: DeviceSpec
    num_nodes: int
    devices_per_node: int

    def __post_init__(self) -> None:
        if not 1 <= self.devices_per_node <= MAX_DEVICES_PER_NODE:
            raise InputError("cluster.devices_per_node", f"{self.devices_per_node} is not allowed",
                             f"1..{MAX_DEVICES_PER_NODE}")
        if not 1 <= self.num_nodes <= MAX_DEVICES // self.devices_per_node:
            raise InputError("cluster.nodes", f"{self.num_nodes} nodes of "
                             f"{self.devices_per_node} devices is not allowed",
                             f"1..{MAX_DEVICES // self.devices_per_node}: at most {MAX_DEVICES:,} "
                             f"devices in all")

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def node_of(self, device_id: int) -> int:
        return device_id // self.devices_per_node

    def same_node(self, ids: Iterable[int]) -> bool:
        return len({self.node_of(i) for i in ids}) <= 1

    @classmethod
    def for_gpus(cls, device: DeviceSpec, gpus: int,
                 devices_per_node: int | None = None) -> Cluster:
        """The smallest cluster of whole nodes that holds ``gpus`` devices."""
        if not 1 <= gpus <= MAX_DEVICES:
            raise InputError("gpus", f"{gpus} devices is not allowed", f"1..{MAX_DEVICES:,}")
        per_node = devices_per_node or device.devices_per_node
        per_node = min(per_node, gpus) if devices_per_node is None else per_node
        nodes = -(-gpus // per_node)
        return cls(device, nodes, per_node)


@dataclass(frozen=True)
class GpuPool:
    """The device ids of ``cluster`` that the job may use now (sorted, unique)."""

    cluster: Cluster
    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        ids = tuple(sorted(set(self.ids)))
        object.__setattr__(self, "ids", ids)
        if not ids:
            raise InputError("gpus", "the GPU pool is empty", "at least one device")
        bad = [i for i in ids if not 0 <= i < self.cluster.num_devices]
        if bad:
            raise InputError("gpus", f"device ids {bad} are outside the cluster",
                             f"0..{self.cluster.num_devices - 1}")

    @classmethod
    def first(cls, cluster: Cluster, n: int) -> GpuPool:
        if not 1 <= n <= cluster.num_devices:
            raise InputError("gpus", f"{n} devices requested", f"1..{cluster.num_devices}")
        return cls(cluster, tuple(range(n)))

    @classmethod
    def full(cls, cluster: Cluster) -> GpuPool:
        return cls(cluster, tuple(range(cluster.num_devices)))

    @property
    def size(self) -> int:
        return len(self.ids)

    def by_node(self) -> dict[int, tuple[int, ...]]:
        """The pool's ids on each node, nodes in order (a new dict each call)."""
        return dict(self._nodes)

    @cached_property
    def _nodes(self) -> dict[int, tuple[int, ...]]:
        """``by_node``, worked out once per pool: a plan search asks dozens of times. The ids
        are sorted, so a node's ids are one run."""
        return {n: tuple(ids) for n, ids in groupby(self.ids, key=self.cluster.node_of)}

    def largest_node_share(self) -> int:
        """Most devices of this pool on any one node (bounds a TP group kept inside a node)."""
        return max(len(v) for v in self.by_node().values())

    def without(self, ids: Iterable[int]) -> GpuPool:
        drop = set(ids)
        return GpuPool(self.cluster, tuple(i for i in self.ids if i not in drop))

    def with_ids(self, ids: Iterable[int]) -> GpuPool:
        return GpuPool(self.cluster, tuple(set(self.ids) | set(ids)))


def format_gpus(gpus: Iterable[int]) -> str:
    """GPU ids in the given order, runs of consecutive ids written ``a-b`` (``0-3,8,10-11``)."""
    ids = list(gpus)
    if not ids:
        return "-"
    parts: list[str] = []
    start = prev = ids[0]
    for g in ids[1:]:
        if g == prev + 1:
            prev = g
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = g
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def gpu_ranges(ids: Iterable[int]) -> str:
    """A set of GPU ids as runs, in increasing order: [8, 9, 0, 1, 2, 3] -> '0-3,8-9'."""
    return format_gpus(sorted(ids))
