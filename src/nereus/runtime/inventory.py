"""Hardware inventory: what devices the Ray cluster has, from Ray's resources and NVML.

The monitor's pool P_gpu and the workers' capacities come from here (paper §4.1). GPUs are read
with NVML (nvidia-ml-py) on the node that holds them; a CPU machine offers *device slots*, a
custom Ray resource (``nereus_slot``) that says how many CPU workers the machine hosts.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOT_RESOURCE = "nereus_slot"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    ip: str
    cpus: float
    gpus: float
    memory_bytes: int
    slots: float                 # custom device-slot resource (CPU workers)
    gpu_info: tuple[GpuInfo, ...] = ()  # from NVML on that node, empty when unavailable


@dataclass(frozen=True)
class Inventory:
    """The cluster's nodes; ``kind`` is "gpu" when it has GPUs, else "cpu" (device slots)."""

    nodes: tuple[NodeInfo, ...]
    source: str  # where the figures came from

    @property
    def kind(self) -> str:
        return "gpu" if any(n.gpus >= 1 for n in self.nodes) else "cpu"

    @property
    def devices(self) -> int:
        if self.kind == "gpu":
            return int(sum(n.gpus for n in self.nodes))
        return int(sum(n.slots for n in self.nodes))

    def device_memory_bytes(self) -> int | None:
        """Smallest GPU memory NVML reported, or None (CPU, or NVML absent)."""
        mems = [g.memory_bytes for n in self.nodes for g in n.gpu_info]
        return min(mems) if mems else None


def nvml_gpus() -> tuple[GpuInfo, ...]:
    """GPUs of this node per NVML; empty when there is no driver or no nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml.NVMLError when no driver is loaded
        return ()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
            out.append(GpuInfo(i, name, mem))
        return tuple(out)
    finally:
        pynvml.nvmlShutdown()


def detect_inventory(slot_resource: str = SLOT_RESOURCE) -> Inventory:
    """Read the connected Ray cluster's nodes; NVML runs on each node that has GPUs."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = []
    probe = ray.remote(num_cpus=0)(nvml_gpus)
    for n in ray.nodes():
        if not n.get("Alive", False):
            continue
        res = n.get("Resources", {})
        gpus = float(res.get("GPU", 0.0))
        info: tuple[GpuInfo, ...] = ()
        if gpus >= 1:
            strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            info = ray.get(probe.options(scheduling_strategy=strategy).remote(), timeout=60)
        nodes.append(NodeInfo(n["NodeID"], str(n.get("NodeManagerAddress", "")),
                              float(res.get("CPU", 0.0)), gpus, int(res.get("memory", 0)),
                              float(res.get(slot_resource, 0.0)), info))
    source = "ray.nodes()" + (" + NVML" if any(n.gpu_info for n in nodes) else "")
    return Inventory(tuple(nodes), source)
