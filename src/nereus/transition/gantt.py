"""A Gantt chart of a transition schedule: one row per GPU, one bar per primitive on it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nereus.files import save_figure
from nereus.spec.device import GiB
from nereus.transition.schedule import Schedule

COLORS = {"Split": "#4C72B0", "Merge": "#55A868", "Extend": "#DD8452", "Destroy": "#C44E52"}
MAX_HEIGHT_IN = 40.0  # taller than this, a PNG at 120 dpi is too big to open comfortably
BAR_GID, STAGED_GID, MEMORY_GID = "primitives", "primitives staged", "peak memory"
SAME = "no primitives: the plans are the same"


def gantt(schedule: Schedule, path: str | Path, title: str | None = None) -> Path:
    """Draw the schedule to ``path`` (PNG, SVG or PDF by its suffix) and return the path.

    Bars carry the model-stage's name where they are wide enough; a second panel shows each
    GPU's peak bytes against the memory a transition may use.
    """
    import matplotlib.pyplot as plt

    fig = figure(schedule, title)
    try:  # "tight": no label may be cut at the figure's edge, whatever its length
        return save_figure(fig, path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def _bars(x0: Sequence[float], width: Sequence[float], rows: Sequence[int], **kw: Any) -> Any:
    """Horizontal bars 0.8 rows tall as one collection: one artist per bar (``barh``) took
    seconds to draw at 256 GPUs."""
    from matplotlib.collections import PolyCollection

    verts = [((x, r - 0.4), (x, r + 0.4), (x + w, r + 0.4), (x + w, r - 0.4))
             for x, w, r in zip(x0, width, rows)]
    return PolyCollection(verts, closed=True, **kw)


def _label_step(rows: int, row_pt: float, font: float) -> int:
    """Label every k-th GPU (k a power of two, so labels fall on node boundaries): every row
    is labelled only while the labels do not overlap."""
    k = 1
    while k < rows and k * row_pt < 1.25 * font:
        k *= 2
    return k


def figure(schedule: Schedule, title: str | None = None) -> Any:
    """The chart as a matplotlib Figure (``gantt`` saves it; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    gpus = sorted({g for p in schedule.primitives for g in p.gpus} | set(schedule.memory))
    row = {g: k for k, g in enumerate(gpus)}
    n = max(len(gpus), 1)
    moves = bool(schedule.primitives)
    span = max(schedule.estimated_s, 1e-9) if schedule.feasible and moves else 1.0
    height = min(0.25 * max(n, 4) + 1.5, MAX_HEIGHT_IN)
    row_pt = (height - 1.5) * 72 / max(n, 4)  # a row's height in points, about
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(14, height),
                                  gridspec_kw={"width_ratios": [5, 1]})
    edge = 0.3 if row_pt >= 4 else 0.1  # on thin rows, edges would hide the colours
    for staged in (False, True):  # a collection has one hatch: staged bars get their own
        ps = [p for p in schedule.primitives if bool(p.primitive.staged) == staged]
        if not ps:
            continue
        pairs = [(p, g) for p in ps for g in p.gpus]
        ax.add_collection(_bars([p.start_s for p, _ in pairs],
                                [max(p.seconds, span * 1e-3) for p, _ in pairs],
                                [row[g] for _, g in pairs],
                                facecolors=[COLORS[p.op] for p, _ in pairs],
                                edgecolors="black", linewidths=edge,
                                hatch="///" if staged else None,
                                gid=STAGED_GID if staged else BAR_GID), autolim=False)
    for p in schedule.primitives:
        if p.seconds <= 0.08 * span:
            continue
        rs = sorted(row[g] for g in p.gpus)
        if row_pt >= 7:  # a name fits a row: on the primitive's first GPU
            y: float = rs[0]
        elif rs[-1] - rs[0] + 1 == len(rs) and len(rs) * row_pt >= 7:  # its block of rows
            y = (rs[0] + rs[-1]) / 2
        else:
            continue
        ax.text(p.start_s + p.seconds / 2, y, p.stage, ha="center", va="center",
                fontsize=6, color="white", clip_on=True)
    if not moves:  # an empty chart read as a drawing failure, its time axis 0 to 1e-9 s
        what = SAME if not schedule.changed else "no primitives: nothing to move"
        ax.text(0.5, 0.5, what if schedule.feasible else "infeasible: no memory-safe order",
                transform=ax.transAxes, ha="center", va="center", fontsize=12)
    font = 6 if len(gpus) > 32 else 8
    step = _label_step(len(gpus), row_pt, font)
    ax.set_yticks(range(0, len(gpus), step))
    ax.set_yticklabels([str(g) for g in gpus[::step]], fontsize=font)
    ax.set_ylim(n - 0.5, -0.5)  # GPU 0 on top, no empty rows above or below
    ax.set_xlabel("seconds (estimated)")
    ax.set_ylabel("GPU" if step == 1 else f"GPU (one row in {step} labelled)")
    ax.set_xlim(0, span * 1.02)
    # above the chart, right of the title: below it, a short chart (few GPUs) put the legend
    # over the axis label
    handles = [Patch(color=c, label=op) for op, c in COLORS.items()]
    if any(p.primitive.staged for p in schedule.primitives):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///",
                             label="staged via host"))
    ax.legend(handles=handles,
              loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles), fontsize=8,
              frameon=False, borderaxespad=0.2)
    status = f"L_tran = {schedule.estimated_s:.3f} s (estimated)" if schedule.feasible else \
        "infeasible"
    ax.set_title(title or f"transition schedule, {status}", loc="left")
    peaks = schedule.peak_bytes()
    mem.add_collection(_bars([0.0] * len(gpus), [peaks.get(g, 0) / GiB for g in gpus],
                             range(len(gpus)), facecolors="#8172B2", edgecolors="none",
                             gid=MEMORY_GID), autolim=False)
    # rows as the chart's, without a shared y axis: its hidden copy of every GPU's tick cost
    # a third of the drawing time at 256 GPUs
    mem.set_ylim(n - 0.5, -0.5)
    mem.set_yticks([])
    mem.axvline(schedule.capacity_bytes / GiB, color="black", linestyle="--", linewidth=0.8)
    # two short lines: the panel is a sixth of the width, and one long line ran off the figure
    mem.set_xlabel("peak GiB (estimated)\ndashed: allowed", fontsize=9)
    mem.set_xlim(0, max(schedule.capacity_bytes, *peaks.values(), 1) / GiB * 1.05)
    fig.tight_layout()
    return fig
