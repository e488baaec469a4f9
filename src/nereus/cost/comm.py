"""Collective times from link bandwidth and latency (the alpha-beta model of ring collectives).

For n ranks and a message of ``nbytes`` per rank:
- all-reduce (ring): 2(n-1) steps, each moving nbytes/n  -> 2(n-1)/n * nbytes on the wire
- all-gather (ring): (n-1) steps of nbytes/n (nbytes = gathered size)
- broadcast (pipelined): ~nbytes on the wire, (n-1) latency hops
- p2p: one message of nbytes
Bandwidth is the device's per-direction link bandwidth (DeviceSpec); the efficiency of the op
class scales it later.
"""

from __future__ import annotations

from nereus.cost.candidate import Link
from nereus.cost.ops import Op, OpClass, comm_class
from nereus.spec.device import DeviceSpec


def link_bw(device: DeviceSpec, link: Link) -> float:
    return device.intra_node_bw if link is Link.INTRA else device.inter_node_bw


def link_latency(device: DeviceSpec, link: Link) -> float:
    return device.intra_latency_s if link is Link.INTRA else device.inter_latency_s


def _wire_and_hops(kind: str, n: int, nbytes: float) -> tuple[float, int]:
    if n <= 1:
        return 0.0, 0
    if kind == "allreduce":
        return 2 * (n - 1) / n * nbytes, 2 * (n - 1)
    if kind == "allgather":
        return (n - 1) / n * nbytes, n - 1
    if kind == "broadcast":
        return nbytes, n - 1
    if kind == "p2p":
        return nbytes, 1
    raise ValueError(kind)


def collective(kind: str, n: int, nbytes: float, link: Link, device: DeviceSpec, *, term: str,
               name: str, count: float = 1.0) -> Op | None:
    """``count`` repetitions of one collective among ``n`` ranks, or None when n == 1."""
    if n <= 1 or nbytes <= 0 or count <= 0:
        return None
    wire, hops = _wire_and_hops(kind, n, nbytes)
    one = wire / link_bw(device, link) + hops * link_latency(device, link)
    cls: OpClass = comm_class(kind, link is Link.INTRA)
    return Op(cls, term, name, count, 0.0, wire, one * count)
