"""Traces that drive the simulator: response lengths per step, the GPU pool over time, and
efficiency drift. Each has a seeded generator and a CSV format a user can supply.

CSV formats (a header row naming exactly these columns, in any order, then one row per entry
with a field for each; an unknown, unnamed, doubled or missing column and a row with a field too
many or too few are errors):
- lengths: ``step,response_len_mean,response_len_max`` -- one row per RL step, steps 0..n-1;
- availability: ``time_s,gpus`` -- the pool from ``time_s`` on; ``gpus`` is a count (the first
  that many device ids of the cluster) or device ids separated by spaces, ranges allowed
  (``0-7 12 13``); 0 or an empty field means no GPU (the job pauses);
- drift: ``start_step,end_step,op_class,factor`` -- from ``start_step`` up to (not including)
  ``end_step`` the op class achieves ``factor`` times its usual efficiency; a period starts
  inside the scenario's run (one past it would never run), and one that ends past it is cut.

The real spot trace (``nereus/data/spot-traces``) counts single-GPU instances; it gives counts,
not identities, so ``from_counts`` maps n instances to device ids 0..n-1: the instances acquired
last are the ones reclaimed first (an assumption; AWS does not say which instance goes).
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from nereus.cost.efficiency import Efficiencies, peak_bound
from nereus.cost.ops import OpClass
from nereus.errors import InputError, count
from nereus.files import read_json, read_text

T_ = TypeVar("T_")

SPOT_TRACE = "aws-2023-08-27-us-west-2a-v100-16node.json"
MAX_TOKENS = 1 << 20  # longest response (tokens) a trace may give: far past what RL generates
# Smallest factor a drift may scale an efficiency by (alone or with overlapping periods): an op
# class 100x slower than usual is past any slowdown short of a failure, and smaller factors
# only make absurd times.
MIN_DRIFT_FACTOR = 0.01
# Most devices an availability trace may name (a count, or ids 0..MAX_DEVICES-1): far past any
# cluster one job runs on, and small enough that a pool of them fits in memory.
MAX_DEVICES = 1_000_000
# Shortest block of whole-node churn (hours): its changes 6 minutes apart at the closest, about
# a restart each; shorter blocks only make every step a restart.
MIN_CHURN_HOURS = 0.1
MAX_CHURN_CHANGES = 1000     # changes per block: 20 blocks of them are generated


# ------------------------------------------------------------------ response lengths
@dataclass(frozen=True)
class LengthTrace:
    """Mean and longest response length (tokens) of each RL step."""

    mean: tuple[float, ...]
    longest: tuple[int, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.mean or len(self.mean) != len(self.longest):
            raise InputError("lengths", "needs one mean and one longest length per step")
        for k, (m, x) in enumerate(zip(self.mean, self.longest)):
            if not (m >= 1 and x >= m):
                raise InputError(f"lengths.step {k}",
                                 f"mean {m} and longest {x}: need 1 <= mean <= longest")

    def __len__(self) -> int:
        return len(self.mean)

    def at(self, step: int) -> tuple[float, int]:
        k = min(step, len(self.mean) - 1)
        return self.mean[k], self.longest[k]

    def head(self, steps: int) -> LengthTrace:
        """The first ``steps`` steps (the whole trace when it is not longer)."""
        if steps < 1:
            raise InputError("steps", f"must be >= 1, got {steps}")
        if steps >= len(self.mean):
            return self
        return LengthTrace(self.mean[:steps], self.longest[:steps],
                           f"{self.source}; its first {count(steps, 'step')}")


def growth(steps: int = 1000, start: float = 500.0, end: float = 8000.0, noise: float = 0.05,
           max_ratio: float = 1.5, seed: int = 0) -> LengthTrace:
    """Linear growth from ``start`` to ``end`` tokens with multiplicative step-to-step noise."""
    if steps < 1:
        raise InputError("steps", f"must be >= 1, got {steps}")
    if not all(math.isfinite(v) for v in (start, end, noise, max_ratio)):
        raise InputError("lengths", "start, end, noise and max_ratio must be finite numbers")
    rng = np.random.default_rng(seed)
    trend = np.linspace(start, end, steps)
    with np.errstate(over="ignore"):
        mean = np.maximum(1.0, trend * np.exp(rng.normal(0.0, noise, steps)))
        longest = np.ceil(mean * max_ratio * np.exp(np.abs(rng.normal(0.0, noise, steps))))
    if not np.all(np.isfinite(longest)):
        raise InputError("lengths", "the longest response overflows", "a lower end, noise "
                         "or max_ratio")
    return LengthTrace(tuple(float(round(m, 1)) for m in mean), tuple(int(x) for x in longest),
                       f"generated: linear growth {start:g}->{end:g} tokens over "
                       f"{count(steps, 'step')}, "
                       f"noise {noise:g}, longest/mean {max_ratio:g}, seed {seed}")


def stationary(steps: int = 1000, length: float = 2000.0, noise: float = 0.05,
               max_ratio: float = 1.5, seed: int = 0) -> LengthTrace:
    """A constant length with step-to-step noise only."""
    t = growth(steps, length, length, noise, max_ratio, seed)
    return LengthTrace(t.mean, t.longest, f"generated: stationary {length:g} tokens, noise "
                       f"{noise:g}, longest/mean {max_ratio:g}, seed {seed}")


def save_lengths(trace: LengthTrace, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "response_len_mean", "response_len_max"])
        for k, (m, x) in enumerate(zip(trace.mean, trace.longest)):
            w.writerow([k, m, x])


def _names_its_file(load: Callable[..., T_]) -> Callable[..., T_]:
    """A loader whose bad-input errors say which file they came from (``lengths (l.csv) row
    3: ...``) where the message does not already."""

    @functools.wraps(load)
    def wrapped(path: str | Path, *args: Any, **kwargs: Any) -> T_:
        try:
            return load(path, *args, **kwargs)
        except InputError as e:
            shown = str(path)  # as given: two folders' lengths.csv are told apart
            if shown in e.problem:  # the message names the file already
                raise
            head, _, rest = e.field.partition(" ")
            field = f"{head} ({shown}) {rest}" if rest else f"{head} ({shown})"
            raise InputError(field, e.problem, e.allowed) from None

    return wrapped


@_names_its_file
def load_lengths(path: str | Path, fits: Callable[[int, str], None] | None = None
                 ) -> LengthTrace:
    """The trace in a lengths CSV; ``fits(longest, field)``: raises an InputError when a row's
    longest response (tokens, rounded up) is too long for the job (its context window)."""
    rows = _read_csv(path, ["step", "response_len_mean", "response_len_max"], "lengths")
    mean, longest = [], []
    in_order = "the rows number the steps 0, 1, 2, ... in order, one row each"
    for i, (line, r) in enumerate(rows):
        try:
            step = int(_plain(r["step"], _INTEGER))
        except (TypeError, ValueError):
            raise InputError(f"lengths row {line}.step", f"{r['step']!r} in {path} "
                             "is not an integer",
                             f"an integer, step {i} on this row; {in_order}") from None
        tokens = "a finite number of tokens >= 1"
        m = _finite(r, "response_len_mean", "lengths", line, path, tokens)
        x = _finite(r, "response_len_max", "lengths", line, path, tokens)
        if step > i:
            missing = f"step {i}" if step == i + 1 else f"steps {i}..{step - 1}"
            raise InputError(f"lengths row {line}.step", f"step {step} where step {i} is "
                             f"expected: {missing} missing",
                             f"step {i} on this row; {in_order}")
        if step < 0:
            raise InputError(f"lengths row {line}.step", f"step {step} is negative",
                             f"step {i} on this row; {in_order}")
        if step < i:
            raise InputError(f"lengths row {line}.step", f"step {step} after step {i - 1}: "
                             f"{'a repeated' if step == i - 1 else 'an out-of-order'} step",
                             f"step {i} on this row; {in_order}")
        if x > MAX_TOKENS:
            raise InputError(f"lengths row {line}.response_len_max", f"{x:g} is above "
                             f"{MAX_TOKENS}", f"up to {MAX_TOKENS}")
        if not 1 <= m <= x:
            raise InputError(f"lengths row {line}", f"response_len_mean {m:g} and "
                             f"response_len_max {x:g}", "1 <= mean <= max")
        if fits is not None:
            fits(math.ceil(x), f"lengths row {line}.response_len_max")
        mean.append(m)
        longest.append(math.ceil(x))  # a token count: a fractional max rounds up, never down
    if not mean:
        raise InputError("lengths", f"{path} has no rows",
                         "a header, then one row per step")
    return LengthTrace(tuple(mean), tuple(longest), f"file {path}")


# ------------------------------------------------------------------ GPU availability
@dataclass(frozen=True)
class Availability:
    """The pool (device ids) from each time on; ``times[0]`` is 0."""

    times: tuple[float, ...]
    pools: tuple[tuple[int, ...], ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.pools) or self.times[0] != 0:
            raise InputError("availability", "needs pools from time 0 on, one per time")
        if not all(math.isfinite(t) for t in self.times):
            raise InputError("availability.time_s", "times must be finite numbers")
        if any(b <= a for a, b in zip(self.times, self.times[1:])):
            raise InputError("availability.time_s", "times must increase")

    def _index(self, t: float) -> int:
        return max(0, bisect.bisect_right(self.times, t) - 1)

    def at(self, t: float) -> tuple[int, ...]:
        return self.pools[self._index(t)]

    def changes(self) -> int:
        return sum(1 for a, b in zip(self.pools, self.pools[1:]) if a != b)

    def next_change(self, t: float) -> float | None:
        """The next time after ``t`` when the pool differs from the pool at ``t``."""
        i = self._index(t)
        cur = self.pools[i]
        for j in range(i + 1, len(self.times)):
            if self.pools[j] != cur:
                return self.times[j]
        return None

    def ids(self) -> set[int]:
        return {g for p in self.pools for g in p}


def _compress(times: Sequence[float], pools: Sequence[tuple[int, ...]], source: str
              ) -> Availability:
    t_out, p_out = [float(times[0])], [tuple(sorted(pools[0]))]
    for t, p in zip(times[1:], pools[1:]):
        p = tuple(sorted(p))
        if p != p_out[-1]:
            t_out.append(float(t))
            p_out.append(p)
    return Availability(tuple(t_out), tuple(p_out), source)


def constant(ids: Iterable[int]) -> Availability:
    return Availability((0.0,), (tuple(sorted(ids)),), "constant pool")


def from_counts(counts: Sequence[int], tick_s: float, source: str = "") -> Availability:
    """n available instances at a tick -> device ids 0..n-1 (count-only traces)."""
    if tick_s <= 0:
        raise InputError("availability.tick_s", f"got {tick_s:g}", "seconds > 0")
    pools = [tuple(range(int(n))) for n in counts]
    return _compress([i * tick_s for i in range(len(counts))], pools, source)


def spot_counts(name: str = SPOT_TRACE) -> tuple[list[int], float]:
    """Instance counts and tick length of a spot trace shipped with the package."""
    # one part a call: Traversable.joinpath takes one on Python 3.10
    ref = resources.files("nereus").joinpath("data").joinpath("spot-traces").joinpath(name)
    if not ref.is_file():
        raise InputError("availability.spot", f"no spot trace {name!r}", [SPOT_TRACE])
    data = json.loads(ref.read_text())
    return [int(n) for n in data["data"]], float(data["metadata"]["gap_seconds"])


SPOT_FORMAT = '{"metadata": {"gap_seconds": s}, "data": [n, n, ...]}'


def read_spot_trace(path: str | Path, field: str = "availability.spot.file"
                    ) -> tuple[list[int], float]:
    """Instance counts and tick length of a spot trace a user supplies, in the format of the
    one shipped (``SPOT_FORMAT``: skypilot-org/spot-traces' files)."""
    data = read_json(path, field)
    shown = str(path)
    layout = f"a JSON object {SPOT_FORMAT}, as skypilot-org/spot-traces writes its files"
    if not isinstance(data, dict):
        raise InputError(field, f"{shown} holds {_json_kind(data)}, not an object with "
                         "metadata and data", layout)
    meta = data.get("metadata", _MISSING)
    if not isinstance(meta, dict):
        raise InputError(f"{field}.metadata", f"{shown}: metadata {_json_value(meta)}, not an "
                         "object with gap_seconds", layout)
    gap = meta.get("gap_seconds", _MISSING)
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) \
            or gap <= 0:
        raise InputError(f"{field}.metadata.gap_seconds", f"{shown}: metadata.gap_seconds "
                         f"{_json_value(gap)}, not a tick length",
                         f"a number of seconds > 0, in {SPOT_FORMAT}")
    counts = data.get("data", _MISSING)
    if not isinstance(counts, list) or not counts:
        what = "is an empty list" if counts == [] else _json_value(counts)
        raise InputError(f"{field}.data", f"{shown}: data {what}, not a list of instance counts",
                         f"a non-empty list of integers 0..{MAX_DEVICES:,}, in {SPOT_FORMAT}")
    for i, n in enumerate(counts):
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DEVICES:
            raise InputError(f"{field}.data.{i}", f"{shown}: data[{i}] {_json_value(n)}, "
                             "not an instance count", f"an integer 0..{MAX_DEVICES:,}")
    return counts, float(gap)


