"""Small statistics used to turn repeats into numbers a user can trust."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation (unscaled)."""
    if not values:
        return 0.0
    center = median(values)
    return median([abs(v - center) for v in values])


def coefficient_of_variation(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return float(statistics.stdev(values) / mean) if mean else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lower = int(pos)
    upper = min(lower + 1, len(ordered) - 1)
    return float(ordered[lower] + (ordered[upper] - ordered[lower]) * (pos - lower))


def conservative_score(values: Sequence[float], mad_penalty: float) -> float:
    """Median minus a multiple of the MAD: a trial wins on its typical, not its luckiest, run."""
    return max(0.0, median(values) - mad_penalty * mad(values))


def speedup(value: float, baseline: float) -> float | None:
    if baseline <= 0:
        return None
    return value / baseline
