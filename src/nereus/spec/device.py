"""Accelerators and the links between them, from vendor datasheets.

Peak figures overstate what kernels and collectives achieve; the cost model multiplies them by
per-op-class efficiencies that the calibrator learns from measured times (``nereus.cost``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nereus.errors import InputError

GiB = 1024**3
MiB = 1024**2
GB = 1e9


def gib(nbytes: float) -> str:
    """Bytes in GiB for a message: one decimal from 1 GiB up, three significant digits below,
    so that a device or a state of a few MiB never reads '0.0 GiB' (a device set to
    ``device_memory_gib: 0.01`` was one 'with more than 0.0 GiB')."""
    v = nbytes / GiB
    return f"{v:.1f} GiB" if abs(v) >= 1 else f"{v:.3g} GiB"


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (or one CPU device slot). Bandwidths are per device, per direction."""

    name: str
    memory_bytes: int        # bytes of device memory
    peak_flops: float        # FLOP/s, dense bf16 (fp32 for the cpu slot)
    hbm_bw: float            # bytes/s, device-memory bandwidth
    intra_node_bw: float     # bytes/s, per device per direction on the node's fabric
    inter_node_bw: float     # bytes/s, per device per direction on the network
    host_bw: float           # bytes/s, device <-> host memory (offload and reload)
    intra_latency_s: float   # seconds per ring step of a small collective inside a node
    inter_latency_s: float   # seconds per ring step across nodes
    devices_per_node: int    # typical devices per node for this part
    source: str              # where the figures come from

    def with_memory(self, memory_bytes: int) -> DeviceSpec:
        return replace(self, memory_bytes=int(memory_bytes))


DEVICE_PRESETS: dict[str, DeviceSpec] = {
    # NVIDIA H100 SXM5 80GB datasheet: 80 GB HBM3, of which CUDA reports 81,559 MiB (nvidia-smi
    # "81559MiB", torch total_memory 85,520,809,984 B), 989.4 TFLOP/s dense BF16,
    # 3.35 TB/s HBM, NVLink 4 900 GB/s total = 450 GB/s per direction; ConnectX-7 NDR 400 Gb/s
    # per GPU = 50 GB/s; PCIe Gen5 x16 64 GB/s per direction. Per-step latencies: nccl-tests
    # small-message all-reduce on 8 NVLink GPUs takes ~20-30 us for its 14 ring steps (~2 us a
    # step); across InfiniBand ~8 us a step. Assumptions until calibrated.
    "h100-sxm-80gb": DeviceSpec("h100-sxm-80gb", 81559 * MiB, 989.4e12, 3.35e12, 450 * GB, 50 * GB,
                                64 * GB, 2e-6, 8e-6, 8,
                                "NVIDIA H100 datasheet; ConnectX-7 NDR; PCIe Gen5"),
    # NVIDIA H200 SXM 141GB datasheet: 141 GB HBM3e (nvidia-smi reports 143,771 MiB), 989 TFLOP/s
    # dense BF16, 4.8 TB/s, NVLink 4 900 GB/s total; same network and PCIe as H100 systems
    # (DGX H200).
    "h200-141gb": DeviceSpec("h200-141gb", 143771 * MiB, 989.4e12, 4.8e12, 450 * GB, 50 * GB,
                             64 * GB, 2e-6, 8e-6, 8,
                             "NVIDIA H200 datasheet; DGX H200 network (ConnectX-7 NDR)"),
    # NVIDIA A100 SXM4 80GB datasheet: 80 GB HBM2e (nvidia-smi reports 81,920 MiB = 80 GiB),
    # 312 TFLOP/s dense BF16, 2.039 TB/s, NVLink 3 600 GB/s total = 300 GB/s per direction;
    # HDR 200 Gb/s per GPU = 25 GB/s (DGX A100); PCIe Gen4 x16 32 GB/s.
    "a100-sxm-80gb": DeviceSpec("a100-sxm-80gb", 80 * GiB, 312e12, 2.039e12, 300 * GB, 25 * GB,
                                32 * GB, 3e-6, 10e-6, 8,
                                "NVIDIA A100 datasheet; DGX A100 HDR network; PCIe Gen4"),
    # AMD Instinct MI250X, one GCD (the unit ROCm exposes as a device): 64 GiB HBM2e,
    # 383 TFLOP/s BF16 per OAM / 2 = 191.5, 3.2768 TB/s per OAM / 2 = 1.6384 TB/s; one Infinity
    # Fabric xGMI link between GCDs of a node = 50 GB/s per direction (the slowest GCD pair);
    # Frontier node: 4 Slingshot-11 NICs of 25 GB/s for 8 GCDs = 12.5 GB/s per GCD; host link
    # 36 GB/s (Infinity Fabric CPU-GCD, Frontier user guide).
    "mi250x": DeviceSpec("mi250x", 64 * GiB, 191.5e12, 1.6384e12, 50 * GB, 12.5 * GB, 36 * GB,
                         4e-6, 12e-6, 8,
                         "AMD MI250X datasheet (per GCD); OLCF Frontier node architecture"),
    # One CPU device slot (a Ray worker process on a CPU machine). Starting points that the
    # calibrator corrects from measured times: ~50 GFLOP/s fp32 for one core with AVX2 and
    # ~10 GB/s memory bandwidth per core (assumptions); gloo over loopback: a small all-reduce
    # between two local processes measured ~274 us here (2 ring steps, so ~130 us a step) and
    # ~0.6-2 GB/s for MiB messages (benchmarks/engine.py); across hosts ~1 GB/s and 250 us a
    # step (10 GbE class, assumption). State lives in host memory: host_bw = memory bandwidth.
    "cpu": DeviceSpec("cpu", 2 * GiB, 50e9, 10 * GB, 2 * GB, 1 * GB, 10 * GB, 130e-6, 250e-6, 8,
                      "assumption for one CPU core slot; calibrated from measured times"),
}


def get_device(name: str) -> DeviceSpec:
    key = name.lower()
    if key not in DEVICE_PRESETS:
        raise InputError("device", f"unknown device {name!r}", DEVICE_PRESETS)
    return DEVICE_PRESETS[key]