_MISSING = object()  # a key a JSON object lacks


def _json_kind(v: object) -> str:
    """What a JSON value is, in JSON's words ("a list", "null", "a string")."""
    if v is _MISSING:
        return "nothing"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    for t, word in ((dict, "an object"), (list, "a list"), (str, "a string"),
                    (int, "an integer"), (float, "a number")):
        if isinstance(v, t):
            return word
    return type(v).__name__


def _json_value(v: object) -> str:
    """A value read from a JSON file, as the file writes it ("is missing", "is null",
    "is the string \"300\"", "is 8.5", "is a list"), for an error."""
    if v is _MISSING:
        return "is missing"
    if v is None or isinstance(v, bool):
        return f"is {_json_kind(v)}"
    if isinstance(v, str):
        text = json.dumps(v)
        return f"is the string {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(v, (int, float)):
        return f"is {json.dumps(v)}"
    return f"is {_json_kind(v)}"


def spot_window(start_tick: int, name: str = SPOT_TRACE, max_gpus: int | None = None,
                path: str | Path | None = None,
                trace: tuple[Sequence[int], float] | None = None) -> Availability:
    """A spot trace from ``start_tick`` to its end (the pool holds the last value after): the
    real one shipped, or the user's file at ``path`` (``read_spot_trace``); ``trace``: its
    counts and tick length, when the caller has read them already (to choose the window).

    Counts above ``max_gpus`` are clipped to it (a job never holds more than it asked for).
    """
    if trace is None:
        trace = read_spot_trace(path) if path is not None else spot_counts(name)
    counts, tick = list(trace[0]), trace[1]
    if not 0 <= start_tick < len(counts):
        raise InputError("availability.spot.start_tick", f"{start_tick} is outside the trace",
                         f"0..{len(counts) - 1}")
    window = counts[start_tick:]
    if max_gpus is not None:
        window = [min(n, max_gpus) for n in window]
    what = f"spot trace {path}" if path is not None else \
        f"real AWS spot trace {name}"
    return from_counts(window, tick, f"{what} from tick {start_tick} ({tick:g} s ticks); n "
                       "instances -> GPU ids 0..n-1")


