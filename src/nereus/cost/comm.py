"""Collective times from link bandwidth and latency (the alpha-beta model of ring collectives).

For n ranks and a message of ``nbytes`` per rank:
- all-reduce (ring): 2(n-1) steps, each moving nbytes/n  -> 2(n-1)/n * nbytes on the wire
- all-gather (ring): (n-1) steps of nbytes/n (nbytes = gathered size)
- broadcast (pipelined): ~nbytes on the wire, (n-1) latency hops
- p2p: one message of nbytes
Bandwidth is the device's per-direction link bandwidth (DeviceSpec); the efficiency of the op
class scales it later. The cost model prices its collectives with these tables
(``nereus.cost.model``), the transition layer its moves with the link figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from nereus.cost.candidate import Link
from nereus.spec.device import DeviceSpec

# kind -> fraction of the message each rank sends, and ring steps, for n >= 2 ranks (n may be
# a NumPy array of rank counts)
WIRE_FRACTION: Mapping[str, Callable[[np.ndarray], np.ndarray]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: np.ones_like(n),
    "p2p": lambda n: np.ones_like(n),
}
STEPS: Mapping[str, Callable[[np.ndarray], np.ndarray]] = {
    "allreduce": lambda n: 2 * (n - 1),
    "allgather": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
    "p2p": lambda n: np.ones_like(n),
}


def link_bw(device: DeviceSpec, link: Link) -> float:
    return device.intra_node_bw if link is Link.INTRA else device.inter_node_bw


def link_latency(device: DeviceSpec, link: Link) -> float:
    return device.intra_latency_s if link is Link.INTRA else device.inter_latency_s
