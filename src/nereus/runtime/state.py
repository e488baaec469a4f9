"""Sharded training state of one EMU position, and the full logical state it is a slice of.

One position (tp_rank, pp_rank) of an EMU holds the shards ``nereus.spec.sharding.shard_plan``
gives it, for each kind of tensor the model-stage keeps: the parameter θ and, for a trainable
stage, the Adam moments (``exp_avg``, ``exp_avg_sq``; none under SGD) and, where the parameter
dtype is narrower than fp32 and the workload asks for it, an fp32 master copy. An fp32
parameter is its own master copy, and none is stored (``StateSpec.master`` is False).

All tensors of a position live in one contiguous byte buffer (the arena), kind-major, the widest
dtypes first (master and moments, then a bf16 θ), each tensor a typed view at an offset aligned to
its element size without a gap, so an arena holds exactly the bytes the planner counts
(``nereus.cost.state``). Why: Extend sends a position as one contiguous buffer with no packing, the
receiver's tensors are views of what it received, θ alone is one contiguous region (weight sync),
and the bytes a worker holds are exactly the arenas it keeps. The arena layout depends only on
(spec, layout, position), so a receiver computes it without being told.

Scalars (Adam step, update counter, versions, minibatch position, seed and RNG state) are
``StateMeta``; every position of every copy holds the same value.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from nereus.errors import InputError
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import Shard, check_layout, logical_params, shard_plan
from nereus.spec.workload import Optimizer

PARAM = "param"
MASTER = "master"
EXP_AVG = "exp_avg"
EXP_AVG_SQ = "exp_avg_sq"

TORCH_DTYPES: Mapping[str, torch.dtype] = {
    "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class StateMismatch(RuntimeError):
    """Copies of one logical tensor (or of the scalars) that should be equal are not."""


@dataclass(frozen=True)
class StateSpec:
    """What one model-stage's EMU holds, whatever its layout.

    ``trainable``: a training stage's state, θ and ω. ``moments``: ω has Adam's two moments
    (a training stage under Adam; SGD keeps none). ``master``: holds an fp32 master copy
    besides a narrower parameter (bf16 / fp16 with master weights).
    """

    model: ModelSpec
    head: Head = Head.LM
    trainable: bool = True
    param_dtype: str = "fp32"
    master: bool = False
    moments: bool = True

    def __post_init__(self) -> None:
        if self.param_dtype not in TORCH_DTYPES:
            raise InputError("state.param_dtype", f"unknown dtype {self.param_dtype!r}",
                             TORCH_DTYPES)
        if self.master and self.param_dtype == "fp32":
            raise InputError("state.master", "an fp32 parameter is its own master copy",
                             "master=False with param_dtype fp32")
        if self.master and not self.trainable:
            raise InputError("state.master", "only a trainable stage keeps a master copy")

    @property
    def kinds(self) -> tuple[str, ...]:
        out = [PARAM]
        if self.master:
            out.append(MASTER)
        if self.trainable and self.moments:
            out += [EXP_AVG, EXP_AVG_SQ]
        return tuple(out)

    def dtype(self, kind: str) -> torch.dtype:
        return TORCH_DTYPES[self.param_dtype] if kind == PARAM else torch.float32

    @classmethod
    def for_stage(cls, job: object, stage: str) -> StateSpec:
        """The state a model-stage of ``job`` (a ``JobSpec``) keeps, on any device kind.

        A training stage holds θ and ω of its model; forward and generation stages hold θ only.
        Parameters are in the workload's ``param_dtype``, with an fp32 master copy where it is
        narrower and ``master_weights`` is set: what the transition planner sizes
        (``nereus.cost.state``), on CPU workers too, so that their byte counts and capacity
        checks compare with its plan. A transition moves arenas as bytes and computes nothing,
        so a CPU worker holds bf16 as well as a GPU does.
        """
        from nereus.spec.job import JobSpec
        from nereus.spec.workflow import StageKind

        assert isinstance(job, JobSpec)
        st = job.workflow.stage(stage)
        role = job.workflow.model(st.model)
        trainable = role.trainable and st.kind is StageKind.TRAIN
        wl = job.workload
        narrow = wl.param_bytes < 4
        return cls(job.model, role.head, trainable, wl.param_dtype,
                   trainable and narrow and wl.master_weights, wl.optimizer is Optimizer.ADAM)


@dataclass(frozen=True)
class StateMeta:
    """A logical state's scalars beside its tensors: Adam step, versions, batch position, RNG."""

    adam_step: int = 0
    update_count: int = 0
    versions: tuple[tuple[str, int], ...] = (("model", 0), ("policy", 0))
    minibatch_pos: int = 0
    seed: int = 0
    rng_state: bytes = b""

    def to_bytes(self) -> bytes:
        d = {"adam_step": self.adam_step, "update_count": self.update_count,
             "versions": [list(v) for v in self.versions], "minibatch_pos": self.minibatch_pos,
             "seed": self.seed, "rng_state": base64.b64encode(self.rng_state).decode()}
        return json.dumps(d, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> StateMeta:
        d = json.loads(raw.decode())
        return cls(int(d["adam_step"]), int(d["update_count"]),
                   tuple((str(k), int(v)) for k, v in d["versions"]), int(d["minibatch_pos"]),
                   int(d["seed"]), base64.b64decode(d["rng_state"]))

    def digest(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()[:16]

    def generator(self, dp_rank: int) -> torch.Generator:
        """The RNG of DP replica ``dp_rank``, derived from the seed, the rank and the minibatch
        position, so a new replica continues the global sample order (paper §6.2)."""
        g = torch.Generator()
        g.manual_seed(derive_seed(self.seed, f"replica/{dp_rank}/{self.minibatch_pos}"))
        return g


def derive_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` (independent of process, layout and Python hashing)."""
    h = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


# ---------------------------------------------------------------- arena layout
@dataclass(frozen=True)
class ArenaEntry:
    kind: str
    shard: Shard
    dtype: torch.dtype
    offset: int     # bytes from the arena start
    nbytes: int

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.shard.name


@dataclass(frozen=True)
class ArenaLayout:
    """Where each (kind, shard) of one position sits in its arena."""

    spec: StateSpec
    tp: int
    pp: int
    tp_rank: int
    pp_rank: int
    entries: tuple[ArenaEntry, ...]
    nbytes: int
    _index: dict[tuple[str, str], ArenaEntry] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update({e.key: e for e in self.entries})

    def entry(self, kind: str, shard_name: str) -> ArenaEntry:
        return self._index[(kind, shard_name)]


@lru_cache(maxsize=1024)
def arena_layout(spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int) -> ArenaLayout:
    """The arena of position (tp_rank, pp_rank) of a (tp, pp) unit: kind-major, the widest
    dtypes first (fp32 master and moments before a bf16 parameter), so that every tensor is
    aligned to its element size without a gap and the arena holds exactly the bytes the
    transition planner counts (an odd count of bf16 elements before fp32 would need two)."""
    shards = shard_plan(spec.model, spec.head, tp, pp, tp_rank, pp_rank)
    entries: list[ArenaEntry] = []
    off = 0
    sizes = {k: torch.empty((), dtype=spec.dtype(k)).element_size() for k in spec.kinds}
    for kind in sorted(spec.kinds, key=lambda k: -sizes[k]):  # stable: kinds order in a tie
        dt = spec.dtype(kind)
        size = sizes[kind]
        assert off % size == 0, "a wider kind placed after a narrower one"
        for s in shards:
            nb = s.numel * size
            entries.append(ArenaEntry(kind, s, dt, off, nb))
            off += nb
    return ArenaLayout(spec, tp, pp, tp_rank, pp_rank, tuple(entries), off)


def position_bytes(spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int) -> int:
    return arena_layout(spec, tp, pp, tp_rank, pp_rank).nbytes


# ---------------------------------------------------------------- one position
class ShardedState:
    """The state one worker holds for one EMU position: typed views into one byte arena.

    ``params`` / ``master`` / ``exp_avg`` / ``exp_avg_sq`` map shard names (the logical names,
    and ``lm_head.weight`` for the tied copy on the last pipeline block) to tensors the engine
    may update in place. ``meta`` is replaced, not mutated (it is frozen).
    """

    def __init__(self, spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int,
                 buffer: torch.Tensor, meta: StateMeta):
        self.layout = arena_layout(spec, tp, pp, tp_rank, pp_rank)
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() != self.layout.nbytes:
            raise ValueError(f"arena needs {self.layout.nbytes} uint8 bytes, got "
                             f"{tuple(buffer.shape)} {buffer.dtype}")
        self.buffer = buffer
        self.meta = meta
        self._views: dict[tuple[str, str], torch.Tensor] = {}
        for e in self.layout.entries:
            v = buffer[e.offset:e.offset + e.nbytes].view(e.dtype).view(e.shard.local_shape)
            self._views[e.key] = v

    # ---- identity
    @property
    def spec(self) -> StateSpec:
        return self.layout.spec

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def position(self) -> tuple[int, int]:
        return self.layout.tp_rank, self.layout.pp_rank

    @property
    def shards(self) -> tuple[Shard, ...]:
        return shard_plan(self.spec.model, self.spec.head, self.tp, self.pp, *self.position)

    @property
    def nbytes(self) -> int:
        return self.layout.nbytes

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    # ---- tensors
    def tensor(self, kind: str, shard_name: str) -> torch.Tensor:
        return self._views[(kind, shard_name)]

    def kind(self, kind: str) -> dict[str, torch.Tensor]:
        return {name: v for (k, name), v in self._views.items() if k == kind}

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return self.kind(PARAM)

    @property
    def master(self) -> dict[str, torch.Tensor]:
        """fp32 master copies; on an fp32 stage (CPU) the parameters themselves."""
        return self.kind(MASTER) if self.spec.master else self.params

    @property
    def exp_avg(self) -> dict[str, torch.Tensor]:
        return self.kind(EXP_AVG)

    @property
    def exp_avg_sq(self) -> dict[str, torch.Tensor]:
        return self.kind(EXP_AVG_SQ)

    def zero_padding(self) -> None:
        """Zero the padded vocabulary rows (they are not part of the logical state)."""
        for e in self.layout.entries:
            s = e.shard
            if s.split_dim is not None and s.valid_len < s.stop - s.start:
                self._views[e.key].narrow(s.split_dim, s.valid_len,
                                          s.stop - s.start - s.valid_len).zero_()

    # ---- construction and transport
    @classmethod
    def empty(cls, spec: StateSpec, tp: int, pp: int, tp_rank: int, pp_rank: int,
              meta: StateMeta, device: torch.device | str = "cpu") -> ShardedState:
        n = arena_layout(spec, tp, pp, tp_rank, pp_rank).nbytes
        return cls(spec, tp, pp, tp_rank, pp_rank,
                   torch.empty(n, dtype=torch.uint8, device=device), meta)

    def cpu_copy(self) -> ShardedState:
        return ShardedState(self.spec, self.tp, self.pp, *self.position,
                            self.buffer.detach().to("cpu", copy=True), self.meta)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Pickle the arena once (pickling the views would copy the storage per view).
        return (ShardedState, (self.spec, self.tp, self.pp, self.layout.tp_rank,
                               self.layout.pp_rank, self.buffer, self.meta))

    def __repr__(self) -> str:
        return (f"ShardedState({self.spec.model.name}, tp={self.tp}, pp={self.pp}, "
                f"pos={self.position}, {self.nbytes} bytes, {self.device})")


# ---------------------------------------------------------------- copying between layouts
Box = tuple[tuple[int, int], ...]  # a [start, stop) range per dim, in logical coordinates


def _base(shard: Shard, dim: int) -> int:
    """Logical index of local index 0 along ``dim``."""
    return shard.start if dim == shard.split_dim else 0


def valid_box(shard: Shard) -> Box:
    """The logical region a shard holds, padding rows excluded."""
    out = []
    for d, n in enumerate(shard.full_shape):
        if d == shard.split_dim:
            out.append((shard.start, min(shard.stop, shard.valid_stop)))
        else:
            out.append((0, n))
    return tuple(out)


def copy_block(dst_view: torch.Tensor, dst: Shard, src_rows: torch.Tensor, src: Shard,
               row0: int = 0) -> Box | None:
    """Copy what ``dst`` holds of ``src_rows`` -- local rows [row0, row0 + len) along dim 0 of
    ``src``'s shard -- into ``dst_view``. Returns the logical box copied, or None."""
    box = []
    sv = valid_box(src)
    dv = valid_box(dst)
    for d in range(len(dst.full_shape)):
        a, b = sv[d]
        if d == 0:
            lo = _base(src, 0) + row0
            a, b = max(a, lo), min(b, lo + src_rows.shape[0])
        a, b = max(a, dv[d][0]), min(b, dv[d][1])
        if a >= b:
            return None
        box.append((a, b))
    di = tuple(slice(a - _base(dst, d), b - _base(dst, d)) for d, (a, b) in enumerate(box))
    si = tuple(slice(a - _base(src, d) - (row0 if d == 0 else 0),
                     b - _base(src, d) - (row0 if d == 0 else 0)) for d, (a, b) in enumerate(box))
    dst_view[di].copy_(src_rows[si])
    return tuple(box)


def _covers(boxes: list[Box], want: Box) -> bool:
    """Whether the union of ``boxes`` contains ``want`` (1-D or 2-D)."""
    if any(a >= b for a, b in want):
        return True
    if len(want) == 1:
        pos = want[0][0]
        for (a, b), in sorted(boxes):
            if a > pos:
                break
            pos = max(pos, b)
        return pos >= want[0][1]
    cuts = sorted({want[1][0], want[1][1], *(x for bx in boxes for x in bx[1])})
    for c0, c1 in itertools.pairwise(cuts):
        if c1 <= want[1][0] or c0 >= want[1][1]:
            continue
        rows = [bx[0] for bx in boxes if bx[1][0] <= c0 and bx[1][1] >= c1]
        if not _covers([(r,) for r in rows], (want[0],)):
            return False
    return True


class Coverage:
    """Which logical regions of each target tensor were written, to prove an assembly complete
    (a missed region would otherwise stay uninitialised memory)."""

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, str], list[Box]] = {}

    def add(self, key: tuple[str, str], box: Box | None) -> None:
        if box is not None:
            self._boxes.setdefault(key, []).append(box)

    def missing(self, layout: ArenaLayout) -> list[str]:
        return [f"{e.kind}:{e.shard.name}" for e in layout.entries
                if not _covers(self._boxes.get(e.key, []), valid_box(e.shard))]


def assemble(target: ShardedState, sources: Iterable[ShardedState]) -> None:
    """Fill ``target`` from the shards of ``sources`` that overlap it (local slicing).

    Sources are matched by logical tensor, so the tied ``lm_head`` copy is cut from the
    embedding. Raises when a valid row of the target is not covered by any source.
    """
    cov = Coverage()
    by_logical: dict[tuple[str, str], list[tuple[torch.Tensor, Shard]]] = {}
    for src in sources:
        for e in src.layout.entries:
            by_logical.setdefault((e.kind, e.shard.logical), []).append(
                (src.tensor(e.kind, e.shard.name), e.shard))
    for e in target.layout.entries:
        dst_view = target.tensor(e.kind, e.shard.name)
        for src_view, s in by_logical.get((e.kind, e.shard.logical), []):
            cov.add(e.key, copy_block(dst_view, e.shard, src_view, s))
            if e.shard.split_dim is None:
                break  # replicated: one copy is the whole tensor
    missing = cov.missing(target.layout)
    if missing:
        raise StateMismatch(f"target position {target.position} of tp={target.tp} "
                            f"pp={target.pp} not covered: {missing[:4]}")
    target.zero_padding()


# ---------------------------------------------------------------- the logical state
@dataclass
class LogicalState:
    """The full (unsharded, unpadded) state of a model-stage: what every copy must equal."""

    spec: StateSpec
    tensors: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    meta: StateMeta = field(default_factory=StateMeta)

    def first_difference(self, other: LogicalState) -> str | None:
        """None when both are bitwise equal (``torch.equal`` on every tensor), else where not."""
        if self.spec != other.spec:
            return f"spec {self.spec} != {other.spec}"
        if self.meta != other.meta:
            return f"meta {self.meta.digest()} != {other.meta.digest()}"
        if self.tensors.keys() != other.tensors.keys():
            return f"tensor sets differ: {sorted(self.tensors.keys() ^ other.tensors.keys())[:4]}"
        for k, t in self.tensors.items():
            o = other.tensors[k]
            if t.dtype != o.dtype or t.shape != o.shape or not torch.equal(t, o):
                return f"tensor {k[0]}:{k[1]} differs"
        return None

    def equal(self, other: LogicalState) -> bool:
        return self.first_difference(other) is None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def gather(shards: Sequence[ShardedState]) -> LogicalState:
    """Reassemble the logical state from every position of one unit (any layout).

    Checks that each position appears once, that the scalars agree, and that every copy of a
    tensor inside the unit (replicated norms and KV heads, the tied LM-head copy) is identical.
    """
    if not shards:
        raise ValueError("gather needs the shards of one unit")
    first = shards[0]
    spec, tp, pp = first.spec, first.tp, first.pp
    check_layout(spec.model, tp, pp)
    seen = {s.position for s in shards}
    want = {(t, r) for t in range(tp) for r in range(pp)}
    if len(shards) != len(want) or seen != want:
        raise ValueError(f"gather needs positions {sorted(want)}, got {sorted(seen)}")
    for s in shards:
        if s.spec != spec or (s.tp, s.pp) != (tp, pp):
            raise ValueError("shards of different units")
        if s.meta != first.meta:
            raise StateMismatch(f"scalars differ between positions {first.position} and "
                                f"{s.position}")
    full: dict[tuple[str, str], torch.Tensor] = {}
    written: dict[tuple[str, str], torch.Tensor] = {}
    params = {p.name: p for p in logical_params(spec.model, spec.head)}
    for kind in spec.kinds:
        for name, p in params.items():
            full[(kind, name)] = torch.zeros(p.shape, dtype=spec.dtype(kind))
            n_rows = p.shape[p.split_dim] if p.split_dim is not None else 1
            written[(kind, name)] = torch.zeros(n_rows, dtype=torch.bool)
    for s in shards:
        for e in s.layout.entries:
            sh = e.shard
            key = (e.kind, sh.logical)
            src = s.tensor(e.kind, sh.name).detach().cpu()
            dst = full[key]
            if sh.split_dim is None:
                part, rows = src, slice(0, 1)
                region = dst
            else:
                n = sh.valid_len
                if n == 0:
                    continue
                part = src.narrow(sh.split_dim, 0, n)
                region = dst.narrow(sh.split_dim, sh.start, n)
                rows = slice(sh.start, sh.start + n)
            w = written[key][rows]
            # a replica of rows already written must be identical where it overlaps
            if bool(w.any()) and bool(w.all()) and not torch.equal(region, part):
                raise StateMismatch(f"copies of {e.kind}:{sh.logical} differ in the unit")
            region.copy_(part)
            written[key][rows] = True
    holes = [f"{k[0]}:{k[1]}" for k, w in written.items() if not bool(w.all())]
    if holes:
        raise StateMismatch(f"unit lacks rows of {holes[:4]}")
    return LogicalState(spec, full, first.meta)
