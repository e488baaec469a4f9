"""A Gantt chart of a transition schedule: one row per GPU, one bar per primitive on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nereus.spec.device import GiB
from nereus.transition.schedule import Schedule

COLORS = {"Split": "#4C72B0", "Merge": "#55A868", "Extend": "#DD8452", "Destroy": "#C44E52"}


def gantt(schedule: Schedule, path: str | Path, title: str | None = None) -> Path:
    """Draw the schedule to ``path`` (PNG, SVG or PDF by its suffix) and return the path.

    Bars carry the model-stage's name where they are wide enough; a second panel shows each
    GPU's peak bytes against the memory a transition may use.
    """
    import matplotlib.pyplot as plt

    fig = figure(schedule, title)
    out = Path(path)
    try:  # "tight": no label may be cut at the figure's edge, whatever its length
        fig.savefig(out, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)
    return out


def figure(schedule: Schedule, title: str | None = None) -> Any:
    """The chart as a matplotlib Figure (``gantt`` saves it; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    gpus = sorted({g for p in schedule.primitives for g in p.gpus} | set(schedule.memory))
    row = {g: k for k, g in enumerate(gpus)}
    span = max(schedule.estimated_s, 1e-9) if schedule.feasible else 1.0
    height = min(0.25 * max(len(gpus), 4) + 1.5, 40.0)
    fig, (ax, mem) = plt.subplots(1, 2, figsize=(14, height), sharey=True,
                                  gridspec_kw={"width_ratios": [5, 1]})
    for p in schedule.primitives:
        staged = p.primitive.staged  # through host memory: hatched
        for g in p.gpus:
            ax.barh(row[g], max(p.seconds, span * 1e-3), left=p.start_s, height=0.8,
                    color=COLORS[p.op], edgecolor="black", linewidth=0.3,
                    hatch="///" if staged else None)
        if p.seconds > 0.08 * span:
            g0 = min(p.gpus, key=row.__getitem__)
            ax.text(p.start_s + p.seconds / 2, row[g0], p.stage, ha="center", va="center",
                    fontsize=6, color="white", clip_on=True)
    ax.set_yticks(range(len(gpus)))
    ax.set_yticklabels([str(g) for g in gpus], fontsize=6 if len(gpus) > 32 else 8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (estimated)")
    ax.set_ylabel("GPU")
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
    mem.barh([row[g] for g in gpus], [peaks.get(g, 0) / GiB for g in gpus], color="#8172B2")
    mem.axvline(schedule.capacity_bytes / GiB, color="black", linestyle="--", linewidth=0.8)
    # two short lines: the panel is a sixth of the width, and one long line ran off the figure
    mem.set_xlabel("peak GiB (estimated)\ndashed: allowed", fontsize=9)
    mem.set_xlim(0, max(schedule.capacity_bytes, *peaks.values(), 1) / GiB * 1.05)
    fig.tight_layout()
    return fig
