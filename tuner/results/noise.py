"""The study's noise: how far apart two measurements of one configuration can be and still not differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.results import store

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

# Two fresh engines of one configuration agree within about 2% on a quiet machine (docs/benchmarks.md,
# noise): below 3% apart, two trials cannot be told apart, whatever one engine's repeats say.
NOISE_FLOOR = 0.03


def study_noise(trials: Sequence[FrozenTrial], batch_size: int) -> float:
    """The largest within-trial CV at this batch size among completed trials, at least NOISE_FLOOR."""
    cvs = [
        lv.tokens_per_s_cv
        for t in trials
        if (m := store.trial_metrics(t)) is not None and (lv := m.level(batch_size)) is not None
    ]
    return max([NOISE_FLOOR, *cvs])
