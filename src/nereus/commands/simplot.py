"""The figure ``nereus simulate --plot`` draws: where each policy spends its time, step by step.

One figure, three panels over the RL step. The steps' own times differ between policies by a
few percent, while a checkpoint write or a restart costs several steps: drawn together, the
spikes hide the differences. So the step panel leaves them out, and the panel below adds
everything up -- the time each policy has lost behind the oracle so far -- where a gap that
builds up over hundreds of steps shows. The bottom panel is the context: the GPU pool and the
response length the steps ran on. Every number is simulated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from nereus.errors import InputError, first_line
from nereus.files import os_reason, save_figure
from nereus.sim.simulator import PolicyResult, SimResult, StepRow

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes

# the step panel's y axis: what each point is, and what it leaves out
STEP_Y = ("step + its transitions, s (simulated)\n"
          "no checkpoint writes, restarts or lost work")

# the pool panel's y axes
POOL_Y = "GPUs in the pool\n(simulated)"
LENGTH_Y = "mean response length,\ntokens (simulated)"

X_LABEL = "RL step (simulated run)"

# the pool panel's mark of a pause before a step
PAUSE_LABEL = "paused before the step: no GPU a plan fits"

# what the gap panel adds up (its own title, small)
GAP_NOTE = ("time lost so far, all that mean step s counts: the step, transitions, restarts, "
            "lost work and checkpoint writes (pauses excepted); x restart")

# gaps at least this long are drawn in hours, shorter ones in minutes
HOURS_FROM_S = 5 * 3600.0


@dataclass(frozen=True)
class Style:
    color: str
    line: str  # matplotlib linestyle
    width: float


# fixed per policy, so a run of some of them draws each as a run of all of them does; the
# oracle (the reference the gaps are measured against) dashed
STYLES = {"static": Style("C0", "-", 1.0), "static_verl": Style("C0", ":", 1.0),
          "replan_always": Style("C1", "-.", 0.9),
          "nereus": Style("C2", "-", 1.0), "oracle": Style("0.15", "--", 0.9)}


def style(name: str) -> Style:
    return STYLES.get(name, Style("C4", "-", 1.0))


def step_s(row: StepRow) -> float:
    """The step panel's point: the step and the transitions before it, without the restarts,
    lost work and checkpoint write that ``StepRow.busy_s`` adds."""
    return row.step_s + row.transition_s


def reference(res: SimResult) -> str:
    """The policy the gaps are measured against: the oracle, or without it the policy with
    the least busy time."""
    if "oracle" in res.results:
        return "oracle"
    return min(res.results, key=lambda n: sum(r.busy_s for r in res.results[n].rows))


def cumulative_gap_s(r: PolicyResult, ref: PolicyResult) -> tuple[list[int], list[float]]:
    """Per step, the busy time (``StepRow.busy_s``: what "mean step s" counts, checkpoint
    writes, restarts and lost work included) ``r`` has spent so far minus ``ref``'s, over the
    steps both ran; the last is ``r.busy_s - ref.busy_s``."""
    theirs = {row.step: row.busy_s for row in ref.rows}
    steps: list[int] = []
    gaps: list[float] = []
    mine = other = 0.0
    for row in r.rows:
        if row.step not in theirs:
            continue
        mine += row.busy_s
        other += theirs[row.step]
        steps.append(row.step)
        gaps.append(mine - other)
    return steps, gaps


def gap_unit(gaps: list[float]) -> tuple[str, float]:
    """(unit, seconds per unit) for the gap panel: minutes, hours for a long run's gaps."""
    largest = max((abs(g) for g in gaps), default=0.0)
    return ("h", 3600.0) if largest >= HOURS_FROM_S else ("min", 60.0)


def _marks(r: PolicyResult, kind: str) -> set[int]:
    return {e.step for e in r.events if e.kind == kind}