def busiest_window(counts: Sequence[int], ticks: int, min_running: float,
                   field: str = "availability.spot.start_tick") -> int:
    """Start tick of the ``ticks``-long window with the most changes among those that start
    with GPUs and hold GPUs in at least ``min_running`` of their ticks (earliest on ties).

    A trace shorter than ``ticks`` is one window, the whole trace (start tick 0): the window's
    length only stands for a run's, and a short file of one's own is what one means to replay
    (``spot_window`` holds its last count after it ends). ``field``: what to set instead when
    no window qualifies.
    """
    ticks = max(1, min(ticks, len(counts)))
    best, best_start = -1, 0
    for s in range(len(counts) - ticks + 1):
        seg = counts[s:s + ticks]
        if seg[0] == 0 or sum(1 for n in seg if n > 0) < min_running * ticks:
            continue
        ch = sum(1 for a, b in itertools.pairwise(seg) if a != b)
        if ch > best:
            best, best_start = ch, s
    if best < 0:
        n, share = len(counts), f"{min_running:.0%}"
        problem = (f"the {n}-tick trace does not start with GPUs and hold them in {share} of "
                   "its ticks" if ticks == n else f"no {ticks}-tick window of the {n}-tick "
                   f"trace starts with GPUs and holds them in {share} of its ticks")
        raise InputError(field, f"{problem}, so no start can be chosen for you",
                         f"a start tick 0..{n - 1} of your choice")
    return best_start


