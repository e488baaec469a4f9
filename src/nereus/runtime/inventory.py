"""Hardware inventory: what devices the Ray cluster has, from Ray's resources and NVML.

The monitor's pool P_gpu and the workers' capacities come from here (paper §4.1). GPUs are read
with NVML (nvidia-ml-py) on the node that holds them; a CPU machine offers *device slots*, a
custom Ray resource (``nereus_slot``) that says how many CPU workers the machine hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


# ---------------------------------------------------------------- measured CPU device
def _memcpy_rate(ctx: Any, nbytes: int, repeats: int) -> float:
    """Memory traffic (bytes read + written per second) of the best of ``repeats`` copies
    between two touched buffers in this worker."""
    import time

    import torch

    ctx.memory.reserve(2 * nbytes, "memory bandwidth probe")
    try:
        a = torch.ones(nbytes, dtype=torch.uint8)
        b = torch.zeros(nbytes, dtype=torch.uint8)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            b.copy_(a)
            best = min(best, time.perf_counter() - t0)
        return 2 * nbytes / best
    finally:
        ctx.memory.release(2 * nbytes)


def _broadcast_rate(ctx: Any, group: str, nbytes: int, repeats: int) -> float:
    """Bytes per second of the best of ``repeats`` broadcasts from rank 0 of ``group``."""
    import time

    import torch

    g = ctx.groups[group]
    ctx.memory.reserve(nbytes, "link bandwidth probe")
    try:
        buf = torch.ones(nbytes, dtype=torch.uint8, device=ctx.device)
        best = float("inf")
        for _ in range(repeats):
            g.barrier()
            t0 = time.perf_counter()
            g.broadcast(buf, src=0)
            g.synchronize()
            best = min(best, time.perf_counter() - t0)
        return nbytes / best
    finally:
        ctx.memory.release(nbytes)


def measure_cpu_device(pool: Any, base: Any, nbytes: int = 256 * 1024**2,
                       repeats: int = 3) -> Any:
    """``base`` (a ``DeviceSpec`` for a CPU device slot) with its bandwidths measured on the
    pool's first workers: memory traffic of a copy (``hbm_bw``, ``host_bw``) and a loopback
    broadcast between two workers (``intra_node_bw``). The ``cpu`` preset's figures are
    guesses; a CPU machine's inventory is what its workers measure (the planner's
    efficiencies are still calibrated on top)."""
    from dataclasses import replace

    import ray

    from nereus.runtime.comm import Rendezvous, close_groups, open_groups

    ids = pool.device_ids
    mem = ray.get(pool.submit(ids[0], _memcpy_rate, nbytes, repeats))
    link = base.intra_node_bw
    if len(ids) > 1:
        pair = {"probe.link": (ids[0], ids[1])}
        with Rendezvous() as rv:
            open_groups(pool, pair, rv)
        try:
            refs = [pool.submit(d, _broadcast_rate, "probe.link", nbytes, repeats)
                    for d in pair["probe.link"]]
            link = min(ray.get(refs))
        finally:
            close_groups(pool, pair)
    return replace(base, hbm_bw=mem, host_bw=mem, intra_node_bw=link,
                   source=f"measured by the runtime on this machine: copy {mem / 1e9:.2f} GB/s "
                          f"of memory traffic, loopback broadcast {link / 1e9:.2f} GB/s")