def draw(res: SimResult, title: str, path: Path) -> None:
    """Draw ``res`` into ``path`` under ``title`` (the run as a reader names it).

    Top: each step's time without checkpoint writes, restarts and lost work (``step_s``),
    ^ on each move. Middle: the time lost behind the reference policy so far
    (``cumulative_gap_s``), x on each restart. Bottom: the pool the steps ended on and the mean
    response length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_step, ax_gap, ax_pool) = plt.subplots(
        3, 1, sharex=True, figsize=(11, 10), gridspec_kw={"height_ratios": [3.0, 2.2, 1.3]})
    try:
        _steps(ax_step, res)
        # no mathtext: a "$" in a scenario's or file's name is a dollar sign, not a formula
        ax_step.set_title(f"{title}: ^ transition, x restart (simulated)", parse_math=False)
        _gaps(ax_gap, res)
        _context(ax_pool, next(iter(res.results.values())))
        ax_pool.set_xlabel(X_LABEL)
        fig.align_ylabels([ax_step, ax_gap, ax_pool])
        fig.tight_layout()
        try:
            save_figure(fig, path, dpi=120)
        except OSError as e:
            raise InputError("--plot", f"cannot write {path}: {os_reason(e)}") from None
        except ValueError as e:  # matplotlib's own (text it cannot lay out): one line
            raise InputError("--plot", f"cannot draw {path}: {first_line(e)}") from None
    finally:
        plt.close(fig)


def _steps(ax: Axes, res: SimResult) -> None:
    """Each policy's ``step_s`` per step, ^ on the steps a move came before."""
    from matplotlib.ticker import FuncFormatter

    for name, r in res.results.items():
        st = style(name)
        steps = [row.step for row in r.rows]
        ys = [step_s(row) for row in r.rows]
        ax.plot(steps, ys, lw=st.width, ls=st.line, color=st.color, label=name)
        by_step = dict(zip(steps, ys))
        mx = sorted(k for k in _marks(r, "move") if k in by_step)
        ax.scatter(mx, [by_step[k] for k in mx], marker="^", s=12, color=st.color,
                   zorder=3, linewidths=0)
    ax.set_yscale("log")  # 20 s to minutes a step: log keeps the short steps apart
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: minor_label(v, ax.get_ylim())))
    ax.set_ylabel(STEP_Y)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=9)


def minor_label(v: float, ylim: tuple[float, float]) -> str:
    """A log axis's minor tick label: every tick where the axis spans at most a decade (13 to
    45 s had one label, 20), else those of 2 and 5 times a power of ten."""
    lo, hi = sorted(ylim)
    text = f"{v:g}"
    return text if lo > 0 and hi / lo <= 10 or text[0] in "25" else ""


def _gaps(ax: Axes, res: SimResult) -> None:
    """Each policy's ``cumulative_gap_s`` behind the reference, x on the steps a restart came
    before; the legend gives each gap at the end."""
    ref_name = reference(res)
    ref = res.results[ref_name]
    gaps = {n: cumulative_gap_s(r, ref) for n, r in res.results.items()}
    unit, scale = gap_unit([g for _, gs in gaps.values() for g in gs])
    for name, r in res.results.items():
        st = style(name)
        steps, gs = gaps[name]
        last = gs[-1] / scale if gs else 0.0
        tag = "the reference" if name == ref_name else f"{last:+,.1f} {unit} at the end"
        ax.plot(steps, [g / scale for g in gs], lw=st.width + 0.3, ls=st.line,
                color=st.color, label=f"{name} ({tag})")
        by_step = dict(zip(steps, gs))
        rx = sorted(k for k in _marks(r, "restart") if k in by_step)
        ax.scatter(rx, [by_step[k] / scale for k in rx], marker="x", s=26, color=st.color,
                   zorder=3, linewidths=1.2)
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_ylabel(f"time behind {ref_name} so far,\n{unit} (simulated)")
    ax.set_title(GAP_NOTE, loc="left", fontsize=8.5, color="0.3")
    ax.grid(True, alpha=0.25)
    ax.legend(loc="upper left", fontsize=9)


def _context(ax: Axes, r: PolicyResult) -> None:
    """The pool each step ended on (the same for every policy: events meet them at the same
    progress) as a step line, the mean response length on a twin axis."""
    steps = [row.step for row in r.rows]
    pool = [row.pool_gpus for row in r.rows]
    ax.step(steps, pool, where="post", color="0.25", lw=1.0, label="GPUs in the pool")
    ax.set_ylabel(POOL_Y)
    ax.set_ylim(0, max(pool, default=1) * 1.15 + 0.5)
    ax.grid(True, alpha=0.25)
    twin = ax.twinx()
    twin.plot(steps, [row.response_len_mean for row in r.rows], color="C4", lw=0.9,
              alpha=0.8, label="mean response length")
    twin.set_ylabel(LENGTH_Y, color="C4")
    twin.tick_params(axis="y", colors="C4")
    # below the pool's line where it is full: the two stay apart
    twin.set_ylim(0, max((row.response_len_mean for row in r.rows), default=1.0) * 1.5)
    handles: list[Artist] = [*ax.get_lines(), *twin.get_lines()]
    # a pause (no GPU, or too few for any plan) is not in the pool a step ended on: a tick
    # on the axis before each step that waited
    paused = [row.step for row in r.rows if row.paused_s > 0]
    if paused:
        handles.append(ax.scatter(paused, [0.0] * len(paused), marker="|", s=300, color="C3",
                                  linewidths=1.5, zorder=3, clip_on=False, label=PAUSE_LABEL))
    # matplotlib stores a label as str(label) (its stubs say object)
    # above the panel, in one row: inside, wherever it sat, it hid the length line or the
    # pause ticks of some run
    ax.legend(handles, [cast(str, h.get_label()) for h in handles], loc="lower left",
              bbox_to_anchor=(0.0, 1.0), ncol=len(handles), fontsize=9, frameon=False,
              borderaxespad=0.2, handlelength=1.5, columnspacing=1.2)
