"""The cost model: latency and peak memory of model-stage candidates, and the weight sync.

Every latency is a sum of ops whose ideal time comes from FLOPs over peak FLOP/s, bytes over
HBM or link bandwidth, and per-message latency; op-class efficiencies scale them (``explain()``
shows each). Memory is the fullest GPU of a replica: parameters, gradients, optimizer state,
activations (with or without recomputation), KV cache, co-resident idle state, workspace.

The formulas are written once, over NumPy columns of candidates: ``evaluate`` prices thousands
of candidates in one pass for the planner, and ``estimate`` runs the same code on one candidate
to build its explainable op list. There is no second implementation to drift.

Modelling choices (each is stated where it is used):
- Training runs 1F1B pipelines; the bubble is (pp - 1) micro-batch slots; DP gradient sync and
  the optimizer step are not overlapped with compute (conservative).
- Time uses the mean sequence length (frameworks pack or remove padding); memory uses the
  maximum (one micro-batch may hold the longest sequences).
- Idle model-stages are offloaded to host memory between phases, as verl and OpenRLHF do when
  models share GPUs; reload and offload cost host-link time. Inside a phase, model-stages that
  share a GPU set keep their state resident (the planner passes it as ``coresident_bytes``).
- Generation follows a vLLM-style engine: chunked prefill, then decode iterations whose batch is
  as large as the KV cache left in memory allows; each iteration costs the larger of its HBM
  reads (weights + KV) and its GEMM time (roofline).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from operator import attrgetter
from typing import Any, NamedTuple, cast

import numpy as np

from nereus.cost import work
from nereus.cost.candidate import Candidate, Layout
from nereus.cost.comm import STEPS, WIRE_FRACTION
from nereus.cost.efficiency import Efficiencies
from nereus.cost.estimate import BUBBLE, HEADROOM, Estimate
from nereus.cost.ops import Op, OpClass, comm_class
from nereus.errors import count as words
from nereus.spec.cluster import Cluster
from nereus.spec.job import JobSpec
from nereus.spec.model import Head, ModelSpec
from nereus.spec.sharding import (
    EMBED,
    LM_HEAD,
    layout_problem,
    logical_params,
    max_shard_numel,
    padded_vocab,
    shard_plan,
)
from nereus.spec.workflow import Execution, ModelStage, StageKind

GiB = 1024**3
MiB = 1024**2

# Per-GPU workspace outside the tensors we count: CUDA context (~0.5 GiB), cuBLAS and NCCL
# buffers, allocator fragmentation. Assumption, corrected by memory calibration.
GPU_WORKSPACE_BYTES = 2 * GiB
# A CPU device slot: the Python process and torch's allocator arenas. Assumption.
CPU_WORKSPACE_BYTES = 64 * MiB
# Tokens per chunked-prefill step (vLLM's max_num_batched_tokens is of this order). Assumption.
PREFILL_CHUNK_TOKENS = 8192
# Memory traffic of one Adam update on top of the param/grad/master reads and writes: read and
# write both fp32 moments = 16 bytes per parameter (Kingma & Ba 2015 update rule, counted by hand).
ADAM_MOMENT_TRAFFIC = 16
# Bytes per token per vocabulary entry of a TP rank's slice of the LM head output: fp32 logits and
# one more fp32 tensor of their shape (softmax / log-probs, or their gradient), as Megatron's
# vocab-parallel cross-entropy keeps them (counted by hand).
LOGIT_BYTES = 8.0
# Copies of one logical tensor a GPU holds while the weight sync gathers it (count): the sync
# goes tensor by tensor, and a tensor's TP slices, once gathered, are concatenated into a new
# tensor while they are still alive (verl's Megatron-to-vLLM resharding: ``per_tensor_generator``
# in verl/utils/megatron_utils.py all-gathers into tp tensors, then ``torch.cat``; its FSDP path,
# ``DTensor.full_tensor()`` per parameter in sharding_manager/fsdp_vllm.py, holds one).
SYNC_GATHER_COPIES = 2

Arr = np.ndarray

# what each ``Links`` kind names: its group, and the collective it prices
LINK_KINDS = {"tp": ("TP group", "TP all-reduces"),
              "pp": ("pipeline hop", "pp activation send/recv"),
              "embed": ("first/last-block pair", "tied embedding grad all-reduce"),
              "dp": ("DP group", "gradient all-reduce")}
_KIND_INDEX = {k: i for i, k in enumerate(LINK_KINDS)}
# what ``_columns`` reads of a candidate, in one C-level call
_CANDIDATE_FIELDS = attrgetter("layout", "dp", "micro_batch", "grad_accum", "recompute")
SYNC_SPANS = ("a training or generation replica spans nodes (its GPU ids): resharding priced "
              "on the inter-node link")


@dataclass(frozen=True)
class Columns:
    """Candidates of one stage as columns; every field is an array of the same length."""

    tp: Arr
    pp: Arr
    dp: Arr
    b: Arr
    a: Arr
    recompute: Arr
    numel: Arr       # parameters on the fullest GPU of a replica
    resident: Arr    # bytes of state kept while idle inside the phase
    links: Links | None = None  # where the GPU ids put each group; None: decided from sizes

    @property
    def size(self) -> Arr:
        return self.tp * self.pp

    @property
    def gpus(self) -> Arr:
        return self.dp * self.tp * self.pp


class Row(NamedTuple):
    """One op of every candidate: ideal seconds (array) and its class (per candidate when the
    class depends on the link: ``cls_inter`` where ``intra`` is False). A tuple: an estimate
    builds dozens, and a frozen dataclass sets each field through ``object.__setattr__``."""

    term: str
    name: str
    cls: OpClass
    calls: Arr       # times each candidate runs the op (``Op.count``; ``count``: tuple's)
    flops: Arr
    nbytes: Arr
    ideal: Arr
    cls_inter: OpClass | None = None
    intra: Arr | None = None
    timed: tuple[OpClass, OpClass] | None = None  # (intra, inter) class a timer files it under

    def eff(self, e: Efficiencies) -> Arr | float:
        """Each candidate's efficiency (one float when the class does not depend on it)."""
        if self.cls_inter is None or self.intra is None:  # both or neither (``cls_at``)
            return e[self.cls]
        return np.where(self.intra, e[self.cls], e[self.cls_inter])

    def cls_at(self, i: int) -> OpClass:
        if self.cls_inter is None or self.intra is None:
            return self.cls
        return self.cls if bool(self.intra[i]) else self.cls_inter

    def timed_at(self, i: int) -> OpClass | None:
        if self.timed is None:
            return None
        return self.timed[0] if self.intra is None or bool(self.intra[i]) else self.timed[1]


@dataclass(frozen=True)
class Evaluation:
    """Prices of many candidates of one stage (arrays aligned with the input candidates)."""

    stage: ModelStage
    candidates: tuple[Candidate, ...]
    rows: tuple[Row, ...]
    memory: Mapping[str, Arr]
    resident: Arr
    latency: Arr
    efficiencies: Efficiencies
    notes: tuple[tuple[str, ...], ...] = field(default=())
    links: Links | None = None

    @cached_property
    def peak(self) -> Arr:
        """Computed once: a search reads it for the memory test and the transient bytes."""
        return sum(self.memory.values(), np.zeros(len(self.candidates)))

    @property
    def transient(self) -> Arr:
        return self.peak - self.resident


def _f(x: object) -> Arr:
    return np.asarray(x, dtype=float)


class SyncReceivers(NamedTuple):
    """Generation GPUs of a colocated weight sync by where their shard comes from."""

    colocated: int   # hold a training shard: receive what it lacks
    on_node: int     # hold none, on a node with training GPUs: whole shard on the node fabric
    off_node: int    # hold none, on a node without: whole shard over the network


@dataclass(frozen=True)
class Links:
    """Which collectives of a stage placed on given GPU ids cross nodes: for each kind of group,
    one group whose GPUs sit on two or more nodes, empty where every group of that kind stays
    inside a node (``CostModel.placed_links`` reads them off the ids), None where the kind is
    left to sizes.

    Without it the model decides from sizes (a TP group of at most a node's GPUs runs inside a
    node, and so on), which is how the search prices candidates before they are placed; a
    placed plan (the planner's, or GPU ids a user gives) is priced on its ids, which can put a
    group of that size across two nodes, where its collectives run on the network.
    """

    tp: tuple[int, ...] | None = None     # a TP group: its all-reduces
    pp: tuple[int, ...] | None = None     # a pipeline hop (sender, receiver): activations
    embed: tuple[int, ...] | None = None  # a TP rank's first- and last-block GPUs: tied
    #                                       embedding gradient
    dp: tuple[int, ...] | None = None     # one (tp, pp) position across the replicas:
    #                                       gradient all-reduce

    def spans(self) -> dict[str, tuple[int, ...]]:
        """The kinds placed across nodes, each with one group that spans."""
        kinds = {"tp": self.tp, "pp": self.pp, "embed": self.embed, "dp": self.dp}
        return {k: v for k, v in kinds.items() if v}


class _Ideal(NamedTuple):
    """What ``CostModel.evaluate`` computes before it applies the efficiencies: the op rows
    (ideal seconds), memory by term (scaled, without the co-resident bytes) and resident
    bytes, aligned with the candidates. Shared between evaluations: never written to."""

    rows: tuple[Row, ...]
    memory: Mapping[str, Arr]
    resident: Arr