def node_churn(num_nodes: int, devices_per_node: int, hours: float = 10.0, changes: int = 12,
               min_nodes: int = 1, seed: int = 0) -> Availability:
    """Whole nodes leave and come back: exactly ``changes`` events in every ``hours``.

    Event times are uniform within each ``hours`` block (so every block has its count, as the
    AWS analysis the paper cites counts changes per 10 hours); each event takes away a random
    held node or, when fewer than ``num_nodes`` are held, gives one back, with equal odds
    (never below ``min_nodes``). Blocks repeat long enough for any run.
    """
    if num_nodes < 2:  # before min_nodes: with one node no min_nodes is allowed (1..0)
        raise InputError("availability.churn", f"whole-node churn needs at least 2 nodes; the "
                         f"job has {count(num_nodes, 'node')} of {count(devices_per_node, 'GPU')}",
                         f"job.gpus a multiple of {devices_per_node} from "
                         f"{2 * devices_per_node} (2 or more whole nodes), or another "
                         "availability trace")
    if not 1 <= min_nodes <= num_nodes:
        raise InputError("availability.churn.min_nodes",
                         f"{min_nodes} is not allowed on {count(num_nodes, 'node')}",
                         f"1..{max(1, num_nodes - 1)}")
    if not (math.isfinite(hours) and hours >= MIN_CHURN_HOURS):
        raise InputError("availability.churn.hours", f"got {hours:g}",
                         f"a finite number >= {MIN_CHURN_HOURS:g}")
    if not 1 <= changes <= MAX_CHURN_CHANGES:
        raise InputError("availability.churn.changes", f"got {changes}",
                         f"1..{MAX_CHURN_CHANGES}")
    if min_nodes == num_nodes:
        raise InputError("availability.churn.min_nodes", "leaves no node to take away",
                         f"1..{num_nodes - 1}")
    rng = np.random.default_rng(seed)
    block = hours * 3600.0
    held = list(range(num_nodes))
    times, pools = [0.0], [_node_ids(held, devices_per_node)]
    for b in range(20):
        for t in np.sort(rng.uniform(b * block, (b + 1) * block, changes)):
            can_lose = len(held) > min_nodes
            can_gain = len(held) < num_nodes
            if can_lose and (not can_gain or rng.random() < 0.5):
                held.remove(int(rng.choice(held)))
            else:
                held.append(int(rng.choice([n for n in range(num_nodes) if n not in held])))
            times.append(float(t))
            pools.append(_node_ids(held, devices_per_node))
    return _compress(times, pools, f"generated: whole-node churn of {num_nodes} x "
                     f"{count(devices_per_node, 'GPU')}, {count(changes, 'change')} every "
                     f"{hours:g} h, seed {seed}")


def _node_ids(nodes: Iterable[int], per: int) -> tuple[int, ...]:
    return tuple(sorted(g for n in nodes for g in range(n * per, (n + 1) * per)))


