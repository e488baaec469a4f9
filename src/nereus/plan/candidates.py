"""Candidate enumeration and pruning into per-stage option tables.

For each model-stage: power-of-two TP (inside a node where the pool allows) and PP (dividing the
layers), DP degrees that fit the pool (``dp_degrees``), power-of-two micro-batches up to
``MAX_MICRO_BATCH`` that divide the per-replica batch, recomputation on or off for training.
Training takes every DP degree that divides the stage's batch: its gradient accumulation must
cover the batch exactly. A stage that takes no gradient (generation, forward passes) takes
uneven shares as well -- its largest replica's ceil(batch / dp) sequences set its time -- so it
also gets, per layout, the few degrees that fill the pool or an equal part of it for each way
its phase can split the pool among its model-stages (``dp_degrees`` says which); in an
asynchronous job, generation (on GPUs of its own) and the forward passes (on the GPUs generation
leaves, before training) get one degree per largest share that fits. The search is exact over
this space, not beyond it. Candidates over 90 % of device memory are dropped; the rest are
reduced to those no other candidate beats on all of GPU count, latency, resident state and
transient memory -- the only quantities the search looks at, so the pruning loses no optimum.
For the stages the weight sync couples (its cost depends on the training and generation layouts)
candidates are compared within a layout only; in synchronous execution the sync also gets
cheaper as training spans more of the generation GPUs, so training candidates are compared
within a layout and GPU count only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from nereus.cost.candidate import Candidate, Layout
from nereus.cost.estimate import HEADROOM
from nereus.cost.model import CostModel, Evaluation, Links
from nereus.spec.cluster import MAX_DEVICES
from nereus.spec.model import ModelSpec
from nereus.spec.sharding import layout_problem
from nereus.spec.workflow import Execution, ModelStage, StageKind
from nereus.spec.workload import divisors, largest_share

# Sequences per micro-batch considered: a bound on the plan space (assumption). Larger ones add
# activation memory and pipeline-bubble time; they save only per-message latency of fewer,
# larger collectives (under 0.3 % of a stage for an 8B model on H100s, but tens of percent for
# a tiny model on CPU slots, where per-step latency dominates).
MAX_MICRO_BATCH = 16


def powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def dp_degrees(batch: int, most: int, uneven: bool, ways: int = 1,
               every: bool = False) -> list[int]:
    """DP degrees of a layout of which at most ``most`` replicas fit the pool, ascending.

    The divisors of ``batch`` up to ``most``; where the stage takes ``uneven`` shares (no
    gradient), also ``most // k`` for k = 1..``ways`` (the model-stages of the stage's phase:
    the stage may get the whole pool, or an equal part of it beside k - 1 others), so that a
    pool whose replica count divides no power of two still runs every replica it can (12
    GPUs in TP 4: dp 3, not 2). Each of those is taken down to the least degree with the same
    largest share ceil(batch / dp), which runs as fast on fewer GPUs (at batch 512, most =
    300 gives 256, a divisor; 300 // 3 = 100 gives share 6, so 86); it is kept where that
    degree does not divide ``batch``. At most ``ways`` degrees are added, so a cold replan of a
    large pool stays about as fast (every degree up to ``most`` for every such stage made one
    2.6x slower). ``every``: all of them instead, one per largest share up to ``most`` (about
    2 sqrt(batch) at most): the stages without a gradient of an asynchronous job, whose GPUs
    are what the rest of the job leaves, any number of them."""
    out = [d for d in divisors(batch) if d <= most]
    if not uneven:
        return out
    extra = set()
    for dp in range(1, most + 1) if every else (most // k for k in range(1, ways + 1)):
        if dp < 1:
            break
        dp = largest_share(batch, largest_share(batch, dp))  # the least dp with its share
        if batch % dp:
            extra.add(dp)
    return sorted(out + list(extra)) if extra else out


def enumerate_candidates(cost: CostModel, stage: ModelStage, pool_size: int,
                         max_tp: int | None = None) -> list[Candidate]:
    """Every valid candidate of ``stage`` on at most ``pool_size`` devices."""
    node = cost.node_size if max_tp is None else max_tp
    # TP groups of each degree that fit inside the pool's nodes (nodes may be partly in the
    # pool): a candidate needs dp x pp of them, unless TP is allowed to span nodes
    per_node = tuple(len(ids) for ids in cost.job.pool.by_node().values())
    wf = cost.job.workflow
    ways = len(wf.phase_stages(stage.phase))
    # asynchronous generation runs on GPUs of its own beside the rest of the job, and the
    # forward passes, then training, one after the other on the GPUs generation leaves: any
    # number of GPUs (ReMax async, the example, on 34 GPUs: 20.883 -> 18.825 s a step,
    # estimated)
    every = wf.execution is Execution.ASYNC and stage.kind is not StageKind.TRAIN
    return list(_enumerate(cost.job.model, stage, cost.stage_batch(stage), per_node, node,
                           pool_size, max_tp is None, ways, every))


# Equal candidates of different stages as one object (stages of one model share layouts and
# batches): the cost model's memos key on candidate tuples, and tuples of the same objects
# compare by identity instead of a dataclass ``__eq__`` per candidate. Only an optimisation:
# cleared past its bound.
_INTERNED: dict[Candidate, Candidate] = {}
_INTERNED_LIMIT = 200_000


def _interned(c: Candidate) -> Candidate:
    if len(_INTERNED) >= _INTERNED_LIMIT:
        _INTERNED.clear()
    return _INTERNED.setdefault(c, c)


@lru_cache(maxsize=1024)
def _enumerate(model: ModelSpec, stage: ModelStage, batch: int, per_node: tuple[int, ...],
               node: int, pool_size: int, in_nodes: bool, ways: int = 1,
               every: bool = False) -> tuple[Candidate, ...]:
    """``enumerate_candidates`` from what it reads of the job: every search enumerates each
    stage again (a controller's replans, under new efficiencies or lengths that leave the
    batch and the pool as they were). ``in_nodes``: TP groups stay inside nodes; ``ways``,
    ``every``: ``dp_degrees``'s."""
    out: list[Candidate] = []
    train = stage.kind is StageKind.TRAIN
    for tp in powers_of_two(min(node, pool_size)):
        groups = sum(n // tp for n in per_node) if in_nodes else pool_size // tp
        for pp in powers_of_two(min(model.num_layers, pool_size // tp)):
            layout = Layout(tp, pp)
            if layout_problem(model, tp, pp):
                continue
            most = min(pool_size // layout.size, groups // pp)
            for dp in dp_degrees(batch, most, not train, ways, every):
                # the largest replica's share (all of them alike where dp divides the batch)
                per_replica = largest_share(batch, dp)
                if stage.kind is StageKind.GENERATE:
                    out.append(_interned(Candidate(layout, dp, per_replica, 1)))
                    continue
                for b in powers_of_two(min(MAX_MICRO_BATCH, per_replica)):
                    if per_replica % b:
                        continue
                    a = per_replica // b
                    out.append(_interned(Candidate(layout, dp, b, a)))
                    if train:
                        out.append(_interned(Candidate(layout, dp, b, a, recompute=True)))
    return tuple(out)


@dataclass(frozen=True)
class StageOptions:
    """The surviving candidates of one stage, as parallel arrays for the search."""

    stage: ModelStage
    candidates: tuple[Candidate, ...]
    gpus: np.ndarray        # int, GPUs used
    latency: np.ndarray     # seconds per step
    resident: np.ndarray    # bytes kept while idle inside the phase
    transient: np.ndarray   # bytes needed only while running

    def __len__(self) -> int:
        return len(self.candidates)

    def subset(self, mask: np.ndarray) -> StageOptions:
        return self.take(np.flatnonzero(mask))

    def take(self, idx: list[int] | np.ndarray) -> StageOptions:
        """The options at positions ``idx``, in that order."""
        at = np.asarray(idx, dtype=np.intp)
        cands = self.candidates
        return StageOptions(self.stage, tuple(cands[i] for i in at.tolist()), self.gpus[at],
                            self.latency[at], self.resident[at], self.transient[at])

    def layouts(self) -> list[Layout]:
        return sorted({c.layout for c in self.candidates})

    def by_layout(self) -> dict[Layout, StageOptions]:
        """The options of each layout, in ``layouts()`` order, from one pass over the
        candidates (a mask per layout compares every candidate's layout once per layout)."""
        rows: dict[Layout, list[int]] = {}
        for i, c in enumerate(self.candidates):
            rows.setdefault(c.layout, []).append(i)
        return {lay: self.take(rows[lay]) for lay in sorted(rows)}


def pareto_mask(cols: list[np.ndarray], block: int = 64) -> np.ndarray:
    """Rows no other row dominates (<= in every column); of equal rows the first.

    Rows are visited in lexicographic order, so a row can only be dominated by one visited
    before it. They are taken a block at a time: a row is dropped if a kept row or an earlier
    row of its block is <= it everywhere (an earlier row that was itself dropped has a kept
    dominator, which then dominates this row too).
    """
    n = len(cols[0])
    if n <= 1:
        return np.ones(n, dtype=bool)
    m = np.stack(cols, axis=1).astype(float)
    if n <= block:  # the same rows, without the sort and the blocks' bookkeeping
        return ~_dominated(m)
    order = np.lexsort(tuple(m[:, i] for i in reversed(range(m.shape[1]))))
    # one contiguous array per column, in visiting order: comparing column by column is
    # several times faster than reducing a (kept, block, columns) array over its short axis
    cols_sorted = [np.ascontiguousarray(c) for c in m[order].T]
    kept = [np.empty(0) for _ in cols_sorted]    # the kept rows' columns
    kept_at: list[np.ndarray] = []               # their positions in visiting order
    for lo in range(0, n, block):
        rows = [c[lo:lo + block] for c in cols_sorted]
        size = len(rows[0])
        dom = _le_all(kept, rows).any(axis=0) if len(kept[0]) else np.zeros(size, dtype=bool)
        dom |= (_le_all(rows, rows) & _before(size)).any(axis=0)  # an earlier row of the block
        new = np.flatnonzero(~dom) + lo
        kept = [np.concatenate([k, c[new]]) for k, c in zip(kept, cols_sorted)]
        kept_at.append(new)
    keep = np.zeros(n, dtype=bool)
    keep[order[np.concatenate(kept_at)]] = True
    return keep


def _le_all(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """[j, i]: row j of ``a`` is <= row i of ``b`` in every column (columns as lists)."""
    le = a[0][:, None] <= b[0][None, :]
    for x, y in zip(a[1:], b[1:]):
        le &= x[:, None] <= y[None, :]
    return le


# Up to this many rows, ``pareto_mask`` compares every pair at once (n x n x columns booleans:
# under 1 MB at 256 rows and four columns); a search calls it thousands of times on a few rows.
PAIRWISE_ROWS = 256


def _dominated(m: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """Rows of ``m`` that ``pareto_mask`` drops, from all pairs at once: row i goes where a row
    j is <= it everywhere and either differs from it (then j sorts before i) or equals it and
    comes first (the sort is stable). Rows with a NaN neither dominate nor are dominated, in
    both. ``group``: rows are compared only within equal group labels."""
    n = len(m)
    le = np.ones((n, n), dtype=bool)                        # [j, i]: row j <= row i
    for col in m.T:
        le &= col[:, None] <= col[None, :]
    beats = le & (_before(n) | ~le.T)                       # _before: [j, i]: j < i
    if group is not None:
        beats &= group[:, None] == group[None, :]
    return beats.any(axis=0)


@lru_cache(maxsize=PAIRWISE_ROWS + 1)
def _before(n: int) -> np.ndarray:
    """[j, i]: j < i, for ``_dominated`` (read only)."""
    out = np.triu(np.ones((n, n), dtype=bool), k=1)
    out.flags.writeable = False
    return out


def stage_options(cost: CostModel, stage: ModelStage, pool_size: int,
                  prune: bool = True, keep: Callable[[Candidate], bool] | None = None,
                  by_layout: bool | None = None, evaluated: Evaluation | None = None,
                  links: Links | None = None) -> tuple[StageOptions, Evaluation | None]:
    """Every candidate priced in one pass, memory-pruned and (optionally) dominance-pruned.

    ``keep``: only candidates it accepts are considered (before pruning, so the pruning stays
    exact within them). ``by_layout``: compare candidates only with others of the same layout
    (TP x PP). By default this holds for the stages the weight sync couples (actor training and
    generation): their step cost also depends on the pair of layouts, so a candidate beaten by
    one of another layout can still be part of the optimum. ``evaluated``: this stage's full
    evaluation under ``cost`` from an earlier call without ``keep`` (a second planner of the
    same job filters it instead of pricing every candidate again). Returns the options and the
    full evaluation (for "fits nowhere" messages). ``links``: where every candidate's groups
    will sit once placed (``CostModel.evaluate``), where sizes do not say it.
    """
    wf = cost.job.workflow
    sync: tuple[str, ...] = wf.weight_sync() or ()
    if by_layout is None:
        by_layout = stage.name in sync
    # synchronous sync: more training GPUs leave fewer generation GPUs without a training shard
    # (``CostModel.sync_receivers``), so a training candidate with fewer GPUs does not beat one
    # with more
    by_gpus = by_layout and bool(sync) and stage.name == sync[0] and wf.execution is Execution.SYNC
    def enumerate_kept(max_tp: int | None = None) -> list[Candidate]:
        cands = enumerate_candidates(cost, stage, pool_size, max_tp)
        return cands if keep is None else [c for c in cands if keep(c)]

    chosen: np.ndarray | None = None
    if evaluated is not None:
        ev: Evaluation | None = evaluated
        chosen = np.array([keep is None or keep(c) for c in evaluated.candidates], dtype=bool)
    else:
        cands = enumerate_kept()
        ev = cost.evaluate(stage, cands, links=links) if cands else None
        fits = ev is not None and bool(np.any(ev.peak <= memory_limit(cost)))
        if not fits and cost.node_size < pool_size:
            # TP stays inside a node where it can; here it cannot, so let TP span nodes
            cands = enumerate_kept(max_tp=pool_size)
            ev = cost.evaluate(stage, cands, links=links) if cands else None
    if ev is None:
        return StageOptions(stage, (), *(np.zeros(0),) * 4), None
    opts = StageOptions(stage, ev.candidates, np.array([c.gpus for c in ev.candidates]),
                        ev.latency, ev.resident, ev.transient)
    fit = ev.peak <= memory_limit(cost)
    opts = opts.subset(fit if chosen is None else fit & chosen)
    if prune and len(opts):
        opts = opts.subset(dominance_mask(opts, by_layout, by_gpus))
    return opts, ev


def dominance_mask(opts: StageOptions, by_layout: bool = False,
                   by_gpus: bool = False) -> np.ndarray:
    """Candidates no other beats on (GPUs, latency, resident, transient); with ``by_layout``
    only candidates of the same layout are compared, with ``by_gpus`` as well only candidates
    of the same GPU count."""
    cols = [opts.gpus, opts.latency, opts.resident, opts.transient]
    if not by_layout:
        return pareto_mask(cols)
    ids: dict[Layout, int] = {}
    label = np.fromiter((ids.setdefault(c.layout, len(ids)) for c in opts.candidates),
                        dtype=np.int64, count=len(opts))
    if by_gpus:
        label = np.unique(label * (MAX_DEVICES + 1) + opts.gpus, return_inverse=True)[1]
    m = np.stack(cols, axis=1).astype(float)
    if len(opts) <= PAIRWISE_ROWS:  # every group's pareto_mask in one pass
        return ~_dominated(m, label)
    # the groups, each in index order (ties go as in pareto_mask), packed into passes of at
    # most PAIRWISE_ROWS rows; a larger group goes alone
    order = np.argsort(label, kind="stable")
    mask = np.zeros(len(opts), dtype=bool)

    def one_pass(lo: int, hi: int) -> None:
        if hi > lo:
            idx = order[lo:hi]
            mask[idx] = ~_dominated(m[idx], label[idx])

    lo = start = 0  # where the open pass and the current group start in ``order``
    for end in np.cumsum(np.bincount(label)).tolist():
        if end - start > PAIRWISE_ROWS:  # a group too large for one pass goes alone
            one_pass(lo, start)
            idx = order[start:end]
            mask[idx[pareto_mask([col[idx] for col in cols])]] = True
            lo = end
        elif end - lo > PAIRWISE_ROWS:  # the group does not fit the open pass: the next one
            one_pass(lo, start)
            lo = start
        start = end
    one_pass(lo, start)
    return mask


def memory_limit(cost: CostModel) -> float:
    return HEADROOM * cost.device.memory_bytes


def frontier(opts: StageOptions) -> StageOptions:
    """The latency-GPU-count frontier: for each GPU count, nothing with fewer GPUs is faster."""
    if not len(opts):
        return opts
    return opts.subset(pareto_mask([opts.gpus, opts.latency]))