class _IdealMemo:
    """``_Ideal`` by (job, memory scale, stage, candidates, which links cross nodes, and for
    generation the co-resident bytes and the two efficiencies its rows read), least recently
    used first out past ``limit`` candidates in all.

    A run prices the same candidates at the same lengths under different efficiencies again
    and again: the simulator's truth prices a step's plan, and the controller learns from that
    step with the same plan and lengths; a plan search re-run at a length bucket's edge because
    the calibrated efficiencies moved evaluates every candidate as the last one did. Only the
    efficiencies differ, and they enter ``evaluate`` after the rows are built (the latency is
    sum(ideal / eff) over rows), so the rows and memory are reused as they are and every
    figure stays exactly what a fresh evaluation gives. The key holds everything else the
    rows read: the job (model, cluster, pool, workflow, workload lengths; as its
    ``_token``), the memory scale, and of ``Links`` only whether each kind of group
    crosses nodes (``_intra``; for one candidate, only the kinds it uses:
    ``CostModel._link_key``), not which GPU ids it names (those reach the estimate's notes,
    which are built per call). The other memos below use the same class.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.size = 0
        self._items: dict[tuple[object, ...], tuple[Any, int]] = {}

    def get(self, key: tuple[object, ...]) -> Any:
        got = self._items.pop(key, None)
        if got is None:
            return None
        self._items[key] = got  # most recently used last
        return got[0]

    def put(self, key: tuple[object, ...], value: Any, n: int) -> None:
        self._items[key] = (value, n)
        self.size += n
        while self.size > self.limit and len(self._items) > 1:
            old = next(iter(self._items))
            self.size -= self._items.pop(old)[1]


# Candidates whose rows ``_IDEAL`` keeps (a few kB each): two searches' worth on the 8B PPO
# example (about 20,000 candidates each), and the few plans a controller prices per step.
_IDEAL = _IdealMemo(limit=50_000)
# Training and forward ops (``Row``s) by (the job but its longest response, the stage, the
# candidates, what their rows read of ``Links``), for ``CostModel.evaluate``: the ops of those
# stages read the mean length only (memory reads the longest). Bounded as ``_IDEAL``.
_ROWS = _IdealMemo(limit=20_000)
# The weight sync's parts but the efficiencies (``CostModel.weight_sync_parts``) by (the job
# but its response lengths, the memory scale, the two layouts and what the receivers hold and
# where): a plan's sync is priced again at every step, under new lengths that it never reads.
_SyncParts = tuple[Mapping[str, int], tuple[tuple[tuple[Op, ...], tuple[str, ...]], ...]]
_SYNC = _IdealMemo(limit=1_024)
# One-candidate estimates whose parts ``_PARTS`` keeps (``CostModel.estimate``; an op list and
# a memory table, a few kB each): the dozens of stage estimates a controller and the
# simulator's truth make per step, over a few steps.
_PARTS = _IdealMemo(limit=4_096)

# What ``_token`` numbered (jobs, jobs but their lengths, a search's candidate lists), oldest
# first; past the limit the oldest goes, and a key seen again gets a new number (the memo
# entries under the old one age out unread).
_TOKENS: dict[object, int] = {}
_TOKENS_LIMIT = 1_024
_next_token = 0


def _token(key: object) -> int:
    """A number for ``key`` that equal keys share and no other key ever gets (numbers are
    never reused), so memo keys hold it instead of a key that is slow to hash."""
    global _next_token
    got = _TOKENS.get(key)
    if got is None:
        if len(_TOKENS) >= _TOKENS_LIMIT:
            del _TOKENS[next(iter(_TOKENS))]
        got = _TOKENS[key] = _next_token
        _next_token += 1
    return got


class _Parts(NamedTuple):
    """What ``CostModel.estimate`` builds of one candidate besides the efficiencies (which it
    reads only through the ops' ideal seconds, in ``Estimate.latency_s``). Shared between
    estimates: never written to."""

    ops: tuple[Op, ...]
    memory: Mapping[str, int]
    resident: int
    notes: tuple[str, ...]


def _link_kinds(links: Links | None) -> tuple[bool | None, ...] | None:
    """What the rows read of ``links``: per kind, whether its group crosses nodes (None: left
    to sizes)."""
    if links is None:
        return None
    return tuple(None if v is None else bool(v) for v in (links.tp, links.pp, links.embed,
                                                           links.dp))


def _layout_and_gpus(x: Layout | Candidate) -> tuple[Layout, int | None]:
    return (x.layout, x.gpus) if isinstance(x, Candidate) else (x, None)


class CostModel:
    """Prices candidates of one job's model-stages under a set of efficiencies."""

    def __init__(self, job: JobSpec, efficiencies: Efficiencies | None = None,
                 memory_scale: Mapping[StageKind, float] | None = None):
        self.job = job
        self.eff = efficiencies or Efficiencies(device=job.cluster.device.name)
        self.memory_scale = dict(memory_scale or {})
        self.device = job.cluster.device
        self.node_size = min(job.cluster.devices_per_node, job.pool.largest_node_share())
        # what the shared memos key on besides the stage and candidates (``memory_scale`` is
        # not written to after this)
        self._memo_key = (_token(job),
                          tuple(sorted((k.value, v) for k, v in self.memory_scale.items())))
        self._rows_key: int | None = None
        self._sync_key: int | None = None
        self._cache: dict[tuple[str, Candidate, int, Links | None], Estimate] = {}
        self._placed: dict[tuple[Layout, tuple[tuple[int, ...], ...]], Links] = {}
        self._sync: dict[tuple[Layout, Layout, int | None, float | None, bool | None],
                         tuple[Estimate, Estimate, Estimate]] = {}
        self._sync_peak: dict[tuple[Layout, Layout], int] = {}
        self._nodes: tuple[tuple[int, ...], ...] | None = None
        self._room: tuple[int, ...] | None = None
        self._kinds: dict[int, tuple[int, int]] = {}  # pp -> _layer_kinds of its blocks

    # ------------------------------------------------------------------ public API
    def stage_batch(self, stage: ModelStage | str) -> int:
        """Sequences one run of the stage handles: per update (train) or per step. ReMax's
        generation counts its greedy baselines too, which it prices as a second run after the
        sampled sequences (``_generate``)."""
        st = self._stage(stage)
        w = self.job.workload
        greedy = self.job.workflow.greedy_baseline
        if st.kind is StageKind.TRAIN:
            return w.sequences_per_update
        if st.kind is StageKind.GENERATE:
            return w.sequences_per_step + (w.prompts_per_step if greedy else 0)
        extra = w.prompts_per_step if greedy and st.model == "reward" else 0
        return w.sequences_per_step + extra

    def layout_problem(self, stage: ModelStage | str, layout: Layout) -> str | None:
        return layout_problem(self.job.model, layout.tp, layout.pp)

    def resident_bytes(self, stage: ModelStage | str, layout: Layout) -> int:
        """State a stage keeps on a GPU while it waits for its turn inside its phase."""
        st = self._stage(stage)
        head = self.job.workflow.model(st.model).head
        numel = max_shard_numel(self.job.model, head, layout.tp, layout.pp)
        return int(numel * self._resident_per_param(st) * self.memory_scale.get(st.kind, 1.0))

    def evaluate(self, stage: ModelStage | str, cands: Sequence[Candidate],
                 coresident_bytes: float | Arr = 0.0, links: Links | None = None) -> Evaluation:
        """Latency and memory of many candidates at once. ``links``: the candidates run on the
        GPU ids they were read from (``placed_links``; one layout and dp, so one placement), and
        each collective is priced on the link those ids give it instead of by sizes.

        The ops and memory come from ``_IDEAL`` where a cost model of the same job priced the
        same candidates before (see ``_IdealMemo``); only the efficiencies are applied here."""
        st = self._stage(stage)
        cands = tuple(cands)
        hit, memory = self._unpriced(st, cands, coresident_bytes, links)
        latency = np.zeros(len(cands))
        for r in hit.rows:
            latency = latency + r.ideal / r.eff(self.eff)
        return Evaluation(st, cands, hit.rows, memory, hit.resident, latency, self.eff,
                          links=links)

    def _unpriced(self, st: ModelStage, cands: tuple[Candidate, ...],
                  coresident_bytes: float | Arr, links: Links | None
                  ) -> tuple[_Ideal, dict[str, Arr]]:
        """``evaluate`` before the efficiencies: the ops and the memory by term."""
        co = np.broadcast_to(_f(coresident_bytes), (len(cands),)).astype(float)
        generate = st.kind is StageKind.GENERATE
        # a search's thousands of candidates are hashed once here, not at every memo lookup
        named = cands if len(cands) == 1 else _token(("candidates", cands))
        key = (*self._memo_key, st.name, named,
               self._link_key(st, cands[0], links) if len(cands) == 1 else _link_kinds(links),
               # generation rows read the co-resident bytes (its KV cache takes what they leave)
               # and two efficiencies (whether a decode iteration is bound by HBM or GEMMs)
               (co.tobytes(), self.eff[OpClass.DECODE], self.eff[OpClass.GEMM]) if generate
               else None)
        hit = _IDEAL.get(key)
        if hit is None:
            cols = self._columns(st, cands, links)
            if generate:
                rows, memory = self._generate(st, cols, co)
            else:
                # training and forward ops read the mean length, not the longest: shared
                # between jobs that differ only there (a controller prices its plan at its
                # recent longest plus a margin, the simulator's truth at the step's longest)
                rkey = (self._rows_token(), st.name, named, key[4])
                rows = _ROWS.get(rkey)
                train = st.kind is StageKind.TRAIN
                if rows is None:
                    rows = self._train_rows(st, cols) if train else self._forward_rows(st, cols)
                    _ROWS.put(rkey, rows, len(cands))
                memory = self._train_memory(st, cols) if train else \
                    self._forward_memory(st, cols)
            scale = self.memory_scale.get(st.kind, 1.0)
            hit = _Ideal(tuple(rows), {k: v * scale for k, v in memory.items()},
                         cols.resident * scale)
            _IDEAL.put(key, hit, len(cands))
        memory = dict(hit.memory)
        memory["co-resident idle state"] = co
        return hit, memory

    def estimate(self, stage: ModelStage | str, cand: Candidate,
                 coresident_bytes: int = 0, links: Links | None = None) -> Estimate:
        """One candidate, with its op list for ``explain()``; ``links`` as in ``evaluate``.

        Its ops, memory and notes come from ``_PARTS`` where a cost model of the same job built
        them before: they do not depend on the efficiencies, except a generation stage's on the
        two that ``evaluate``'s key holds. The key holds everything else they read: the job
        (``_token``), the memory scale, the stage, the candidate, the co-resident bytes and
        ``links`` whole (the notes name its GPU ids)."""
        st = self._stage(stage)
        if links is not None and self._as_sized(st, cand, links):
            # the same rows and notes as without: share the estimate (a placed plan's notes
            # compare each stage with its node-aligned price, ``plan.evaluate``)
            links = None
        key = (st.name, cand, int(coresident_bytes), links)
        hit = self._cache.get(key)
        if hit is None:  # only valid candidates are ever cached
            problem = layout_problem(self.job.model, cand.tp, cand.pp)
            if problem:
                raise ValueError(f"{st.name}: {problem}")
            hit = self._cache[key] = self._estimate(st, cand, coresident_bytes, links)
        return hit

    def _estimate(self, st: ModelStage, cand: Candidate, coresident_bytes: float,
                  links: Links | None) -> Estimate:
        generate = st.kind is StageKind.GENERATE
        key = (*self._memo_key, st.name, cand, float(coresident_bytes), links,
               (self.eff[OpClass.DECODE], self.eff[OpClass.GEMM]) if generate else None)
        parts = _PARTS.get(key)
        if parts is None:  # an estimate needs the ops, not ``evaluate``'s latency array
            ideal, memory = self._unpriced(st, (cand,), coresident_bytes, links)
            est = self._op_estimate(st, cand, ideal.rows, memory, ideal.resident, links, 0)
            _PARTS.put(key, _Parts(est.ops, est.memory, est.resident_bytes, est.notes), 1)
            return est
        return Estimate(st.name, cand, parts.ops, self.eff, parts.memory, parts.resident,
                        self.device.memory_bytes, parts.notes)

    def _rows_token(self) -> int:
        """``_token`` of the job without its longest response (what training and forward
        ops read of the job: model, cluster, pool, workflow and every other workload field),
        taken once per cost model."""
        if self._rows_key is None:
            j, w = self.job, self.job.workload
            self._rows_key = _token(("rows", j.model, j.cluster, j.pool, j.workflow,
                                     replace(w, response_len_max=w.response_len_mean)))
        return self._rows_key

    def priced_as_sized(self, stage: ModelStage | str, c: Candidate, links: Links) -> bool:
        """Whether ``c`` placed on ``links`` runs every collective it uses on the link its
        sizes give it: then its ops, and its latency, are those of the node-aligned estimate
        (``estimate`` without ``links``)."""
        st = self._stage(stage)
        return self._link_key(st, c, links) == self._link_key(st, c, None)

    def _link_key(self, st: ModelStage, c: Candidate, links: Links | None
                  ) -> tuple[bool | None, ...]:
        """What one candidate's rows read of ``links``: for each kind of group it uses
        (``LINK_KINDS``' order), whether the group runs inside a node (as placed, else by its
        size: ``_intra``'s tests); None for a kind it does not use, whose rows are zero either
        way. Equal keys give equal rows, so a placement that keeps every group where its size
        would shares the rows of the node-aligned estimate (``plan.evaluate``'s notes compare
        the two)."""
        n, lay = self.node_size, c.layout
        size = lay.size
        sized = (lay.tp <= n, size <= n, size <= n, c.dp * size <= n)
        used = self._used(st, c)
        if links is None:
            return tuple(s if u else None for u, s in zip(used, sized))
        placed = (links.tp, links.pp, links.embed, links.dp)
        return tuple(None if not u else s if p is None else not p
                     for u, s, p in zip(used, sized, placed))

    def _as_sized(self, st: ModelStage, c: Candidate, links: Links) -> bool:
        """Whether ``c``'s estimate on ``links`` is its estimate without them: the same ops
        (``priced_as_sized``) and, no group it uses spanning nodes, no link notes."""
        return self.priced_as_sized(st, c, links) and not self.spanning(st, c, links)

    def to_estimate(self, ev: Evaluation, i: int) -> Estimate:
        return self._op_estimate(ev.stage, ev.candidates[i], ev.rows, ev.memory, ev.resident,
                                 ev.links, i, ev.efficiencies)

    def _op_estimate(self, st: ModelStage, c: Candidate, rows: Sequence[Row],
                     memory_by_term: Mapping[str, Arr], resident: Arr, links: Links | None,
                     i: int, eff: Efficiencies | None = None) -> Estimate:
        """Candidate ``i`` of evaluated rows and memory as an estimate with its op list."""
        ops = tuple(Op(r.cls_at(i), r.term, r.name, float(r.calls[i]), float(r.flops[i]),
                       float(r.nbytes[i]), float(r.ideal[i]), r.timed_at(i))
                    for r in rows if r.ideal[i] > 0)
        memory = {k: int(v[i]) for k, v in memory_by_term.items()}
        notes = self._notes(st, c, memory)
        if links is not None:
            notes += self._link_notes(st, c, links)
        return Estimate(st.name, c, ops, eff or self.eff, memory, int(resident[i]),
                        self.device.memory_bytes, notes)

    def weight_sync(self, train: Layout | Candidate, gen: Layout | Candidate,
                    receivers: SyncReceivers | None = None, overlap: float | None = None,
                    intra: bool | None = None) -> Estimate:
        """Per-step resharding of the actor's weights from its training to its generation layout.

        Synchronous execution colocates the two stages (the phases take turns on the pool) with
        HybridFlow's rank mapping: the generation GPUs are the training GPUs first. A generation
        GPU that holds a training shard keeps their overlap and receives the rest of its
        1/(tp_g pp_g) of the weights, over the node's fabric when both layouts fit in a node;
        the GPU whose shards overlap least, of those that hold both, sets the time
        (``least_overlap``). When generation spans more GPUs than training, the extra ones hold
        no training shard and receive their whole shard, 1/(tp_g pp_g): over the node's fabric
        if they sit on a node with training GPUs, over the network if not
        (``sync_receivers``). The receivers work in parallel, so the sync takes as long as its
        slowest kind of receiver. The GPU counts come from candidates; given bare layouts,
        every generation GPU is taken to hold a training shard, and every pairing of a
        training and a generation position that the rank mapping makes on some GPU counts. A
        placed plan passes ``receivers`` as its GPU ids have them (``placed_sync_receivers``),
        and ``overlap``, the least share its GPUs that hold both shards hold, as their positions
        in the replicas have it (``placed_overlap``: a replica need not be laid in rank order).
        The estimate's memory is the sync's fullest GPU (``weight_sync_memory``).

        Asynchronous execution runs generation on GPUs disjoint from training (``plan.validate``
        checks it), so nothing is local: each generation GPU receives its whole shard,
        1/(tp_g pp_g) of the weights, over the network unless the whole pool sits in one node.

        Without ``receivers`` the estimate depends on the two layouts, the two GPU counts and
        the job (its execution mode and pool), not on where the stages are placed, so the
        search can price it per (layout, GPU count) pair; placement puts training on the
        pool's fullest nodes (``training_nodes``) and generation on the training GPUs first,
        so that it runs as priced unless that would cost a node-contained TP group or the
        replicas are spread over nodes. Communicators for it are created once per pair, not
        per step.

        ``intra``: whether the receivers that gather on a node's fabric do, as given GPU ids
        place the replicas (``placed_sync_intra``); None decides it from the layouts' sizes,
        as the planner's node-aligned placements have it.
        """
        lt, t = _layout_and_gpus(train)
        lg, g = _layout_and_gpus(gen)
        if self.job.workflow.execution is Execution.ASYNC:
            return self.weight_sync_parts(lt, lg, intra=intra)[0]
        if receivers is not None:
            rec, g = receivers, sum(receivers)
        elif t is None or g is None:
            return self.weight_sync_parts(lt, lg, intra=intra)[0]
        else:
            rec = self.sync_receivers(t, g)
        parts = self.weight_sync_parts(lt, lg, rec.colocated, overlap, intra)
        present = [(n, e) for n, e in zip(rec, parts) if n > 0]
        worst = max(present, key=lambda ne: ne[1].latency_s)[1]  # first of equals
        if rec.colocated == g:
            return worst
        held = "" if t is None else f" ({t} training GPUs)"
        note = (f"{rec.on_node + rec.off_node} of {g} generation GPUs hold no training shard"
                f"{held}: {rec.on_node} on a node with training GPUs, "
                f"{rec.off_node} on other nodes; priced by the slowest")
        return replace(worst, notes=(*worst.notes, note))

    def sync_receivers(self, train_gpus: int, gen_gpus: int) -> SyncReceivers:
        """How the generation GPUs of a colocated weight sync stand to the training GPUs.

        The training GPUs fill the pool's fullest nodes first (as few nodes as hold them) and
        the generation GPUs take the training GPUs first, then the rest of those nodes, then
        other nodes. A count model, not a placement: the search prices plans before placing them.
        """
        colocated = min(gen_gpus, train_gpus)
        room = train_gpus
        for share in self._node_room():
            if share >= train_gpus:
                room = share
                break
        else:
            room = max(train_gpus, self.job.pool.size)
        on_node = max(0, min(gen_gpus, room) - colocated)
        return SyncReceivers(colocated, on_node, gen_gpus - colocated - on_node)

    def placed_sync_receivers(self, train: Iterable[Sequence[int]],
                              gen: Iterable[Sequence[int]]) -> SyncReceivers | None:
        """``SyncReceivers`` of placed replicas (GPU ids): generation GPUs among the training
        GPUs, on a node with one, elsewhere. None if either stage has no GPU ids."""
        t = {i for r in train for i in r}
        g = {i for r in gen for i in r}
        if not t or not g:
            return None
        node = self.job.cluster.node_of
        nodes = {node(i) for i in t}
        colocated = len(g & t)
        on_node = sum(1 for i in g - t if node(i) in nodes)
        return SyncReceivers(colocated, on_node, len(g) - colocated - on_node)

    def placed_sync_intra(self, train: Iterable[Sequence[int]],
                          gen: Iterable[Sequence[int]]) -> bool:
        """Whether every training and every generation replica sits inside one node: what the
        sizes stand for in the weight sync's node-fabric test (``_sync_rows``), read off
        placed replicas (a receiver gathers from its training replica's GPUs)."""
        same = self.job.cluster.same_node
        return all(same(r) for r in train) and all(same(r) for r in gen)

    def placed_links(self, layout: Layout, replicas: Iterable[Sequence[int]]) -> Links:
        """``Links`` of a stage's replicas as placed. A replica's GPU at index
        ``pp_rank * tp + tp_rank`` holds that position (``plan.types.StagePlan``, the order
        ``contiguous_replicas`` and the runtime lay), so a TP group is a run of ``tp``
        consecutive ids, a pipeline hop joins index i and i + tp (the same TP rank of
        consecutive blocks), the tied embedding's gradient joins index t and
        (pp - 1) tp + t, and a DP group is one index across the replicas."""
        reps = tuple(tuple(r) for r in replicas)
        key = (layout, reps)
        hit = self._placed.get(key)
        if hit is None:  # every plan's stages are priced as placed, at every step of a run
            hit = self._placed[key] = _read_links(self.job.cluster, layout, reps)
        return hit

    def training_nodes(self, train_gpus: int) -> tuple[int, ...]:
        """The GPU ids of the nodes ``sync_receivers`` has ``train_gpus`` training GPUs fill:
        the pool's fullest nodes, as few as hold them. Placement prefers them for the training
        stage of a synchronous weight sync."""
        out: list[int] = []
        for ids in self._fullest_nodes():
            if len(out) >= train_gpus:
                break
            out += ids
        return tuple(out)

    def _fullest_nodes(self) -> tuple[tuple[int, ...], ...]:
        """The pool's GPU ids per node, fullest node first (ties by node id)."""
        if self._nodes is None:
            by_node = sorted(self.job.pool.by_node().items(), key=lambda kv: (-len(kv[1]), kv[0]))
            self._nodes = tuple(ids for _, ids in by_node)
        return self._nodes

    def _node_room(self) -> tuple[int, ...]:
        """GPUs of the pool on its k fullest nodes, k = 1, 2, ... (cumulative)."""
        if self._room is None:
            self._room = tuple(int(x) for x in np.cumsum([len(i) for i in self._fullest_nodes()]))
        return self._room

    def weight_sync_parts(self, train: Layout, gen: Layout, colocated: int | None = None,
                          overlap: float | None = None, intra: bool | None = None
                          ) -> tuple[Estimate, Estimate, Estimate]:
        """The weight sync as each kind of generation GPU sees it (``SyncReceivers`` order):
        holding a training shard, holding none on a node with training GPUs, holding none on
        another node. Asynchronous execution: all three are the disjoint-GPU estimate.
        ``colocated``: how many GPUs hold both shards (the first ones of the rank mapping;
        None: every pairing the mapping makes, ``least_overlap``); ``overlap``, where given,
        replaces the mapping's least overlap (``placed_overlap``); ``intra`` as in
        ``weight_sync``. All three carry the memory of the sync's fullest GPU
        (``weight_sync_memory``)."""
        period = math.lcm(train.size, gen.size)
        key = (train, gen, None if colocated is None or colocated >= period else colocated,
               overlap, intra)
        hit = self._sync.get(key)
        if hit is None:
            name = f"weight_sync[{train}->{gen}]"
            cand = Candidate(gen, 1, 1, 1)
            shared = (self._sync_token(), self._memo_key[1], key)
            got = _SYNC.get(shared)
            if got is None:
                got = self._sync_parts(train, gen, key[2], overlap, intra)
                _SYNC.put(shared, got, 1)
            memory, parts = got
            # three parts (``_sync_parts``), which ``tuple`` of a generator cannot tell
            hit = self._sync[key] = cast("tuple[Estimate, Estimate, Estimate]", tuple(
                Estimate(name, cand, ops, self.eff, memory, 0, self.device.memory_bytes, notes)
                for ops, notes in parts))
        return hit

    def _sync_parts(self, train: Layout, gen: Layout, colocated: int | None,
                    overlap: float | None, intra: bool | None) -> _SyncParts:
        """``weight_sync_parts`` but the efficiencies: the memory, and per kind of receiver its
        ops and notes."""
        rows, need = self._sync_rows(train, [gen], colocated, overlap, intra)
        parts: list[tuple[tuple[Op, ...], tuple[str, ...]]] = []
        for j in range(3):
            if need[j] <= 0:
                parts.append(((), ("generation shards already resident: no weight movement",)))
                continue
            ops = tuple(Op(r.cls_at(j), r.term, r.name, 1.0, 0.0, float(r.nbytes[j]),
                           float(r.ideal[j]), r.timed_at(j)) for r in rows if r.ideal[j] > 0)
            # off-node receivers use the network whatever the placement
            parts.append((ops, (SYNC_SPANS,) if intra is False and j < 2 else ()))
        return self.weight_sync_memory(train, gen), (parts[0], parts[1], parts[2])

    def _sync_token(self) -> int:
        """``_token`` of what the weight sync reads of the job: all of it but the response
        lengths (model, cluster, pool, workflow, precision), taken once per cost model."""
        if self._sync_key is None:
            j, w = self.job, self.job.workload
            self._sync_key = _token(("sync", j.model, j.cluster, j.pool, j.workflow,
                                     replace(w, response_len_mean=1, response_len_max=1)))
        return self._sync_key

    def weight_sync_peak_bytes(self, train: Layout, gen: Layout) -> int:
        """Bytes on the fullest GPU of the weight sync from ``train`` into ``gen``
        (``weight_sync_memory`` summed; 0 in asynchronous execution)."""
        key = (train, gen)
        held = self._sync_peak.get(key)
        if held is None:
            held = self._sync_peak[key] = sum(self.weight_sync_memory(train, gen).values())
        return held

    def weight_sync_fits(self, train: Layout, gen: Layout) -> bool:
        """Whether that fullest GPU stays within the memory headroom."""
        return self.weight_sync_peak_bytes(train, gen) <= HEADROOM * self.device.memory_bytes

    def weight_sync_memory(self, train: Layout, gen: Layout) -> dict[str, int]:
        """Bytes on the fullest GPU of a synchronous (colocated) weight sync, by term; empty in
        asynchronous execution, where generation has GPUs of its own, and without a sync.

        The sync runs after the training phase and before generation. What a GPU holds then, as
        verl's sharding managers run it (``FSDPVLLMShardingManager`` and
        ``MegatronVLLMShardingManager.__enter__``):
        - its training shard's parameters, which the sync reads (verl reloads them for it when
          they were offloaded, and offloads them after);
        - its generation shard, whole: the engine's weights are woken before the copy
          (vLLM ``wake_up(tags=["weights"])``) and do not alias training memory ("Copy, not
          share memory");
        - where the layouts differ, one logical tensor (the largest, the vocabulary padded as
          training's TP pads it) gathered ``SYNC_GATHER_COPIES`` times; where they are equal
          each generation shard is a training shard, copied whole, and nothing is gathered;
        - the workspace.
        Not resident: gradients (freed after the last optimizer step: verl's
        ``update_policy`` ends in ``zero_grad()``), the optimizer state (offloaded when the
        training phase ends, before the sync: verl's ``update_actor``), the KV cache (allocated
        once the weights are in: verl wakes it after the sync) and the other model-stages
        (offloaded between phases). The sync therefore peaks neither with training (no
        gradients or optimizer state) nor with generation (no KV cache), and can exceed both.

        The fullest GPU holds the fullest training shard and the fullest generation shard (the
        last pipeline block of each): the rank mapping pairs them on GPU lcm(sizes) - 1, and no
        placement puts more on one GPU. Memory calibration scales each stage's parameters as it
        scales that stage's peak.
        """
        if self.job.workflow.colocated_sync() is None:
            return {}
        scale = self.memory_scale
        return dict(_sync_memory(self.job.model, self.job.workload.param_bytes,
                                 scale.get(StageKind.TRAIN, 1.0),
                                 scale.get(StageKind.GENERATE, 1.0), train, gen,
                                 self._workspace()))

    def weight_sync_table(self, train: Layout, gens: Sequence[Layout]) -> Arr:
        """Seconds of ``weight_sync_parts(train, g)`` for many generation layouts at once:
        shape (len(gens), 3), the same formulas over columns (the search prices every
        generation layout under each training layout)."""
        rows, need = self._sync_rows(train, gens)
        latency = np.zeros(len(need))
        for r in rows:
            latency = latency + r.ideal / r.eff(self.eff)
        return np.where(need > 0, latency, 0.0).reshape(len(gens), 3)

    def _sync_rows(self, train: Layout, gens: Sequence[Layout], colocated: int | None = None,
                   overlap: float | None = None, intra_at: bool | None = None
                   ) -> tuple[list[Row], Arr]:
        """Ops of the weight sync into one receiving GPU of each kind (``SyncReceivers`` order)
        per generation layout, flattened to 3 x len(gens) columns, and the bytes it needs.
        Each receiver gathers its ``need`` from the training replica's GPUs; ``colocated``,
        ``overlap`` and ``intra_at`` (``intra``) as in ``weight_sync_parts``."""
        m, w = self.job.model, self.job.workload
        full = m.param_count(Head.LM) * w.param_bytes
        g_tp = _f([g.tp for g in gens])
        g_pp = _f([g.pp for g in gens])
        shard = full / (g_tp * g_pp)
        if intra_at is None:  # both replicas fit a node: the planner places each inside one
            intra = (g_tp * g_pp <= self.node_size) & (train.size <= self.node_size)
        else:
            intra = np.full(len(gens), intra_at)
        if self.job.workflow.execution is Execution.ASYNC:
            intra = intra & (len(self.job.pool.by_node()) == 1)
            need = np.stack([shard, shard, shard], axis=1)
            links = np.stack([intra, intra, intra], axis=1)
        else:
            held = full * _f([least_overlap(train.tp, train.pp, g.tp, g.pp, colocated)
                              if overlap is None else overlap for g in gens])
            need = np.stack([np.maximum(0.0, shard - held), shard, shard], axis=1)
            links = np.stack([intra, intra, np.zeros_like(intra)], axis=1)
        need = need.ravel()
        if self.job.workflow.weight_sync() is None:
            need = np.zeros_like(need)
        n = max(2, train.size)
        rows = _collective("allgather", n, need * n / (n - 1), links.ravel(), self.device,
                           "weight_sync", "reshard actor weights (train->gen)", 1.0)
        return rows, need

    def kv_bytes_per_token(self, layout: Layout) -> int:
        """KV-cache bytes one token takes on one GPU (its layers, its KV heads)."""
        return int(self._kv_per_token(_f(layout.tp), _f(layout.pp)))

    # ------------------------------------------------------------------ internals
    def _stage(self, stage: ModelStage | str) -> ModelStage:
        return stage if isinstance(stage, ModelStage) else self.job.workflow.stage(stage)

    def _resident_per_param(self, st: ModelStage) -> int:
        w = self.job.workload
        return w.trainable_state_bytes_per_param() if st.kind is StageKind.TRAIN else w.param_bytes

    def _columns(self, st: ModelStage, cands: Sequence[Candidate],
                 links: Links | None = None) -> Columns:
        head = self.job.workflow.model(st.model).head
        m = self.job.model
        if not cands:
            layouts: tuple[Layout, ...] = ()
            dp = b = a = recompute = ()
        else:
            layouts, dp, b, a, recompute = zip(*map(_CANDIDATE_FIELDS, cands))
        # a few layouts among many candidates, told apart by identity (ints hash in C; an
        # equal layout that is another object only gets a row of its own)
        distinct = {id(lay): lay for lay in layouts}
        slot = {key: i for i, key in enumerate(distinct)}
        per_layout = np.array([(lay.tp, lay.pp, max_shard_numel(m, head, lay.tp, lay.pp))
                               for lay in distinct.values()], dtype=float).reshape(-1, 3)
        which = np.fromiter(map(slot.__getitem__, map(id, layouts)), dtype=np.intp,
                            count=len(layouts))
        tp, pp, numel = per_layout[which].T
        return Columns(tp=tp, pp=pp, dp=np.array(dp, dtype=float), b=np.array(b, dtype=float),
                       a=np.array(a, dtype=float), recompute=np.array(recompute, dtype=bool),
                       numel=numel, resident=numel * self._resident_per_param(st), links=links)

    def _workspace(self) -> float:
        return float(CPU_WORKSPACE_BYTES if self.device.name == "cpu" else GPU_WORKSPACE_BYTES)

    def _head(self, st: ModelStage) -> Head:
        return self.job.workflow.model(st.model).head

    def _kv_per_token(self, tp: Arr, pp: Arr) -> Arr:
        m = self.job.model
        heads = np.maximum(1.0, np.floor(m.num_kv_heads / tp))
        return 2.0 * (m.num_layers / pp) * heads * m.head_dim * self.job.workload.param_bytes

    def _kv_seq(self, tp: Arr, pp: Arr, seq: float, start: float | None = None) -> Arr:
        """KV-cache bytes of one sequence of ``seq`` tokens on one GPU (its KV heads, its
        pipeline block). A sliding layer keeps at most the window; the block that counts is
        the one with the most full-attention layers (the fullest, and the slowest to read).
        ``start``: the mean over contexts from ``start`` to ``2 seq - start`` tokens instead
        (what a decode step reads on average while responses grow), exact where a window
        caps part of that range."""
        m = self.job.model
        if m.sliding_window is None:
            return self._kv_per_token(tp, pp) * seq
        capped = _within(m.sliding_window, seq, start)
        full, slide = self._layer_kinds(pp)
        per_layer = self._kv_per_token(tp, pp) * pp / m.num_layers  # one layer's, per token
        return per_layer * (full * seq + slide * capped)

    def _layer_kinds(self, pp: Arr) -> tuple[Arr, Arr]:
        """Per pipeline depth: the full-attention and sliding layers of the block with the most
        full-attention layers."""
        m = self.job.model
        pps = np.asarray(pp, dtype=float)
        full, slide = np.empty_like(pps), np.empty_like(pps)
        for depth in np.unique(pps):
            d = int(depth)
            if d not in self._kinds:  # an estimate asks up to three times per depth
                per = m.num_layers // d
                s = min(m.sliding_layers(range(b * per, (b + 1) * per)) for b in range(d))
                self._kinds[d] = (per - s, s)
            full[pps == depth], slide[pps == depth] = self._kinds[d]
        return full, slide

    def _host(self, nbytes: Arr, name: str) -> list[Row]:
        """Offload / reload over the host link; none for a CPU slot (state lives in host RAM)."""
        if self.device.name == "cpu":
            return []
        return [Row("offload", name, OpClass.HOST, np.ones_like(nbytes), np.zeros_like(nbytes),
                    nbytes, nbytes / self.device.host_bw)]

    def _compute(self, st: ModelStage, cols: Columns, tokens: Arr, seq: float, passes: Arr,
                 count: Arr, term: str) -> list[Row]:
        """GEMM and attention of ``count`` micro-batches of ``tokens`` on the last block."""
        m, dev = self.job.model, self.device
        layers = m.num_layers / cols.pp
        body = tokens * work.gemm_flops_per_token_per_rank(m, cols.tp) * layers
        head = tokens * work.head_flops_per_token(m, self._head(st)) / cols.tp
        if m.sliding_window is None:
            attn = (tokens / seq) * work.attention_flops(m, seq, seq, causal=True) * layers
        else:  # the block with the most full-attention layers is the slowest
            full, slide = self._layer_kinds(cols.pp)
            attn = (tokens / seq) * (
                work.attention_flops(m, seq, seq, causal=True) * full
                + work.attention_flops(m, seq, seq, True, m.sliding_window) * slide)
        # recomputation re-runs the layers (the engine checkpoints each one), not the head,
        # whose input the loss keeps: the head makes at most fwd + 2x bwd passes
        g1 = passes * body + np.minimum(passes, 3.0) * head
        a1 = passes * attn / cols.tp
        zero = np.zeros_like(tokens)
        return [Row(term, "GEMMs (layers + head)", OpClass.GEMM, count, g1, zero,
                    count * g1 / dev.peak_flops),
                Row(term, "attention", OpClass.ATTENTION, count, a1, zero,
                    count * a1 / dev.peak_flops)]

    def _tp(self, st: ModelStage, cols: Columns, tokens: Arr, per_layer: Arr, count: Arr,
            term: str, loss_reductions: int) -> list[Row]:
        m, w = self.job.model, self.job.workload
        intra = _intra(cols, "tp", cols.tp <= self.node_size)
        layers = m.num_layers / cols.pp
        rows = [*_collective("allreduce", cols.tp, tokens * m.hidden_size * w.param_bytes, intra,
                            self.device, term, "tp allreduce (attention out, mlp out)",
                            count * per_layer * layers)]
        if loss_reductions and self._head(st) is Head.LM:
            rows += _collective("allreduce", cols.tp, tokens * 4.0, intra, self.device, term,
                                "vocab-parallel log-softmax", count * loss_reductions)
        return rows

    def _pp(self, cols: Columns, tokens: Arr, count: Arr, term: str) -> list[Row]:
        m, w = self.job.model, self.job.workload
        n = np.where(cols.pp > 1, 2.0, 1.0)
        # the slowest hop paces the pipeline: a hop across nodes sets every hop's link
        intra = _intra(cols, "pp", cols.size <= self.node_size)
        return _collective("p2p", n, tokens * m.hidden_size * w.param_bytes, intra,
                           self.device, term, "pp activation send/recv", count)

    # ---- training --------------------------------------------------------------
    def _train_rows(self, st: ModelStage, cols: Columns) -> list[Row]:
        """A training stage's ops: they read the mean sequence length only."""
        m, w, dev = self.job.model, self.job.workload, self.device
        updates = float(w.updates_per_step)
        seq_t = float(w.seq_len_mean)
        tok_t = cols.b * seq_t
        rc = cols.recompute
        passes = np.where(rc, 4.0, 3.0)          # fwd + 2x bwd (+ fwd again when recomputing)
        ar_per_layer = np.where(rc, 6.0, 4.0)   # 2 per fwd, 2 per bwd
        rows: list[Row] = []
        for term, count in (("compute", updates * cols.a), (BUBBLE, updates * (cols.pp - 1))):
            rows += self._compute(st, cols, tok_t, seq_t, passes, count, term)
            rows += self._tp(st, cols, tok_t, ar_per_layer, count,
                             "tp_comm" if term == "compute" else term, loss_reductions=3)
            rows += self._pp(cols, tok_t, 2.0 * count, "pp_comm" if term == "compute" else term)
        rows += (_collective("allreduce", cols.dp, cols.numel * w.grad_bytes,
                                _intra(cols, "dp", cols.gpus <= self.node_size), dev, "dp_sync",
                                "gradient allreduce",
                                np.full_like(cols.tp, updates)))
        if m.tie_embeddings and self._head(st) is Head.LM:
            emb = m.vocab_size / cols.tp * m.hidden_size * w.grad_bytes
            rows += (_collective("allreduce", np.where(cols.pp > 1, 2.0, 1.0), emb,
                                    _intra(cols, "embed", cols.size <= self.node_size), dev,
                                    "dp_sync",
                                    "tied embedding grad (first<->last block)",
                                    np.full_like(cols.tp, updates)))
        adam = w.optimizer.value == "adam"
        master = w.optimizer_state_bytes_per_param() - (8 if adam else 0)
        traffic = cols.numel * (2 * w.param_bytes + w.grad_bytes + 2 * master
                                + (ADAM_MOMENT_TRAFFIC if adam else 0))
        rows.append(Row("optimizer", "optimizer step", OpClass.OPTIMIZER,
                        np.full_like(cols.tp, updates), np.zeros_like(cols.tp), traffic,
                        updates * traffic / dev.hbm_bw))
        state = cols.numel * (w.param_bytes + w.optimizer_state_bytes_per_param())
        rows += self._host(2.0 * state, "reload + offload params and optimizer state")
        return rows

    def _train_memory(self, st: ModelStage, cols: Columns) -> dict[str, Arr]:
        """A training stage's memory by term: it reads the longest sequence."""
        m, w = self.job.model, self.job.workload
        tok_m = cols.b * float(w.seq_len_max)
        rc = cols.recompute
        # activations on the fullest GPU: the first block holds min(pp, a) micro-batches in
        # flight under 1F1B; the last block holds one plus the vocab-parallel logits
        per_layer = work.layer_activation_bytes(m, w.param_bytes)
        per_tok = per_layer.per_rank(cols.tp)
        layers = m.num_layers / cols.pp
        in_flight = np.minimum(cols.pp, cols.a)
        stored = layers * tok_m * m.hidden_size * w.param_bytes   # layer inputs (recompute)
        first = np.where(rc, in_flight * stored + tok_m * per_tok,
                         in_flight * layers * tok_m * per_tok)
        last = np.where(rc, stored + tok_m * per_tok, layers * tok_m * per_tok)
        logits = (LOGIT_BYTES * tok_m * m.vocab_size / cols.tp if self._head(st) is Head.LM
                  else 0.0 * tok_m)
        memory = {
            "parameters": cols.numel * w.param_bytes,
            "gradients": cols.numel * w.grad_bytes,
            "optimizer state": cols.numel * w.optimizer_state_bytes_per_param(),
            "activations": np.maximum(first, last + logits),
            "workspace": np.full_like(cols.tp, self._workspace()),
        }
        return memory

    # ---- inference ---------------------------------------------------------------
    def _forward_rows(self, st: ModelStage, cols: Columns) -> list[Row]:
        """A forward stage's ops: they read the mean sequence length only."""
        w = self.job.workload
        seq_t = float(w.seq_len_mean)
        tok_t = cols.b * seq_t
        one = np.ones_like(cols.tp)
        rows: list[Row] = []
        for term, count in (("compute", cols.a), (BUBBLE, cols.pp - 1)):
            rows += self._compute(st, cols, tok_t, seq_t, one, count, term)
            rows += self._tp(st, cols, tok_t, 2.0 * one, count,
                             "tp_comm" if term == "compute" else term, loss_reductions=2)
            rows += self._pp(cols, tok_t, count, "pp_comm" if term == "compute" else term)
        rows += self._host(cols.numel * w.param_bytes, "reload params")
        return rows

    def _forward_memory(self, st: ModelStage, cols: Columns) -> dict[str, Arr]:
        """A forward stage's memory by term: it reads the longest sequence."""
        m, w = self.job.model, self.job.workload
        tok_m = cols.b * float(w.seq_len_max)
        ws = work.layer_forward_workspace_bytes(m, w.param_bytes)
        live = ws.per_rank(cols.tp) * tok_m
        boundary = 2.0 * np.minimum(cols.pp, cols.a) * tok_m * m.hidden_size * w.param_bytes
        logits = (LOGIT_BYTES * tok_m * m.vocab_size / cols.tp if self._head(st) is Head.LM
                  else 0.0 * tok_m)
        memory = {
            "parameters": cols.numel * w.param_bytes,
            "activations": live + boundary + logits,
            "workspace": np.full_like(cols.tp, self._workspace()),
        }
        return memory

    # ---- generation --------------------------------------------------------------
    def _generate_batch(self, st: ModelStage, cols: Columns, co: Arr, n: Arr
                        ) -> tuple[Arr, Arr, Arr, Arr]:
        """Decode batch per replica of a run of ``n`` sequences per replica: as many sequences
        as the KV cache left in memory holds."""
        m, w, dev = self.job.model, self.job.workload, self.device
        weights = cols.numel * w.param_bytes
        kv_seq = self._kv_seq(cols.tp, cols.pp, w.prompt_len + w.response_len_max)
        chunk = np.minimum(PREFILL_CHUNK_TOKENS, n * w.prompt_len)
        ws = work.layer_forward_workspace_bytes(m, w.param_bytes)
        prefill_ws = ws.per_rank(cols.tp) * chunk
        sample = 4.0 * m.vocab_size / cols.tp     # fp32 next-token logits of one sequence
        # the engine fills what is left up to the headroom with KV cache; a calibrated memory
        # scale (measured / estimated bytes) applies to everything but the co-resident state,
        # so the batch it leaves room for shrinks with it
        scale = self.memory_scale.get(st.kind, 1.0)
        free = ((HEADROOM * dev.memory_bytes - co) / scale - weights - self._workspace()
                - prefill_ws)
        batch = np.minimum(n, np.maximum(1.0, np.floor(free / (kv_seq + sample))))
        return batch, kv_seq, prefill_ws, sample

    def _streamed_numel(self, head: Head, tp: Arr, pp: Arr) -> Arr:
        """Parameters a decode iteration streams from HBM on the fullest pipeline block of a
        GPU: the last block's shard as the sharding format lays it out (its layers, with KV
        heads replicated past tp = KV heads, the final norm and the output head), without the
        input embedding, of which a decode step gathers one row per sequence (a tied model
        reads that matrix as its head)."""
        tps, pps = np.broadcast_arrays(np.asarray(tp, dtype=float), np.asarray(pp, dtype=float))
        out = np.array([_streamed(self.job.model, head, int(t), int(p))
                        for t, p in zip(tps.ravel(), pps.ravel())], dtype=float)
        return out.reshape(tps.shape)

    def _generate(self, st: ModelStage, cols: Columns, co: Arr) -> tuple[list[Row], dict[str, Arr]]:
        n = cols.b * cols.a                       # sequences per replica
        if not self.job.workflow.greedy_baseline:
            return self._generate_run(st, cols, co, n, "")
        # ReMax: the greedy baseline (one response per prompt) is a second generation run on
        # the same engine after the sampled one, as verl runs it (a second
        # ``generate_sequences`` call with do_sample=False): its own prefill and decode
        # iterations, in series. ``stage_batch`` counts both runs' sequences, so a replica's
        # ``n`` splits in the step's proportion. The runs hold their KV caches one after the
        # other: the peak is the larger run's memory, not the sum
        greedy = n * self._greedy_share()
        rows, memory = self._generate_run(st, cols, co, n - greedy, "")
        g_rows, g_memory = self._generate_run(st, cols, co, greedy, "greedy baseline: ")
        larger = sum(memory.values()) >= sum(g_memory.values())
        return rows + g_rows, {k: np.where(larger, v, g_memory[k]) for k, v in memory.items()}

    def _greedy_share(self) -> float:
        """ReMax: the share of a replica's generated sequences that are greedy baselines."""
        w = self.job.workload
        return w.prompts_per_step / (w.sequences_per_step + w.prompts_per_step)

    def _generate_run(self, st: ModelStage, cols: Columns, co: Arr, n: Arr, label: str
                      ) -> tuple[list[Row], dict[str, Arr]]:
        """One generation run of ``n`` sequences per replica: its rows (their names after
        ``label``) and its memory by term."""
        m, w, dev = self.job.model, self.job.workload, self.device
        prompt, mean, longest = w.prompt_len, w.response_len_mean, w.response_len_max
        weights = cols.numel * w.param_bytes
        batch, kv_seq, prefill_ws, sample = self._generate_batch(st, cols, co, n)
        head = self._head(st)
        zero, one = np.zeros_like(n), np.ones_like(n)

        # prefill: a forward pass over every prompt, pipelined in chunks across the pp blocks
        p_tokens = n * prompt
        chunks = np.maximum(1.0, np.ceil(p_tokens / PREFILL_CHUNK_TOKENS))
        # on the critical path: each block's share of a chunk, (chunks + pp - 1) times (the
        # pipeline fills and drains; with one chunk the blocks run in turn). A block works
        # ``chunks`` of those turns and waits the other pp - 1 (the fill's bubble, which its
        # timers file as waiting, not work)
        fill = (cols.pp - 1) / chunks
        body = (p_tokens * work.gemm_flops_per_token_per_rank(m, cols.tp) * m.num_layers
                / cols.pp)
        gemm = body + n * work.head_flops_per_token(m, head) / cols.tp
        if m.sliding_window is None:
            attn = (n * work.attention_flops(m, prompt, prompt, causal=True) * m.num_layers
                    / (cols.tp * cols.pp))
        else:  # a block's share of the chunks, on the block with the most full layers
            full, slide = self._layer_kinds(cols.pp)
            attn = n * (work.attention_flops(m, prompt, prompt, causal=True) * full
                        + work.attention_flops(m, prompt, prompt, True, m.sliding_window)
                        * slide) / cols.tp
        rows = []
        for term, g, a in (("prefill", gemm, attn), (BUBBLE, body * fill, attn * fill)):
            rows += [Row(term, "prefill GEMMs", OpClass.GEMM, one, g, zero, g / dev.peak_flops),
                     Row(term, "prefill attention", OpClass.ATTENTION, one, a, zero,
                         a / dev.peak_flops)]
        # each of those block turns all-reduces twice per layer of the block, like its GEMMs
        for term, turns in (("prefill", chunks), (BUBBLE, cols.pp - 1.0)):
            rows += self._tp(st, cols, p_tokens / chunks, 2.0 * one, turns, term, 0)
            rows += self._pp(cols, p_tokens / chunks, turns, term)

        # decode: iterations of the running batch; a token crosses all pp blocks in turn, and
        # with pp micro-batches in flight each block reads its weights once per micro-batch
        total = n * mean
        iters = np.maximum(float(longest), np.ceil(total / batch))
        active = total / iters                    # mean running sequences per iteration
        slots = np.minimum(cols.pp, np.maximum(1.0, active))
        ctx_len = prompt + mean / 2.0             # mean context a decode step attends over
        if m.sliding_window is None:
            kv_read = active * ctx_len * self._kv_per_token(cols.tp, cols.pp)
        else:  # sliding layers read at most the window
            kv_read = active * self._kv_seq(cols.tp, cols.pp, ctx_len, start=float(prompt))
        hbm = (cols.pp * self._streamed_numel(head, cols.tp, cols.pp) * w.param_bytes
               + kv_read * (cols.pp / slots))
        # each token's query attends over the mean context in every layer (heads split by tp)
        attn = work.attention_flops(m, 1.0, ctx_len, causal=False) / cols.tp
        if m.sliding_window is not None:  # per layer, as many sliding as the model has
            share = m.sliding_layers(range(m.num_layers)) / m.num_layers
            attn = attn * (1 - share) + share * work.attention_flops(
                m, 1.0, _within(m.sliding_window, ctx_len, float(prompt)), False) / cols.tp
        flops = active * ((work.gemm_flops_per_token_per_rank(m, cols.tp) + attn) * m.num_layers
                          + work.head_flops_per_token(m, head) / cols.tp) / slots
        t_hbm = iters * hbm / dev.hbm_bw
        t_gemm = iters * flops / dev.peak_flops
        hbm_bound = t_hbm / self.eff[OpClass.DECODE] >= t_gemm / self.eff[OpClass.GEMM]
        rows.append(Row("decode", "weights + KV reads per iteration", OpClass.DECODE, iters,
                        zero, hbm, np.where(hbm_bound, t_hbm, 0.0)))
        # compute-bound, decode is priced as GEMM work, but a framework times a decode
        # iteration as decode whatever bounds it (``engine.measure``)
        rows.append(Row("decode", "decode GEMMs + attention per iteration", OpClass.GEMM, iters,
                        flops, zero, np.where(hbm_bound, 0.0, t_gemm),
                        timed=(OpClass.DECODE, OpClass.DECODE)))
        # every layer all-reduces twice per token: 2 x num_layers per iteration on the path
        rows += self._tp(st, cols, active / slots, 2.0 * one, iters * cols.pp, "decode", 0)
        rows += self._pp(cols, active / slots, iters * cols.pp, "decode")

        memory = {
            "parameters": weights,
            "kv cache": batch * kv_seq,
            "activations": prefill_ws + batch * sample,
            "workspace": np.full_like(n, self._workspace()),
        }
        if label:
            rows = [r._replace(name=label + r.name) for r in rows]
        return rows, memory

    def _notes(self, st: ModelStage, c: Candidate, memory: Mapping[str, int]) -> tuple[str, ...]:
        w = self.job.workload
        if st.kind is StageKind.TRAIN:
            micro = words(c.grad_accum, "micro-batch", "micro-batches")
            notes = [(f"1F1B pipeline: {micro} + {words(c.pp - 1, 'bubble slot')} per update, "
                      f"{words(w.updates_per_step, 'update')} per step")]
            if c.recompute:
                notes.append("full activation recomputation: one extra forward per micro-batch")
            return tuple(notes)
        if st.kind is StageKind.FORWARD:
            micro = words(c.grad_accum, "micro-batch", "micro-batches")
            return (f"forward pipeline: {micro} + {words(c.pp - 1, 'bubble slot')}",)
        kv_seq = int(self._kv_seq(_f(c.tp), _f(c.pp), w.prompt_len + w.response_len_max))
        batch = memory.get("kv cache", 0) // max(1, kv_seq)
        kv = f"(KV cache {kv_seq / MiB:.1f} MiB per sequence per GPU)"
        if self.job.workflow.greedy_baseline:
            greedy = c.micro_batch * c.grad_accum * self._greedy_share()
            notes = [(f"decode batch {batch} of {c.micro_batch * c.grad_accum - greedy:g} "
                      f"sampled sequences per replica, then a second run of the {greedy:g} "
                      f"greedy baselines {kv}")]
        else:
            notes = [f"decode batch {batch} of {c.micro_batch} sequences per replica {kv}"]
        if sum(memory.values()) > HEADROOM * self.device.memory_bytes:
            notes.append("one sequence's KV cache does not fit next to the weights")
        return tuple(notes)

    def _link_notes(self, st: ModelStage, c: Candidate, links: Links) -> tuple[str, ...]:
        """One line per kind of collective that the GPU ids put across nodes (where it runs)."""
        return tuple(f"{group} spans nodes (its GPU ids): {LINK_KINDS[k][1]} priced on the "
                     f"inter-node link" for k, group in self.spanning(st, c, links))

    def spanning(self, stage: ModelStage | str, c: Candidate, links: Links
                 ) -> list[tuple[str, str]]:
        """(kind, 'TP group [8, 9]') for each kind of group ``c`` uses that ``links`` put
        across nodes."""
        return [(k, f"{LINK_KINDS[k][0]} {list(ids)}") for k, ids in links.spans().items()
                if self.link_used(stage, c, k)]

    def link_used(self, stage: ModelStage | str, c: Candidate, kind: str) -> bool:
        """Whether ``c`` runs ``kind``'s collective (a ``Links`` field) at all."""
        return self._used(self._stage(stage), c)[_KIND_INDEX[kind]]

    def _used(self, st: ModelStage, c: Candidate) -> tuple[bool, bool, bool, bool]:
        """``link_used`` of the four kinds at once, in ``LINK_KINDS``' order (tp, pp, embed,
        dp): the estimates of a plan search ask it hundreds of thousands of times."""
        train = st.kind is StageKind.TRAIN
        multi = c.layout.pp > 1
        return (c.layout.tp > 1, multi,
                train and multi and self.job.model.tie_embeddings and self._head(st) is Head.LM,
                train and c.dp > 1)


@lru_cache(maxsize=4096)
def _read_links(cluster: Cluster, layout: Layout, reps: tuple[tuple[int, ...], ...]) -> Links:
    """``CostModel.placed_links`` from what it reads: the cluster's nodes and the ids (a
    controller makes a cost model per step, and prices the same plans in each)."""
    tp, size = layout.tp, layout.size
    same = cluster.same_node

    def first(groups: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
        return next((g for g in groups if not same(g)), ())

    last = (layout.pp - 1) * tp
    return Links(
        tp=first(r[i:i + tp] for r in reps for i in range(0, size, tp)),
        pp=first((r[i], r[i + tp]) for r in reps for i in range(size - tp)),
        embed=first((r[i], r[last + i]) for r in reps for i in range(tp) if last),
        dp=first(tuple(r[i] for r in reps) for i in range(size)))


def _intra(cols: Columns, kind: str, by_size: Arr) -> Arr | bool:
    """Whether ``kind``'s groups run inside a node: as the candidates' ``Links`` place them,
    else ``by_size`` (the test the planner's node-aligned placements make true)."""
    placed = None if cols.links is None else getattr(cols.links, kind)
    return by_size if placed is None else not placed


def _collective(kind: str, n: Arr | float, nbytes: Arr | float, intra: Arr | bool, device,
                term: str, name: str, count: Arr | float) -> list[Row]:
    """``count`` ring collectives among ``n`` ranks (alpha-beta model); zero where n == 1.

    all-reduce moves 2(n-1)/n of the message per rank in 2(n-1) steps, all-gather (n-1)/n in
    n-1 steps, broadcast (pipelined) about the whole message in n-1 hops, p2p one message
    (``nereus.cost.comm``'s tables).
    Two rows: the bytes over the link bandwidth (class ``<kind>.<link>``) and the per-step
    latency (class ``latency.<link>``), so calibration learns bandwidth and latency apart:
    decode all-reduces are latency-bound, training ones bandwidth-bound.
    """
    n, nbytes, count = _f(n), _f(nbytes), _f(count)
    intra = np.asarray(intra, dtype=bool)
    shape = np.broadcast(n, nbytes, count, intra).shape
    active = n > 1
    safe = np.where(active, n, 2.0)
    zero = np.zeros(shape)
    wire = np.where(active, WIRE_FRACTION[kind](safe) * nbytes, 0.0)
    hops = np.where(active, STEPS[kind](safe), 0.0)
    bw = np.where(intra, device.intra_node_bw, device.inter_node_bw)
    lat = np.where(intra, device.intra_latency_s, device.inter_latency_s)
    if wire.shape != shape:
        wire = wire + zero
    if count.shape != shape:
        count = count + zero
    if intra.shape != shape:
        intra = intra | np.zeros(shape, dtype=bool)
    cls_intra, cls_inter = _CLASSES[kind]
    steps = count * hops
    return [Row(term, name, cls_intra, count, zero, wire, count * wire / bw, cls_inter, intra),
            Row(term, f"{name} (latency)", OpClass.LATENCY_INTRA, steps, zero, zero,
                steps * lat, OpClass.LATENCY_INTER, intra, (cls_intra, cls_inter))]


_CLASSES = {k: (comm_class(k, True), comm_class(k, False)) for k in WIRE_FRACTION}


@lru_cache(maxsize=4096)
def least_overlap(t_tp: int, t_pp: int, g_tp: int, g_pp: int, gpus: int | None = None) -> float:
    """The smallest share of the full weights that a generation GPU already holds as training
    shard, over the GPUs of a colocated sync that hold both.

    Placement lays generation's replicas over the training GPUs in order, and both index a
    replica's GPUs ``pp_rank * tp + tp_rank``, so the k-th GPU holds training position
    k mod (t_tp·t_pp) and generation position k mod (g_tp·g_pp). What the two shards share is
    the product of their layer ranges' overlap (equal contiguous blocks) and their TP slices'
    overlap. Where the layouts nest rank by rank this is 1/(max tp · max pp); where they do not
    (training tp=2 pp=2 into generation tp=4 pp=1: GPU 1 trains the second half of each
    matrix and generates its second quarter), some GPUs hold nothing they need.

    ``gpus``: only the first ``gpus`` GPUs hold both shards (min of the two stages' GPU
    counts); None: every GPU of a period of the mapping, lcm of the two sizes. The two agree
    for power-of-two sizes (the planner's), not for others: training tp=4 pp=5 on 20 GPUs
    into generation tp=4 pp=4 on 16 pairs training's last block with generation's first only
    on GPUs 16-19, which hold no generation shard.
    """
    t_size, g_size = t_tp * t_pp, g_tp * g_pp
    period = t_size * g_size // math.gcd(t_size, g_size)
    least = 1.0
    for k in range(period if gpus is None else min(gpus, period)):
        tp_t, pp_t = k % t_size % t_tp, k % t_size // t_tp
        tp_g, pp_g = k % g_size % g_tp, k % g_size // g_tp
        layers = _shared(pp_t, t_pp, pp_g, g_pp)
        cols = _shared(tp_t, t_tp, tp_g, g_tp)
        least = min(least, layers * cols)
    return least


def placed_overlap(train: Layout, train_replicas: Iterable[Sequence[int]], gen: Layout,
                   gen_replicas: Iterable[Sequence[int]]) -> float:
    """``least_overlap`` as placed: the smallest share of the full weights that a GPU holding
    both a training and a generation shard holds of both, from each GPU's position
    ``pp_rank * tp + tp_rank`` in its replica (1 where no GPU holds both). Equals
    ``least_overlap`` where generation is laid over the training GPUs in rank order; a replica
    kept in another order (``plan.near``) or a plan read from a file may pair other positions.
    """
    # the controller reprices the plan it runs at every boundary: the same placements
    return _placed_overlap(train, tuple(map(tuple, train_replicas)), gen,
                           tuple(map(tuple, gen_replicas)))


@lru_cache(maxsize=4096)
def _placed_overlap(train: Layout, train_replicas: tuple[tuple[int, ...], ...], gen: Layout,
                    gen_replicas: tuple[tuple[int, ...], ...]) -> float:
    def at(replicas: Iterable[Sequence[int]], tp: int) -> dict[int, tuple[int, int]]:
        return {x: (i % tp, i // tp) for r in replicas for i, x in enumerate(r)}

    pt, pg = at(train_replicas, train.tp), at(gen_replicas, gen.tp)
    return min((_shared(pt[x][1], train.pp, pg[x][1], gen.pp)
                * _shared(pt[x][0], train.tp, pg[x][0], gen.tp) for x in pt.keys() & pg.keys()),
               default=1.0)


def _within(window: float, seq: float, start: float | None = None) -> float:
    """Keys a sliding layer holds of a context of ``seq`` tokens: min(seq, window); with
    ``start``, the mean of min(x, window) over contexts x uniform from ``start`` to
    ``2 seq - start`` (a decode step's, while responses grow)."""
    w = float(window)
    if start is None:
        return min(seq, w)
    end = 2.0 * seq - start
    if w >= end:
        return seq
    if w <= start or end <= start:
        return min(w, seq)
    return ((w * w - start * start) / 2.0 + w * (end - w)) / (end - start)


def _shared(i: int, n: int, j: int, m: int) -> float:
    """Length of [i/n, (i+1)/n) ∩ [j/m, (j+1)/m)."""
    return max(0.0, min((i + 1) / n, (j + 1) / m) - max(i / n, j / m))


@lru_cache(maxsize=4096)
def _sync_memory(m: ModelSpec, param_bytes: int, train_scale: float, gen_scale: float,
                 train: Layout, gen: Layout, workspace: float) -> tuple[tuple[str, int], ...]:
    """``CostModel.weight_sync_memory`` from what it reads: every plan search asks it of every
    pair of layouts (``weight_sync_fits``), under a new cost model of the same job."""
    gathered = 0
    if train != gen:
        vocab = padded_vocab(m, train.tp) * m.hidden_size
        gathered = SYNC_GATHER_COPIES * max(_largest_block_tensor(m), vocab) * param_bytes
    return (("training parameters", int(max_shard_numel(m, Head.LM, train.tp, train.pp)
                                        * param_bytes * train_scale)),
            ("generation weights", int(max_shard_numel(m, Head.LM, gen.tp, gen.pp)
                                       * param_bytes * gen_scale)),
            ("gather buffer", int(gathered)),
            ("workspace", int(workspace)))


@lru_cache(maxsize=64)
def _largest_block_tensor(model: ModelSpec) -> int:
    """Elements of the largest logical tensor other than the embedding and the LM head."""
    return max(p.numel for p in logical_params(model, Head.LM) if p.name not in (EMBED, LM_HEAD))


@lru_cache(maxsize=1024)
def _streamed(model: ModelSpec, head: Head, tp: int, pp: int) -> int:
    """Elements of TP rank 0 of the last pipeline block that a decode iteration reads: all but
    the input embedding, unless that matrix is also the LM head (tied, on the same block)."""
    shards = shard_plan(model, head, tp, pp, 0, pp - 1)
    embed = sum(s.numel for s in shards if s.name == EMBED)
    rest = sum(s.numel for s in shards if s.name != EMBED)
    reads_embed = (head is Head.LM and model.tie_embeddings
                   and not any(s.name == LM_HEAD for s in shards))
    return rest + (embed if reads_embed else 0)