def parse_ids(text: str, field: str = "availability.gpus", max_gpus: int | None = None,
              keep: Sequence[int] | None = None) -> tuple[int, ...]:
    """``"16"`` -> 0..15; ``"0-7 12 13"`` -> those ids; ``""`` or ``"0"`` -> none.

    Counts and ids stay below ``max_gpus`` (the cluster's size, when known) and never past
    MAX_DEVICES. ``keep``: the only ids wanted (a job's GPUs); the others are dropped as the
    field is read, so a range costs what its overlap with ``keep`` holds, not its length.
    """
    runs = _id_runs(text, field, max_gpus)
    if keep is None:
        return tuple(g for lo, hi in runs for g in range(lo, hi + 1))
    return _clip(runs, sorted(keep))


def _id_runs(text: str, field: str, max_gpus: int | None = None) -> tuple[tuple[int, int], ...]:
    """The ids a pool field lists, as sorted runs ``(first, last)`` with a gap between each two;
    the checks of ``parse_ids``. Work and memory follow the number of ranges written, never
    the ids they span (a row ``0-999999`` is one run, not a million ids)."""
    cap = MAX_DEVICES if max_gpus is None else min(max_gpus, MAX_DEVICES)
    allowed = (f"a count 0..{cap} or device ids 0..{cap - 1}, e.g. 16 or 0-7 12 (at most "
               f"{MAX_DEVICES:,} devices)")
    text = text.strip()
    if not text:
        return ()
    parts = text.replace(",", " ").split()

    def num(t: str, p: str) -> int:
        # no sign, no decimal point: "-" only separates a range
        if not (t.isascii() and t.isdigit()):
            raise InputError(field, f"{p!r} is not a count or device ids", allowed)
        return int(t)

    if len(parts) == 1 and "-" not in parts[0]:
        n = num(parts[0], parts[0])
        if n > cap:
            raise InputError(field, f"count {n} is above {cap:,}", allowed)
        return ((0, n - 1),) if n else ()
    runs: list[tuple[int, int]] = []
    bad: InputError | None = None
    for p in parts:
        try:
            a, sep, b = p.partition("-")
            lo = num(a, p)
            hi = num(b, p) if sep else lo
            if hi < lo:
                raise InputError(field, f"bad range {p!r}: its end is below its start",
                                 "ranges first-last with first <= last, e.g. 0-7")
            if hi >= cap:
                raise InputError(field, f"device id {hi} is above {cap - 1:,}", allowed)
        except InputError as e:
            bad = e  # said after a repeat in the ranges before it, as it is found in order
            break
        runs.append((lo, hi))
    if _overlap(runs):
        # a repeated id is a typo for another device, as in a job's gpus: the pool would hold
        # fewer GPUs than the row lists. Name the first range (in the row's order) that
        # repeats one before it: the smallest prefix that overlaps ends with it.
        lo_m, hi_m = 2, len(runs)
        while lo_m < hi_m:
            mid = (lo_m + hi_m) // 2
            lo_m, hi_m = (lo_m, mid) if _overlap(runs[:mid]) else (mid + 1, hi_m)
        twice = _intersect(_union(runs[:lo_m - 1]), runs[lo_m - 1])
        n = sum(hi - lo + 1 for lo, hi in twice)
        raise InputError(field, f"device id{'s' if n > 1 else ''} {format_runs(twice)} "
                         "listed more than once",
                         f"distinct device ids 0..{cap - 1:,}, e.g. 0-7 12")
    if bad is not None:
        raise bad
    return _union(runs)


def _overlap(runs: Sequence[tuple[int, int]]) -> bool:
    """Whether two of ``runs`` (first, last) share an id."""
    ordered = sorted(runs)
    return any(b[0] <= a[1] for a, b in itertools.pairwise(ordered))


def _union(runs: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The ids of ``runs`` as sorted runs, touching or overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(runs):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _intersect(runs: Sequence[tuple[int, int]], run: tuple[int, int]
               ) -> tuple[tuple[int, int], ...]:
    """The parts of ``run`` that sorted, gapped ``runs`` hold."""
    lo, hi = run
    i = bisect.bisect_left([r[1] for r in runs], lo)  # the first run that ends at lo or later
    out = []
    for a, b in runs[i:]:
        if a > hi:
            break
        out.append((max(a, lo), min(b, hi)))
    return tuple(out)


def _clip(runs: Iterable[tuple[int, int]], keep: Sequence[int]) -> tuple[int, ...]:
    """The ids of sorted ``runs`` that sorted ``keep`` holds, in order."""
    out: list[int] = []
    for lo, hi in runs:
        out.extend(keep[bisect.bisect_left(keep, lo):bisect.bisect_right(keep, hi)])
    return tuple(out)


def format_runs(runs: Iterable[tuple[int, int]], most: int | None = None) -> str:
    """Sorted runs (first, last) as ``0-7,12``; past ``most`` runs, the rest as ``...``."""
    runs = list(runs)
    shown = runs if most is None else runs[:most]
    text = ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in shown)
    return text + (",..." if len(shown) < len(runs) else "")


def save_availability(av: Availability, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "gpus"])
        for t, p in zip(av.times, av.pools):
            w.writerow([f"{t:g}", " ".join(map(str, p))])


