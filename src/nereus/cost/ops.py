"""Operations by class: what a model-stage does, in FLOPs, bytes and messages.

The cost model turns work into ideal seconds at the device's peak rates; one efficiency per op
class (``nereus.cost.efficiency``) turns ideal seconds into predicted seconds. Classes are coarse
on purpose: plans built from the same classes share what calibration learns.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class OpClass(str, Enum):
    GEMM = "gemm"                        # dense matmuls, compute-bound
    ATTENTION = "attention"              # softmax(QK^T)V, flash-style, compute-bound
    DECODE = "decode"                    # weight + KV reads of one decode iteration, HBM-bound
    OPTIMIZER = "optimizer"              # Adam update, HBM-bound
    ALLREDUCE_INTRA = "allreduce.intra"
    ALLREDUCE_INTER = "allreduce.inter"
    ALLGATHER_INTRA = "allgather.intra"
    ALLGATHER_INTER = "allgather.inter"
    P2P_INTRA = "p2p.intra"
    P2P_INTER = "p2p.inter"
    BROADCAST_INTRA = "broadcast.intra"
    BROADCAST_INTER = "broadcast.inter"
    LATENCY_INTRA = "latency.intra"      # per-step latency of collectives inside a node
    LATENCY_INTER = "latency.inter"      # per-step latency across nodes
    HOST = "host"                        # device <-> host copies (offload and reload)
    SETUP = "setup"                      # communicator creation (rendezvous + init)
    COPY = "copy"                        # on-device copies of state into a new shard (Merge),
                                         # HBM-bound

    @property
    def is_comm(self) -> bool:
        return "." in self.value

    @property
    def is_compute(self) -> bool:
        return self in (OpClass.GEMM, OpClass.ATTENTION)


def comm_class(kind: str, intra: bool) -> OpClass:
    """The op class of a collective ``kind`` (allreduce, allgather, p2p, broadcast) on a link."""
    return OpClass(f"{kind}.{'intra' if intra else 'inter'}")


@dataclass(frozen=True)
class Op:
    """``count`` repetitions of one operation, all on the critical path of one replica.

    ``ideal_s`` is the time of all repetitions at peak rate (FLOP/s, bytes/s) or at the
    per-step latency; the predicted time is ``ideal_s / efficiency[cls]``. ``timed_as`` is the
    class a framework's timer puts this work under when it differs from ``cls`` (the latency
    part of an all-reduce is timed as that all-reduce).
    """

    cls: OpClass
    term: str          # latency term it belongs to: compute, bubble, tp_comm, pp_comm, ...
    name: str          # e.g. "mlp.fwd", "tp allreduce (attn out)"
    count: float       # repetitions on the critical path
    flops: float       # per repetition
    bytes: float       # per repetition (memory traffic or bytes on the wire per rank)
    ideal_s: float     # all repetitions, at peak
    timed_as: OpClass | None = None

    @property
    def timed_class(self) -> OpClass:
        return self.timed_as or self.cls
