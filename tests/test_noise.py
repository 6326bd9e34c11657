"""The study's noise: the typical repeat-to-repeat spread at a level, not its single worst trial's."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from tuner.results.noise import NOISE_FLOOR, study_noise
from tuner.results.record import RECORD
from tuner.results.schedule import Option, choose_k
from tuner.results.scoring import LevelMetrics, TrialMetrics


def _trial(tokens_per_s: float, cv: float, duplicate_of: int | None = None) -> optuna.trial.FrozenTrial:
    level = LevelMetrics(
        batch_size=16, tokens_per_s=tokens_per_s, tokens_per_s_mad=0, tokens_per_s_cv=cv, score=0, repeats=[]
    )
    metrics = TrialMetrics(levels=[level], score=1.0, tokens_per_s=tokens_per_s)
    record = {"metrics": metrics.model_dump(mode="json")}
    if duplicate_of is not None:
        record["duplicate_of"] = duplicate_of
    return optuna.trial.create_trial(
        params={"k": 1}, distributions={"k": IntDistribution(0, 8)}, value=1.0, user_attrs={RECORD: record}
    )


# Batch 16 of the H100 head study (benchmarks/results/eagle3-wide-h100-20261207, 2026-12-07): median tok/s and
# the CV over its repeats of no speculation (trial 0), the head k=3 (trial 1), the 135M draft (trial 2), the
# repeat of trial 1 (trial 4) and the head k=4 (trial 7, one repeat 0.9 s instead of 0.6 s).
H100_BS16 = [
    (2025.9, 0.004, None),
    (2658.4, 0.048, None),
    (553.8, 0.12, None),
    (2658.4, 0.048, 1),
    (1676.2, 0.287, None),
]


def test_one_noisy_trial_does_not_set_the_noise_and_a_repeat_counts_once() -> None:
    trials = [_trial(v, cv, dup) for v, cv, dup in H100_BS16]
    # The median of 0.004, 0.048, 0.12 and 0.287 (trial 4 is trial 1); with trial 4 counted it would be 0.048.
    assert study_noise(trials, 16) == pytest.approx(0.084)
    assert study_noise(trials[:1], 16) == NOISE_FLOOR
    assert study_noise(trials, 64) == NOISE_FLOOR  # nothing measured there


def test_the_head_k3_that_ran_31_percent_faster_is_not_tied_with_no_speculation() -> None:
    noise = study_noise([_trial(v, cv, dup) for v, cv, dup in H100_BS16], 16)
    options = [
        Option(k=0, trial=0, tokens_per_s={16: 2025.9}),
        Option(k=3, trial=1, tokens_per_s={16: 2658.4}),
        Option(k=4, trial=7, tokens_per_s={16: 1676.2}),
    ]
    choice = choose_k(16, options, noise)
    assert choice is not None and choice.k == 3  # the largest CV (29%) chose k=0 here