@_names_its_file
def load_availability(path: str | Path, max_gpus: int | None = None) -> Availability:
    """The trace in a CSV file; ``max_gpus``: the cluster's device count, when known (ids
    and counts must stay below it)."""
    times, rows = _pool_rows(path, max_gpus)
    return _compress(times, [tuple(g for lo, hi in r for g in range(lo, hi + 1)) for r in rows],
                     f"file {path}")


@_names_its_file
def read_availability(path: str | Path, keep: Sequence[int], max_gpus: int | None = None
                      ) -> tuple[Availability, tuple[tuple[int, int], ...]]:
    """The trace in a CSV file held to the GPUs ``keep`` (a job's), and every id its rows list
    (sorted runs first, last). Each row is cut to ``keep`` as it is read: time and memory
    follow the file's length and ``len(keep)``, never the ids it names (a row ``0-999999``
    costs what ``0-15`` does)."""
    times, rows = _pool_rows(path, max_gpus)
    mine = sorted(keep)
    return (_compress(times, [_clip(r, mine) for r in rows], f"file {path}"),
            _union([run for r in rows for run in r]))


def _pool_rows(path: str | Path, max_gpus: int | None
               ) -> tuple[list[float], list[tuple[tuple[int, int], ...]]]:
    """An availability CSV's times and each row's ids as runs (``_id_runs``), checked."""
    rows = _read_csv(path, ["time_s", "gpus"], "availability",
                     "; device ids separated by spaces, as in 0-7 12 13")
    times: list[float] = []
    pools = []
    for line, r in rows:
        t = _finite(r, "time_s", "availability", line, path,
                    "a finite number of seconds >= 0, increasing from 0 on the first row")
        if times and t <= times[-1]:
            raise InputError(f"availability row {line}.time_s", f"{t:g} in "
                             f"{path} is not after the row before's {times[-1]:g}",
                             "increasing times")
        times.append(t)
        pools.append(_id_runs(r["gpus"] or "", f"availability row {line}.gpus", max_gpus))
    if not times:
        raise InputError("availability", f"{path} has no rows",
                         "a header, then one row per change of the pool, the first at time 0")
    if times[0] != 0:
        raise InputError(f"availability row {rows[0][0]}", f"the first time is {times[0]:g}",
                         "0")
    return times, pools


# ------------------------------------------------------------------ efficiency drift
@dataclass(frozen=True)
class DriftPeriod:
    start_step: int
    end_step: int
    op_class: OpClass
    factor: float


@dataclass(frozen=True)
class DriftTrace:
    """Periods in which one op class achieves a fraction of its usual efficiency."""

    periods: tuple[DriftPeriod, ...] = ()
    source: str = "none"

    def factors_at(self, step: int) -> tuple[tuple[OpClass, float], ...]:
        out: dict[OpClass, float] = {}
        for p in self.periods:
            if p.start_step <= step < p.end_step:
                out[p.op_class] = out.get(p.op_class, 1.0) * p.factor
        return tuple(sorted(out.items(), key=lambda kv: kv[0].value))

    def apply(self, base: Efficiencies, step: int) -> Efficiencies:
        f = self.factors_at(step)
        if not f:
            return base
        return base.updated({c: base[c] * v for c, v in f})

    def check(self, hidden: Efficiencies, fld: str = "drift") -> None:
        """Every combined factor (overlapping periods multiply) stays >= MIN_DRIFT_FACTOR and
        keeps its class's efficiency at or under the device's peak."""
        steps = sorted({s for p in self.periods for s in (p.start_step, p.end_step)})
        for k in steps:
            for cls, f in self.factors_at(k):
                eff = hidden[cls] * f
                here = [p.factor for p in self.periods
                        if p.op_class is cls and p.start_step <= k < p.end_step]
                # overlapping periods: say that their factors multiply, not only the product
                what = (f"factor {f:g}" if len(here) == 1 else
                        f"{len(here)} periods overlap, so their factors "
                        f"{' x '.join(f'{x:g}' for x in here)} multiply to {f:g}")
                if f < MIN_DRIFT_FACTOR:
                    raise InputError(fld, f"{cls.value} at step {k}: {what}, below "
                                     f"{MIN_DRIFT_FACTOR:g}",
                                     f"a combined factor >= {MIN_DRIFT_FACTOR:g} (periods of one "
                                     "op class that overlap multiply their factors)")
                bound = peak_bound(cls, hidden.device)
                if eff > bound:
                    raise InputError(fld, f"{cls.value} at step {k}: efficiency {hidden[cls]:g} "
                                     f"x {what} = {eff:g}, above the {hidden.device}'s "
                                     f"peak", f"a combined factor <= {bound / hidden[cls]:g}"
                                     + ("" if len(here) == 1 else " (periods of one op class "
                                        "that overlap multiply their factors)"))

    def head(self, steps: int) -> DriftTrace:
        """The periods that start within the first ``steps`` steps, cut at ``steps``."""
        kept = tuple(replace(p, end_step=min(p.end_step, steps)) for p in self.periods
                     if p.start_step < steps)
        if kept == self.periods:
            return self
        # say what went: a period that starts past the run is more likely a mistake in the
        # file than a wish, and the table's note is where the user sees it
        late = len(self.periods) - len(kept)
        cut = sum(p.end_step > steps for p in self.periods if p.start_step < steps)
        what = [(f"{late} of {count(len(self.periods), 'period')} "
                 f"{'start' if late != 1 else 'starts'} at or after step {steps} and "
                 f"{'are' if late != 1 else 'is'} left out")] if late else []
        what += [f"{count(cut, 'period')} cut to end at step {steps}"] if cut else []
        return DriftTrace(kept, f"{self.source}; cut to its first {count(steps, 'step')}: "
                          + ", ".join(what))


