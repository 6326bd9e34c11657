"""The batch-size schedule's plot: speedup against batch size (serve mode: concurrency level), a panel
per drafter with one line per k, no speculation at 1.0, and the schedule drawn over its drafter's panel
(the chosen k per level; the validation engine's speedups when it ran). Built like :mod:`tuner.outputs.plots`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.outputs.latency_plots import level_ticks
from tuner.outputs.plots import BASELINE_COLOR, PALETTE, new_figure, note_on

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from tuner.outputs.report.model import TrialRow
    from tuner.results.schedule_run import ScheduleRun

SCHEDULE_ARTIFACT = "speedup_vs_batch_size.png"  # on the study's parent run
MAX_PANELS = 4
SCHEDULE_COLOR = "#000000"


def drafter_curves(rows: Sequence[TrialRow]) -> dict[str, dict[int, dict[int, float]]]:
    """drafter label -> k -> level -> the best speedup among its measured trials of that k there;
    drafters in order of their best score (the first has the study's best speculative trial)."""
    from tuner.results.schedule_run import drafter_label

    curves: dict[str, dict[int, dict[int, float]]] = {}
    best: dict[str, float] = {}
    for r in rows:
        if r.spec is None or r.metrics is None or r.duplicate_of is not None or r.spec.is_baseline:
            continue
        label = drafter_label(r.spec)
        best[label] = max(best.get(label, r.metrics.score), r.metrics.score)
        per_level = curves.setdefault(label, {}).setdefault(r.spec.num_speculative_tokens or 0, {})
        for lv in r.metrics.levels:
            if lv.speedup is not None:
                per_level[lv.batch_size] = max(per_level.get(lv.batch_size, lv.speedup), lv.speedup)
    return {label: curves[label] for label in sorted(curves, key=lambda d: -best[d])}


def speedup_vs_level(rows: Sequence[TrialRow], run: ScheduleRun | None = None, mode: str = "offline") -> Figure:
    """A panel per drafter (the schedule's first, at most MAX_PANELS): speedup per level, a line per k."""
    noun = "concurrency level" if mode == "serve" else "batch size"
    curves = drafter_curves(rows)
    schedule = run.schedule if run is not None else None
    mine = _schedule_panel(rows, schedule.trial, schedule.drafter) if schedule is not None else None
    order = list(curves)
    if mine in curves:
        order = [mine] + [d for d in order if d != mine]
    order = order[:MAX_PANELS]
    panels = max(1, len(order))
    fig = new_figure(width=min(4.6 * panels + 2.0, 15.0), height=3.9)
    axes = fig.subplots(1, panels, squeeze=False, sharey=True)[0]
    if not order:
        note_on(axes[0], "no completed speculative trial")
        return fig
    levels = sorted({lv for per_k in curves.values() for pts in per_k.values() for lv in pts})
    for ax, drafter in zip(axes, order, strict=True):
        ax.axhline(1.0, color=BASELINE_COLOR, linestyle="--", linewidth=1.2, label="no speculation (1.0)")
        for i, (k, pts) in enumerate(sorted(curves[drafter].items())):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", color=PALETTE[i % len(PALETTE)], alpha=0.8, label=f"k={k}")
        if drafter == mine and run is not None:
            _draw_schedule(ax, run)
        ax.set_title(drafter, fontsize="medium")
        ax.set_xlabel(noun)
        level_ticks(ax, levels)
        ax.margins(x=0.1)  # room for the k labels beside the last level
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", loc="best")
    axes[0].set_ylabel("speedup over no speculation")
    axes[0].set_ylim(bottom=0)
    fig.suptitle(f"Speedup against {noun} per drafter (a line per k: its best trial)", fontsize="medium")
    return fig


def _schedule_panel(rows: Sequence[TrialRow], trial: int, stored: str) -> str:
    """The panel of the schedule's drafter trial, labelled as the panels are now (a schedule stored before
    heads were named ``eagle3 <head>`` carries the older label)."""
    from tuner.results.schedule_run import drafter_label

    spec = next((r.spec for r in rows if r.number == trial and r.spec is not None), None)
    return drafter_label(spec) if spec is not None else stored


def _draw_schedule(ax: Axes, run: ScheduleRun) -> None:
    """The schedule's chosen k per level (rings at the trial speedup that chose it, k written beside it)
    and the validation engine's speedup per level (stars), on its drafter's panel."""
    schedule = run.schedule
    assert schedule is not None
    chosen = [(c.level, c.speedup, c.k) for c in schedule.levels if c.speedup is not None]
    if chosen:
        ax.plot(
            [lv for lv, _, _ in chosen],
            [s for _, s, _ in chosen],
            color=SCHEDULE_COLOR,
            linewidth=2.2,
            marker="o",
            markersize=11,
            markerfacecolor="none",
            label="schedule: chosen k (trials)",
            zorder=4,
        )
        for lv, s, k in chosen:
            ax.annotate(f"k={k}", (lv, s), textcoords="offset points", xytext=(7, 7), fontsize="small", zorder=5)
    if run.metrics is not None:
        measured = sorted((lv.batch_size, lv.speedup) for lv in run.metrics.levels if lv.speedup is not None)
        if measured:
            verdict = "exported" if run.exported else "not exported"
            ax.plot(
                [lv for lv, _ in measured],
                [s for _, s in measured],
                linestyle="none",
                marker="*",
                markersize=13,
                color="#d62728",
                label=f"schedule: validation engine ({verdict})",
                zorder=5,
            )
