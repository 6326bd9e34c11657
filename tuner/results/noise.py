"""The study's noise: how far apart two measurements of one configuration can be and still not differ."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.results import store

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

# Two fresh engines of one configuration agree within about 2% on a quiet machine (docs/benchmarks.md,
# noise): below 3% apart, two trials cannot be told apart, whatever one engine's repeats say.
NOISE_FLOOR = 0.03


def study_noise(trials: Sequence[FrozenTrial], batch_size: int) -> float:
    """The median within-trial CV at this batch size over the measured configurations (a repeat of a trial
    counts once), at least NOISE_FLOOR.

    The median, not the largest: one slow repeat of one trial must not make every other pair at that level
    "within noise" (the H100 head study, 2026-12-07: one batch-16 repeat of trial 7 at 0.9 s instead of 0.6 s
    made the largest CV 29%, and no speculation counted as tied with the head k=3 that ran 31% faster)."""
    cvs = [
        lv.tokens_per_s_cv
        for t in trials
        if not store.is_repeat(t)
        and (m := store.trial_metrics(t)) is not None
        and (lv := m.level(batch_size)) is not None
    ]
    return max(NOISE_FLOOR, statistics.median(cvs)) if cvs else NOISE_FLOOR