def congestion(steps: int, periods: int = 3, length: tuple[int, int] = (40, 120),
               op_classes: Sequence[str] = ("allreduce.inter", "p2p.inter"),
               factor: float = 0.4, seed: int = 0) -> DriftTrace:
    """``periods`` non-overlapping stretches of congestion: the listed op classes (by default
    the inter-node network's) achieve ``factor`` of their usual efficiency for ``length``
    steps each."""
    if not 1 <= length[0] <= length[1]:
        raise InputError("drift.congestion.length", f"{list(length)}: need 1 <= shortest <= "
                         "longest")
    _check_factor(factor, "drift.congestion.factor")
    rng = np.random.default_rng(seed)
    cls = [_op_class(c, "drift.congestion.op_classes") for c in op_classes]
    # no class, or one twice (its periods would multiply its factor), is not what was meant
    if periods and not cls:
        raise InputError("drift.congestion.op_classes", "an empty list: the periods would "
                         "slow nothing", "one or more of " + ", ".join(c.value for c in OpClass))
    twice = next((c for k, c in enumerate(cls) if c in cls[:k]), None)
    if twice is not None:
        raise InputError("drift.congestion.op_classes", f"{twice.value} is listed twice: its "
                         f"factor would apply twice ({factor:g} x {factor:g})",
                         "each op class once")
    out: list[DriftPeriod] = []
    spans: list[tuple[int, int]] = []
    span = steps / (periods + 1)
    for k in range(periods):
        n = int(rng.integers(length[0], length[1] + 1))
        center = (k + 1) * span + rng.uniform(-span / 4, span / 4)
        start = max(0, int(center - n / 2))
        end = min(steps, start + n)
        spans.append((start, end))
        for c in cls:
            out.append(DriftPeriod(start, end, c, factor))
    _check_congestion_overlap(spans, steps, periods, length, factor)
    lengths = (count(length[0], "step") if length[0] == length[1]
               else f"{length[0]}-{length[1]} steps")
    return DriftTrace(tuple(out), f"generated: {count(periods, 'congestion period')} of "
                      f"{lengths}, {'+'.join(op_classes)} x{factor:g}, seed {seed}")


def _check_congestion_overlap(spans: Sequence[tuple[int, int]], steps: int, periods: int,
                              length: tuple[int, int], factor: float) -> None:
    """Generated congestion periods longer than their spacing (``steps`` / (``periods`` + 1))
    overlap, and overlapping factors multiply: refuse a product under MIN_DRIFT_FACTOR here,
    naming periods and length (the fields that made it), not a factor no one wrote."""
    if factor >= 1:
        return  # a product above the peak is DriftTrace.check's (it knows the efficiencies)
    most, at = 0, 0
    for k in sorted({a for a, _ in spans}):
        n = sum(1 for a, b in spans if a <= k < b)
        if n > most:
            most, at = n, k
    if most < 2 or factor ** most >= MIN_DRIFT_FACTOR:
        return
    ok = max(1, int(math.log(MIN_DRIFT_FACTOR) / math.log(factor) + 1e-9))
    apart = steps // (2 * (periods + 1))  # about how long periods can be and not meet
    shorter = (f"a shorter length (up to about {count(apart, 'step')} keeps "
               f"{count(periods, 'period')} apart in {count(steps, 'step')})" if apart >= 1
               else "a shorter length")
    raise InputError(
        "drift.congestion", f"periods: {periods} and length: {list(length)} overlap in "
        f"{count(steps, 'step')}: {most} congestion periods of up to "
        f"{count(length[1], 'step')} overlap at step {at}, so their factors multiply to "
        f"{factor:g}^{most} = {factor ** most:.2g}, below {MIN_DRIFT_FACTOR:g}",
        f"at most {count(ok, 'overlapping period')} at factor {factor:g}: fewer periods, "
        f"{shorter} or a larger factor")


