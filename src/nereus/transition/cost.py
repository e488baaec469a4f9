"""How long one primitive takes: communicator set-up plus bytes over the links it crosses.

``seconds = setup_s / eff[setup] + copy_s / eff[copy] + max over link classes c of
(ideal_c / eff[c]) + local_s``.
Set-up is one round of communicator creation (rendezvous + init): every GPU of Split or Extend
joins exactly one new communicator (its all-gather group, its rank pair), and they are created
side by side. A link's ideal time is bytes over the per-direction bandwidth of that link (NVLink
or equivalent when both GPUs sit on one node, the network otherwise) plus per-hop latency; a
GPU's bytes on one link add up, so transfers sharing a link divide its bandwidth. Primitives
that touch one GPU never overlap in a schedule, so links are shared only inside a primitive.
Merge and Destroy are local. A Merge copies the new shard out of the replica on the device:
its ideal copy time is the largest new shard read and written once at HBM bandwidth (the
``copy`` class, calibrated like the link classes; it has no set-up), plus a dispatch constant.
Destroy is the dispatch constant alone.
A Split or Merge staged through host memory adds its host copies (out, then in) at the device's
host-link bandwidth; they come before and after its transfers, so they add, and they are kept
with the uncalibrated local part (with the dispatch constant).

The ideal seconds per op class are kept with each duration so measured times can calibrate the
efficiencies (``nereus.transition.calibrate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

from nereus.cost.candidate import Layout, Link
from nereus.cost.comm import link_bw, link_latency
from nereus.cost.efficiency import Efficiencies
from nereus.cost.ops import OpClass, comm_class
from nereus.spec.cluster import Cluster
from nereus.transition.nesting import gather_groups
from nereus.transition.primitives import Destroy, Extend, Merge, Primitive, Split
from nereus.transition.sizes import StateSizes

# Communicator set-up, seconds per round (TCPStore rendezvous + communicator init). Estimated
# constants, an assumption per device kind until measured times calibrate eff[setup]: NCCL /
# RCCL init of a small communicator takes on the order of 0.1 s (bootstrap over TCP, topology
# detection, channel set-up); a gloo group on loopback about 10 ms.
SETUP_S: Mapping[str, float] = {
    "h100-sxm-80gb": 0.10,
    "h200-141gb": 0.10,
    "a100-sxm-80gb": 0.10,
    "mi250x": 0.20,
    "cpu": 0.01,
}
DEFAULT_SETUP_S = 0.10

# Local work of Merge and Destroy besides a Merge's copy, seconds: Python dispatch in the worker
# and allocator release. An assumption (not calibrated: no op class covers it); small next to
# any set-up.
LOCAL_OP_S = 1e-3

# Op classes whose time adds to a primitive's rather than overlapping its link transfers: the
# communicators are created before anything is sent, and a Merge's copy is the whole Merge.
SERIAL_CLASSES = frozenset({OpClass.SETUP, OpClass.COPY})


@dataclass(frozen=True)
class Duration:
    """Predicted seconds of one primitive and where they come from.

    ``ideal``: seconds at peak per op class (``setup``, for a transfer the slowest GPU of each
    link class, for a Merge its ``copy``); ``local_s``: the uncalibrated local part.
    """

    seconds: float
    ideal: tuple[tuple[OpClass, float], ...] = ()
    local_s: float = 0.0



def predict(ideal: Mapping[OpClass, float], local_s: float, eff: Efficiencies) -> float:
    """Seconds from ideal seconds per class: set-up and copy add, link classes overlap (max)."""
    serial = sum(v / eff[c] for c, v in ideal.items() if c in SERIAL_CLASSES)
    comm = max((v / eff[c] for c, v in ideal.items() if c not in SERIAL_CLASSES), default=0.0)
    return serial + comm + local_s


class TransitionCost:
    """Durations of primitives for one job's cluster under given efficiencies."""

    def __init__(self, cluster: Cluster, sizes: StateSizes, efficiencies: Efficiencies):
        self.cluster = cluster
        self.device = cluster.device
        self.sizes = sizes
        self.eff = efficiencies
        self.setup_ideal_s = SETUP_S.get(self.device.name, DEFAULT_SETUP_S)
        self._bw = {Link.INTRA: link_bw(self.device, Link.INTRA),
                    Link.INTER: link_bw(self.device, Link.INTER)}
        self._lat = {Link.INTRA: link_latency(self.device, Link.INTRA),
                     Link.INTER: link_latency(self.device, Link.INTER)}
        self._per_node = cluster.devices_per_node
        self._eff = {c: efficiencies[c] for c in OpClass}
        self._eff_pair = {Link.INTRA: efficiencies[OpClass.BROADCAST_INTRA],
                          Link.INTER: efficiencies[OpClass.BROADCAST_INTER]}
        # (op class, bandwidth, latency) per kind of transfer inside / across nodes
        self._bcast = {intra: (comm_class("broadcast", intra), self._bw[lk], self._lat[lk])
                       for intra, lk in ((True, Link.INTRA), (False, Link.INTER))}
        self._gather = {intra: (comm_class("allgather", intra), self._bw[lk], self._lat[lk])
                        for intra, lk in ((True, Link.INTRA), (False, Link.INTER))}
        self._setup_s = self.setup_ideal_s / self._eff[OpClass.SETUP]
        # what ``seconds`` reads per link kind (inside a node or not): (efficiency, bandwidth,
        # latency) of an Extend's broadcast and of a Split's all-gather
        self._bcast_s = {intra: (self._eff[c], bw, lat) for intra, (c, bw, lat)
                         in self._bcast.items()}
        self._gather_s = {intra: (self._eff[c], bw, lat) for intra, (c, bw, lat)
                          in self._gather.items()}
        # a Split's all-gather groups and what each member receives, per (model, held state,
        # tp, pp, sub tp, sub pp): what sets its bytes, read once per kind of Split (a
        # scheduler prices the same few kinds thousands of times; ``_gather_recv``'s own cache
        # hashes the bytes of every position on each call)
        self._recv: dict[tuple[object, ...], tuple[tuple[tuple[int, ...], int], ...]] = {}
        self._copy_eff = self._eff[OpClass.COPY]

    def link(self, a: int, b: int) -> Link:
        return Link.INTRA if a // self._per_node == b // self._per_node else Link.INTER

    def setup_s(self) -> float:
        return self.setup_ideal_s / self.eff[OpClass.SETUP]

    def pair_s(self, a: int, b: int, nbytes: float) -> float:
        """Predicted seconds to send ``nbytes`` from GPU a to GPU b (no set-up)."""
        lk = self.link(a, b)
        return (nbytes / self._bw[lk] + self._lat[lk]) / self._eff_pair[lk]

    def duration(self, p: Primitive) -> Duration:
        kind = type(p)
        if kind is Extend or kind is Split:
            terms = (self._extend_terms(p) if kind is Extend  # type: ignore[arg-type]
                     else self._split_terms(p))  # type: ignore[arg-type]
            # only a Split is ever staged (Extend.staged is False); mypy does not narrow
            # ``p`` on ``kind is ...``, so the staged path (only) says which it is
            host = self._host_s(cast(Split, p)) if p.staged else 0.0
            return Duration(self._comm_s(terms) + host,
                            (*terms, (OpClass.SETUP, self.setup_ideal_s)), host)
        if kind is Merge:
            local = LOCAL_OP_S + self._host_s(cast(Merge, p)) if p.staged else LOCAL_OP_S
            copy = self._copy_ideal(p)  # type: ignore[arg-type]
            return Duration(self.seconds(p), ((OpClass.COPY, copy),), local)
        if kind is Destroy:
            return Duration(LOCAL_OP_S, (), LOCAL_OP_S)
        raise TypeError(f"not a primitive: {p!r}")

    def seconds(self, p: Primitive) -> float:
        """``duration(p).seconds`` without the breakdown: what a scheduler needs. The same
        arithmetic as ``duration``, without building its terms: per link kind only the
        largest bytes count (a transfer's time grows with its bytes)."""
        kind = type(p)
        if kind is Extend:
            return self._extend_s(p)  # type: ignore[arg-type]
        if kind is Split:
            t = self._split_s(p)  # type: ignore[arg-type]
            return t + self._host_s(cast(Split, p)) if p.staged else t
        if kind is Merge:
            t = LOCAL_OP_S + self._copy_ideal(p) / self._copy_eff  # type: ignore[arg-type]
            return t + self._host_s(cast(Merge, p)) if p.staged else t
        if kind is Destroy:
            return LOCAL_OP_S
        raise TypeError(f"not a primitive: {p!r}")

    def _extend_s(self, p: Extend) -> float:
        return self._setup_s + self._slowest(self._bcast_s, *self._extend_most(p), 1)

    def _split_s(self, p: Split) -> float:
        return self._setup_s + self._slowest(self._gather_s, *self._split_most(p))

    def _extend_most(self, p: Extend) -> tuple[int, int]:
        """One rank pair per position: per link kind (inside a node, across), the largest shard
        (-1: no pair of that kind). It sets the kind's time: time grows with the bytes."""
        pn = self._per_node
        inside = across = -1
        for a, b, x in zip(p.emu.gpus, p.targets, self.sizes.of(p.emu)):
            if a // pn == b // pn:
                if x > inside:
                    inside = x
            elif x > across:
                across = x
        return inside, across

    def _split_most(self, p: Split) -> tuple[int, int, int]:
        """The all-gather groups run side by side: per link kind of a group (all inside one
        node, or not), the most one member receives (-1: no group of that kind); and the
        latency hops of one all-gather (group size - 1)."""
        emu, sub = p.emu, p.sub
        lay = emu.layout
        key = (emu.model, emu.holds, lay.tp, lay.pp, sub.tp, sub.pp)
        recv = self._recv.get(key)
        if recv is None:
            recv = self._recv[key] = _gather_recv(self.sizes.of(emu), lay, sub)
        gpus, pn = emu.gpus, self._per_node
        inside = across = -1
        if min(gpus) // pn == max(gpus) // pn:  # one node: every group inside it
            for _, r in recv:
                if r > inside:
                    inside = r
        else:
            for idx, r in recv:
                node = gpus[idx[0]] // pn
                for i in idx:
                    if gpus[i] // pn != node:
                        if r > across:
                            across = r
                        break
                else:
                    if r > inside:
                        inside = r
        return inside, across, len(recv[0][0]) - 1

    @staticmethod
    def _slowest(kinds: Mapping[bool, tuple[float, float, float]], inside: int, across: int,
                 hops: int) -> float:
        """The slowest link kind's seconds (``_comm_s`` without set-up): the most bytes over
        its bandwidth plus ``hops`` latencies, over its efficiency (a link kind with no
        bytes, -1, has no term)."""
        comm = 0.0
        if inside >= 0:
            eff, bw, lat = kinds[True]
            t = (inside / bw + hops * lat) / eff
            if t > comm:
                comm = t
        if across >= 0:
            eff, bw, lat = kinds[False]
            t = (across / bw + hops * lat) / eff
            if t > comm:
                comm = t
        return comm

    @staticmethod
    def _terms(kinds: Mapping[bool, tuple[OpClass, float, float]], inside: int, across: int,
               hops: int) -> tuple[tuple[OpClass, float], ...]:
        """Ideal seconds per link class: ``_slowest``'s terms at peak, kept for calibration."""
        out = []
        for most, intra in ((inside, True), (across, False)):
            if most >= 0:
                cls, bw, lat = kinds[intra]
                out.append((cls, most / bw + hops * lat))
        return tuple(out)

    def _copy_ideal(self, p: Merge) -> float:
        """A Merge's copy at peak: the GPU with the largest new shard reads and writes it once."""
        return 2 * max(self.sizes.of(p.output)) / self.device.hbm_bw

    def _host_s(self, p: Split | Merge) -> float:
        """Seconds of a staged primitive's host copies: the GPU with the most bytes sets it."""
        most = max(p.host_bytes(self.sizes).values(), default=0)
        return most / (self.device.host_bw * self._eff[OpClass.HOST])

    def _comm_s(self, terms: tuple[tuple[OpClass, float], ...]) -> float:
        """Set-up, then the slowest link class (they overlap)."""
        eff = self._eff
        comm = 0.0
        for c, v in terms:
            t = v / eff[c]
            if t > comm:
                comm = t
        return self._setup_s + comm

    def _split_terms(self, p: Split) -> tuple[tuple[OpClass, float], ...]:
        return self._terms(self._gather, *self._split_most(p))

    def _extend_terms(self, p: Extend) -> tuple[tuple[OpClass, float], ...]:
        return self._terms(self._bcast, *self._extend_most(p), 1)


@lru_cache(maxsize=1024)
def _gather_recv(src: tuple[int, ...], layout: Layout, sub: Layout
                 ) -> tuple[tuple[tuple[int, ...], int], ...]:
    """Per all-gather group of a Split: its member indices and the most bytes one member
    receives (everything the others hold)."""
    out = []
    for idx in gather_groups(layout, sub):
        total = sum(src[i] for i in idx)
        out.append((idx, max(total - src[i] for i in idx)))
    return tuple(out)
