"""Plots of a study for the report, the notebook and MLflow (matplotlib, no display needed).

Figures are built with matplotlib's object API (``Figure``, not ``pyplot``): nothing global changes,
no window opens, and they render with the Agg canvas wherever the code runs. Every function takes the
rows of ``tuner.outputs.report.model.collect_rows`` (or one trial's metrics) and returns a ``Figure``.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from tuner.outputs.report.model import TrialRow


PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
PALETTE += ["#17becf"]
BASELINE_COLOR = "#444444"


def new_figure(width: float = 7.0, height: float = 3.6) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def png_base64(fig: Figure, dpi: int = 100) -> str:
    return base64.b64encode(png_bytes(fig, dpi)).decode("ascii")


def candidate_colors(rows: Sequence[TrialRow]) -> dict[str, str]:
    """One color per candidate, in order of first appearance; the baseline is grey."""
    colors: dict[str, str] = {}
    for row in rows:
        if row.spec is None or row.spec.candidate in colors:
            continue
        if row.spec.is_baseline:
            colors[row.spec.candidate] = BASELINE_COLOR
        else:
            colors[row.spec.candidate] = PALETTE[(len(colors)) % len(PALETTE)]
    return colors


def _integer_ticks(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def note_on(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


# -- the study as a whole ---------------------------------------------------------------------------
def history(rows: Sequence[TrialRow]) -> Figure:
    """Optimisation history: each trial's score, the best so far, pruned and failed trials marked."""
    fig = new_figure()
    ax = fig.add_subplot()
    colors = candidate_colors(rows)
    scored = [r for r in rows if r.metrics is not None]
    if not rows:
        note_on(ax, "no trials yet")
        return fig
    for cand, color in colors.items():
        pts = [r for r in scored if r.spec is not None and r.spec.candidate == cand]
        if pts:
            ax.scatter(
                [r.number for r in pts],
                [r.metrics.score for r in pts if r.metrics],
                color=color,
                label=cand,
                zorder=3,
            )
    _unfinished_markers(ax, rows)
    _best_so_far(ax, scored)
    ax.set_xlabel("trial")
    goodput = any(r.metrics.objective == "goodput" for r in scored if r.metrics)
    ax.set_ylabel(
        "score (highest SLO rate\n÷ baseline's)"
        if goodput
        else "score (weighted speedup:\n(median − penalty × MAD) ÷ baseline)"
    )
    ax.set_title("Optimisation history")
    ax.set_ylim(bottom=0)
    _integer_ticks(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def _unfinished_markers(ax: Axes, rows: Sequence[TrialRow]) -> None:
    """Pruned trials (at their last partial value, or on the axis) and failed trials, on the history plot."""
    pruned = [r for r in rows if r.state == "PRUNED"]
    partial = [(r.number, r.partial_speedup) for r in pruned if r.partial_speedup is not None]
    if partial:
        ax.scatter(
            [n for n, _ in partial],
            [v for _, v in partial],
            marker="x",
            color="#999999",
            label="pruned (last partial value ÷ baseline)",
            zorder=3,
        )
    early = [r.number for r in pruned if r.partial_speedup is None]
    # pruned before any throughput was reported (low acceptance): on the axis, like failures
    _on_axis(ax, early, "x", "#a66a00", "pruned before a partial value")
    _on_axis(ax, [r.number for r in rows if r.state == "FAIL"], "v", "#d62728", "failed")


def _on_axis(ax: Axes, numbers: list[int], marker: str, color: str, label: str) -> None:
    if numbers:
        ax.scatter(numbers, [0.0] * len(numbers), marker=marker, color=color, label=label, zorder=3, clip_on=False)


def _best_so_far(ax: Axes, scored: Sequence[TrialRow]) -> None:
    if not scored:
        return
    best: list[float] = []
    xs: list[int] = []
    current = -math.inf
    for r in sorted(scored, key=lambda r: r.number):
        assert r.metrics is not None
        current = max(current, r.metrics.score)
        xs.append(r.number)
        best.append(current)
    ax.step(xs, best, where="post", color="#333333", linewidth=1.2, label="best so far", zorder=2)


def importances(values: dict[str, float] | None, note: str = "") -> Figure:
    """Parameter importances (fANOVA over the normalised trial settings), or a note why there are none."""
    fig = new_figure(height=max(2.0, 0.5 + 0.45 * len(values or {})))
    ax = fig.add_subplot()
    ax.set_title("Parameter importances for the score")
    if not values:
        note_on(ax, note or "not enough completed trials")
        return fig
    names = list(values)[::-1]
    ax.barh(names, [values[n] for n in names], color="#1f77b4")
    for i, name in enumerate(names):
        ax.text(values[name], i, f" {values[name]:.2f}", va="center", fontsize="small")
    ax.set_xlim(0, max(1.0, max(values.values()) * 1.15))
    ax.set_xlabel("share of the score's variance explained")
    return fig


def throughput_vs_k(rows: Sequence[TrialRow]) -> Figure:
    """Output tokens/s against num_speculative_tokens, one line per candidate, a panel per batch size."""
    from tuner.outputs.report.model import rows_mode

    measured = [r for r in rows if r.metrics is not None and r.spec is not None and r.duplicate_of is None]
    batch_sizes = sorted({lv.batch_size for r in measured if r.metrics for lv in r.metrics.levels})
    serve = rows_mode(rows) == "serve"
    panels = max(1, len(batch_sizes))
    fig = new_figure(width=min(4.2 * panels + 1.5, 14.0), height=3.8)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    colors = candidate_colors(rows)
    if not batch_sizes:
        note_on(axes[0], "no completed trial")
        return fig
    for ax, bs in zip(axes, batch_sizes, strict=True):
        base = [
            lv.tokens_per_s
            for r in measured
            if r.spec and r.spec.is_baseline and r.metrics
            if (lv := r.metrics.level(bs))
        ]
        if base:
            ax.axhline(max(base), color=BASELINE_COLOR, linestyle="--", linewidth=1.2, label="no speculation (best)")
        for cand, color in colors.items():
            pts: list[tuple[int, float]] = []
            for r in measured:
                if r.spec is None or r.spec.candidate != cand or r.spec.is_baseline or r.metrics is None:
                    continue
                lv = r.metrics.level(bs)
                if lv is not None and r.spec.num_speculative_tokens is not None:
                    pts.append((r.spec.num_speculative_tokens, lv.tokens_per_s))
            if not pts:
                continue
            ax.scatter([k for k, _ in pts], [t for _, t in pts], color=color, alpha=0.45, s=18)
            best_per_k: dict[int, float] = {}
            for k, t in pts:
                best_per_k[k] = max(t, best_per_k.get(k, -math.inf))
            ks = sorted(best_per_k)
            ax.plot(ks, [best_per_k[k] for k in ks], marker="o", color=color, label=cand)
        ax.set_title(f"concurrency {bs}" if serve else f"batch size {bs}")
        ax.set_xlabel("num_speculative_tokens")
        _integer_ticks(ax)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("output tokens/s (median)")
    axes[0].legend(fontsize="small", loc="lower left")
    fig.suptitle("Throughput against num_speculative_tokens (line: best per k; dots: every trial)")
    return fig


def acceptance_per_position(rows: Sequence[TrialRow]) -> Figure:
    """Accepted tokens per draft at each position, for the best completed trial of each candidate."""
    fig = new_figure()
    ax = fig.add_subplot()
    colors = candidate_colors(rows)
    best: dict[str, TrialRow] = {}
    for r in rows:
        if r.spec is None or r.metrics is None or r.spec.is_baseline or not r.metrics.spec.per_position_rate:
            continue
        held = best.get(r.spec.candidate)
        if held is None or (held.metrics is not None and r.metrics.score > held.metrics.score):
            best[r.spec.candidate] = r
    if not best:
        note_on(ax, "no completed speculative trial")
        ax.set_title("Accepted tokens per position")
        return fig
    for cand, r in best.items():
        assert r.metrics is not None and r.spec is not None
        rates = r.metrics.spec.per_position_rate
        mal = r.metrics.spec.mean_acceptance_length
        extra = f", mean acceptance length {mal:.2f}" if mal is not None else ""
        ax.plot(
            range(1, len(rates) + 1),
            rates,
            marker="o",
            color=colors.get(cand),
            label=f"{r.label} (trial {r.number}{extra})",
        )
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted per draft")
    ax.set_ylim(0, 1.05)
    _integer_ticks(ax)
    ax.grid(alpha=0.3)
    ax.set_title("Accepted tokens per position (best trial of each candidate)")
    ax.legend(fontsize="small", loc="upper right")
    return fig


def engine_start_vs_eager(rows: Sequence[TrialRow]) -> Figure:
    """Engine start time of every measured trial, eager against compiled (CUDA graphs / torch.compile)."""
    fig = new_figure(width=5.5, height=3.6)
    ax = fig.add_subplot()
    colors = candidate_colors(rows)
    measured = [r for r in rows if r.metrics is not None and r.spec is not None and r.duplicate_of is None]
    ax.set_title("Engine start time against enforce_eager")
    if not measured:
        note_on(ax, "no completed trial")
        return fig
    positions = {True: 0, False: 1}
    seen: set[str] = set()
    for eager, x in positions.items():
        group = [r for r in measured if r.spec is not None and r.spec.enforce_eager == eager]
        for i, r in enumerate(group):
            assert r.spec is not None and r.metrics is not None
            jitter = (i - (len(group) - 1) / 2) * min(0.05, 0.5 / max(len(group), 1))
            cand = r.spec.candidate
            ax.scatter(
                x + jitter,
                r.metrics.engine_start_s,
                color=colors.get(cand),
                label=cand if cand not in seen else None,
                zorder=3,
            )
            seen.add(cand)
        if group:
            values = sorted(r.metrics.engine_start_s for r in group if r.metrics)
            mid = (
                values[len(values) // 2]
                if len(values) % 2
                else sum(values[len(values) // 2 - 1 : len(values) // 2 + 1]) / 2
            )
            ax.hlines(mid, x - 0.25, x + 0.25, color="#333333", linewidth=2, zorder=2)
    ax.set_xticks([0, 1], ["eager\n(enforce_eager=true)", "compiled\n(enforce_eager=false)"])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("engine start (s)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small", loc="best")
    return fig


def compare_studies(named: dict[str, Sequence[TrialRow]]) -> Figure:
    """Best speedup of each candidate in several studies (e.g. the same space on CPU and on GPU)."""
    fig = new_figure(width=7.5, height=3.8)
    ax = fig.add_subplot()
    best: dict[str, dict[str, float]] = {}
    for study, rows in named.items():
        for r in rows:
            if r.spec is None or r.speedup is None:
                continue
            per = best.setdefault(r.spec.candidate, {})
            per[study] = max(r.speedup, per.get(study, -math.inf))
    if not best:
        note_on(ax, "no completed trial with a speedup in these studies")
        return fig
    cands = list(best)
    studies = list(named)
    width = 0.8 / max(len(studies), 1)
    for i, study in enumerate(studies):
        xs = [j + (i - (len(studies) - 1) / 2) * width for j in range(len(cands))]
        ys = [best[c].get(study, math.nan) for c in cands]
        bars = ax.bar(xs, ys, width=width, label=study, color=PALETTE[i % len(PALETTE)])
        ax.bar_label(bars, fmt="%.2f×", fontsize="x-small")
    ax.axhline(1.0, color=BASELINE_COLOR, linestyle="--", linewidth=1, label="no speculation")
    ax.set_xticks(range(len(cands)), cands)
    ax.set_ylabel("best speedup over no speculation")
    ax.set_title("Best speedup per candidate, study against study")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, axis="y")
    return fig


# -- one trial ----------------------------------------------------------------------------------------