def save_drift(trace: DriftTrace, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_step", "end_step", "op_class", "factor"])
        for p in trace.periods:
            w.writerow([p.start_step, p.end_step, p.op_class.value, p.factor])


@_names_its_file
def load_drift(path: str | Path, steps: int | None = None) -> DriftTrace:
    """The periods in a drift CSV; ``steps``: the run's, when known: a period that starts at or
    after it would never run, and the user believes it does (an error, not a note)."""
    rows = _read_csv(path, ["start_step", "end_step", "op_class", "factor"], "drift")
    out = []
    for line, r in rows:
        ends = []
        for col in ("start_step", "end_step"):
            try:
                ends.append(int(_plain(r[col], _INTEGER)))
            except (TypeError, ValueError):
                raise InputError(f"drift row {line}.{col}", f"{r[col]!r} in "
                                 f"{path} is not an integer",
                                 "a step number, 0 <= start_step < end_step") from None
        a, b = ends
        f = _finite(r, "factor", "drift", line, path, f"a finite number >= {MIN_DRIFT_FACTOR:g}")
        if not 0 <= a < b:
            raise InputError(f"drift row {line}", f"start_step {a} and end_step {b}",
                             "0 <= start_step < end_step; the period runs up to, not "
                             "including, end_step")
        if steps is not None and a >= steps:
            raise InputError(f"drift row {line}.start_step", f"{a} is past the run's last "
                             f"step {steps - 1} ({count(steps, 'step')}): the period would "
                             "never run", f"0..{steps - 1}, or a longer run")
        _check_factor(f, f"drift row {line}.factor")
        out.append(DriftPeriod(a, b, _op_class(r["op_class"], f"drift row {line}.op_class"), f))
    return DriftTrace(tuple(out), f"file {path}")


def _check_factor(factor: float, fld: str) -> None:
    if not (math.isfinite(factor) and factor >= MIN_DRIFT_FACTOR):
        raise InputError(fld, f"got {factor:g}", f"a finite number >= {MIN_DRIFT_FACTOR:g}")


# Numbers as a CSV writes them: ASCII digits, a sign, a point and an exponent; not Python's
# "5_00" or other scripts' digits, which float() and int() also take
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def _plain(text: str | None, pattern: re.Pattern[str]) -> str:
    """``text`` stripped where it is a plain number by ``pattern``; raises ValueError."""
    t = (text or "").strip()
    if not pattern.fullmatch(t):
        raise ValueError(f"not a plain number: {text!r}")
    return t


def _finite(row: dict[str, str], col: str, what: str, line: int, path: str | Path,
            allowed: str = "a finite number") -> float:
    """Column ``col`` of the row on ``line`` as a finite number (NaN would pass every
    comparison); ``allowed``: what the column takes, for the error."""
    text = row.get(col, "")
    try:
        v = float(_plain(text, _DECIMAL))
    except (TypeError, ValueError):
        v = math.nan
    if not math.isfinite(v):
        raise InputError(f"{what} row {line}.{col}", f"{text!r} in {path} is not a "
                         "finite number", allowed)
    return v


def _op_class(name: str | None, fld: str) -> OpClass:
    try:
        return OpClass(str(name).strip())
    except ValueError:
        raise InputError(fld, f"unknown op class {name!r}", [c.value for c in OpClass]) from None


def _read_csv(path: str | Path, columns: list[str], what: str, note: str = ""
              ) -> list[tuple[int, dict[str, str]]]:
    """The data rows of a trace CSV as (line number in the file, {column: text}); errors name
    a row by its line, the header being line 1. Its header names exactly ``columns``
    (in any order), each once, and every row has a field for each: a misspelt or stray column,
    or a row with a field too many or too few, is an error naming the file and the header or
    row (otherwise the column is dropped unread, or a row ``600,8,12`` reads as 8 GPUs).
    ``note``: added to what a row allows."""
    p = Path(path)
    # UTF-8 only, and without the byte-order mark Excel writes (it would glue itself to the
    # first column's name)
    reader = csv.reader(io.StringIO(read_text(p, what), newline=""))
    # blank (or whitespace-only) lines skipped, not renumbered
    lines = [(reader.line_num, r) for r in reader if r and not (len(r) == 1 and not r[0].strip())]
    if not lines:  # not "lacks column ...": there is no header to lack it
        raise InputError(what, f"{p} is empty", f"a header naming {', '.join(columns)}, "
                         "then a row per entry")
    header = [h.strip() for h in lines[0][1]]
    missing = [c for c in columns if c not in header]
    unknown = [h for h in header if h not in columns]
    lacks = f", and lacks column {missing[0]!r}" if missing else ""
    if "" in unknown:
        raise InputError(what, f"column {header.index('') + 1} of the header of {p} has "
                         f"no name{lacks}", columns)
    if unknown:
        raise InputError(what, f"{p} has an unknown column {unknown[0]!r} in its "
                         f"header{lacks}", columns)
    twice = next((h for k, h in enumerate(header) if h in header[:k]), None)
    if twice is not None:
        raise InputError(what, f"{p} names column {twice!r} twice in its header", columns)
    if missing:
        raise InputError(what, f"{p} lacks column {missing[0]!r}", columns)
    rows = []
    for line, fields in lines[1:]:
        if len(fields) != len(header):
            n = len(fields)
            raise InputError(f"{what} row {line}", f"{n} field{'s' if n != 1 else ''} in "
                             f"{p}, but its header has {len(header)} columns",
                             f"a field for each of {', '.join(header)}{note}")
        rows.append((line, {h: v.strip() for h, v in zip(header, fields)}))
    return rows
