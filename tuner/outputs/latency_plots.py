"""Serve mode's plot: the finalists' served latency against load (concurrency levels and the request
rates the SLO search probed), the SLO limits drawn over it. Built like :mod:`tuner.outputs.plots`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.outputs.plots import BASELINE_COLOR, PALETTE, new_figure, note_on

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from tuner.outputs.report.model import SloSummary, TrialRow

LATENCY_ARTIFACT = "latency_vs_load.png"  # on the study's parent run


def latency_vs_load(finalists: Sequence[tuple[str, TrialRow]], slo: SloSummary | None = None) -> Figure:
    """Served latency of the finalists ((role, row) pairs): TTFT and TPOT at the SLO's percentile (p90
    without one) per max-concurrency level, and per request rate its SLO search probed; limits dashed."""
    pct = slo.percentile if slo is not None else 90
    probed = any(r.metrics is not None and r.metrics.slo is not None and r.metrics.slo.probes for _, r in finalists)
    fig = new_figure(width=10.0, height=3.4 * (2 if probed else 1))
    grid = fig.subplots(2 if probed else 1, 2, squeeze=False)
    colors = [
        BASELINE_COLOR if r.spec is not None and r.spec.is_baseline else PALETTE[i]
        for i, (_, r) in enumerate(finalists)
    ]
    limits = {"ttft": slo.ttft_ms if slo else None, "tpot": slo.tpot_ms if slo else None}
    for col, (key, name) in enumerate((("ttft", "TTFT"), ("tpot", "TPOT"))):
        panels = [(grid[0][col], False)] + ([(grid[1][col], True)] if probed else [])
        for ax, by_rate in panels:
            for (role, row), color in zip(finalists, colors, strict=True):
                _latency_line(ax, row, f"{role}: {row.label} (trial {row.number})", color, key, pct, by_rate)
            limit = limits[key]
            if limit is not None:
                ax.axhline(
                    limit, color="#d62728", linestyle="--", linewidth=1.2, label=f"SLO: p{pct} {name} ≤ {limit:g} ms"
                )
            _log_if_wide(ax)
            ax.set_xlabel("request rate probed (requests/s)" if by_rate else "max concurrency")
            ax.set_ylabel(f"p{pct} {name} (ms)")
            ax.set_title(f"p{pct} {name} against {'request rate' if by_rate else 'concurrency'}", fontsize="medium")
            ax.grid(alpha=0.3)
        level_ticks(grid[0][col], sorted({lv.batch_size for _, r in finalists if r.metrics for lv in r.metrics.levels}))
    if not finalists:
        note_on(grid[0][0], "no completed trial")
    else:
        grid[0][0].legend(fontsize="x-small", loc="upper left")
    fig.suptitle("Served latency against load" + (" (×: SLO missed)" if slo is not None else ""))
    return fig


def _latency_line(ax: Axes, row: TrialRow, label: str, color: str, key: str, pct: int, by_rate: bool) -> None:
    """One finalist's latency per concurrency level or per probed rate; × where the SLO was missed."""
    m = row.metrics
    if m is None:
        return
    raw: list[tuple[float, float | None, bool | None]]
    if by_rate:
        raw = [(p.rate_rps, p.window.latency(key, pct), p.held) for p in (m.slo.probes if m.slo else [])]
    else:
        raw = [(float(lv.batch_size), lv.latency_ms.get(f"{key}_p{pct}"), lv.slo_held) for lv in m.levels]
    pts = sorted(((x, y, held) for x, y, held in raw if y is not None), key=lambda p: p[0])
    if pts:
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], color=color, linewidth=1.2, label=label)
    for x, y, held in pts:
        ax.scatter(x, y, marker="x" if held is False else "o", color=color, zorder=3)


def level_ticks(ax: Axes, levels: list[int]) -> None:
    """A tick at each measured level; concurrencies like 1, 8, 64 on a log2 axis."""
    if levels and levels[-1] / levels[0] >= 16:
        ax.set_xscale("log", base=2)
    if levels:
        ax.set_xticks(levels, [str(n) for n in levels])
        ax.minorticks_off()


def _log_if_wide(ax: Axes) -> None:
    """A saturated server's latency is orders of magnitude above the rest: a log axis keeps both readable."""
    low, high = ax.dataLim.y0, ax.dataLim.y1
    if 0 < low < math.inf and high / low > 30:
        ax.set_yscale("log")
