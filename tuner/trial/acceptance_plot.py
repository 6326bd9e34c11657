"""A trial's acceptance profile (accepted tokens per draft position), drawn for its MLflow run as it ends."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tuner.results.scoring import TrialMetrics
    from tuner.results.tracking import Tracker

log = logging.getLogger(__name__)

ACCEPTANCE_ARTIFACT = "acceptance_profile.png"


def acceptance_profile(metrics: TrialMetrics, title: str = "") -> Figure:
    """A small bar chart of one trial's accepted tokens per draft position."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.0, 2.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    rates = metrics.spec.per_position_rate
    if not rates:
        ax.text(0.5, 0.5, "no speculative decoding in this trial", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        positions = list(range(1, len(rates) + 1))
        bars = ax.bar(positions, rates, color="#1f77b4")
        ax.bar_label(bars, fmt="%.2f", fontsize="x-small")
        ax.set_xticks(positions)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted per draft")
        rate, mal = metrics.spec.acceptance_rate, metrics.spec.mean_acceptance_length
        if rate is not None and mal is not None:
            ax.text(
                0.98,
                0.95,
                f"acceptance {rate:.0%}\nmean acceptance length {mal:.2f}\n(tokens per drafted step)",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize="small",
            )
    ax.set_title(title or "Acceptance profile", fontsize="medium")
    return fig


def log_acceptance_plot(tracker: Tracker, run_id: str, metrics: TrialMetrics, title: str = "") -> None:
    """Attach the trial's acceptance profile to its MLflow run; never fails the trial."""
    if not metrics.spec.per_position_rate:
        return
    try:
        fig = acceptance_profile(metrics, title)
        tracker.client.log_figure(run_id, fig, ACCEPTANCE_ARTIFACT)
    except Exception as exc:  # a plot must never cost a measured trial
        log.warning("could not log the acceptance plot of run %s: %s", run_id, exc)
