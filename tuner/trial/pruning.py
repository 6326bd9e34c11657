"""When to stop a trial early: its interim throughput against earlier trials' at the same step.

Rule (``pruning.percentile`` = p):
  a trial's value at a step (one batch size, one repeat) is compared with the values that completed
  trials, baselines included, reported at that same step. It is pruned when it is below the p-th
  percentile of those values AND more than the study's noise below the best of them.
  noise = max(NOISE_FLOOR, the median coefficient of variation over repeats of the completed trials at
  that batch size: tuner.results.noise), so a trial inside the measurement noise of the best is never pruned.
Pruning starts once ``pruning.startup_trials`` completed trials reported at that step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from tuner.results.noise import NOISE_FLOOR, study_noise
from tuner.results.scoring import level_name
from tuner.results.stats import percentile

if TYPE_CHECKING:
    from optuna.trial import Trial

    from tuner.engine.process import RunOutcome
    from tuner.engine.request import ProgressEvent
    from tuner.results.scoring import TrialMetrics
    from tuner.study.config import StudyConfig
    from tuner.study.spec import TrialSpec
    from tuner.trial.progress import ProgressView


def step_of(batch_sizes: Sequence[int], repeats: int, batch_size: int, repeat: int) -> int:
    """Optuna's step for one (batch size, repeat): the same number in every trial of a study."""
    return list(batch_sizes).index(batch_size) * repeats + repeat


@dataclass(frozen=True)
class Verdict:
    prune: bool
    value: float
    threshold: float | None = None  # the percentile of earlier values
    best: float | None = None
    noise: float = NOISE_FLOOR
    compared: int = 0  # how many earlier trials reported at this step

    def reason(self, percentile_q: float) -> str:
        return (
            f"throughput {self.value:.1f} tok/s below the {percentile_q:g}th percentile ({self.threshold:.1f}) "
            f"of {self.compared} earlier trials at this level (batch size or concurrency) and repeat, and more than the study's noise "
            f"({self.noise:.0%}) under the best ({self.best:.1f})"
        )


def decide(value: float, earlier: Sequence[float], percentile_q: float, noise: float, min_trials: int) -> Verdict:
    """Prune below the percentile of ``earlier``, unless within ``noise`` (relative) of their best."""
    if len(earlier) < max(1, min_trials):
        return Verdict(False, value, compared=len(earlier), noise=noise)
    best = max(earlier)
    threshold = percentile(earlier, percentile_q)
    prune = value < threshold and value < best * (1.0 - noise)
    return Verdict(prune, value, threshold, best, noise, len(earlier))


def judge(
    study: optuna.Study,
    trial_number: int,
    step: int,
    value: float,
    batch_size: int,
    percentile_q: float,
    min_trials: int,
) -> Verdict:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.number != trial_number]
    earlier = [float(t.intermediate_values[step]) for t in done if step in t.intermediate_values]
    return decide(value, earlier, percentile_q, study_noise(done, batch_size), min_trials)


class PruneHook:
    """Reports each measured repeat to Optuna and stops hopeless trials early."""

    def __init__(self, trial: Trial, spec: TrialSpec, config: StudyConfig, view: ProgressView | None) -> None:
        self.trial = trial
        self.spec = spec
        self.config = config
        self.view = view

    def __call__(self, event: ProgressEvent) -> str | None:
        if event.event == "engine_ready":
            if self.view:
                self.view.note(f"trial {self.trial.number}: engine ready after {event.elapsed_s:.0f} s")
            return None
        if event.probe is not None and self.view:
            probe = event.probe
            held = "SLO held" if probe.held else "SLO missed"
            self.view.note(f"trial {self.trial.number}: {probe.rate_rps:g} requests/s: {held}")
        m = event.measurement
        if m is None:
            return None
        if self.view:
            rate = m.spec.acceptance_rate
            acc = f", {rate:.0%} accepted" if rate is not None else ""
            level = level_name(self.config.workload.mode)
            self.view.note(
                f"trial {self.trial.number}: {level} {m.batch_size} repeat {m.repeat + 1}: "
                f"{m.tokens_per_s:.1f} tok/s{acc}"
            )
        if not self.config.pruning.enabled:
            return None
        w = self.config.workload
        step = step_of(w.batch_sizes, w.repeats, m.batch_size, m.repeat)
        self.trial.report(m.tokens_per_s, step)  # the baseline's values too: later trials are compared with them
        if self.spec.is_baseline:
            return None
        rate = m.spec.acceptance_rate
        if rate is not None and rate < self.config.pruning.min_acceptance_rate:
            return f"acceptance {rate:.1%} below pruning.min_acceptance_rate"
        # Goodput is decided by the rate search after the levels: throughput so far says nothing about it.
        if w.mode == "serve" and w.serve.objective == "goodput":
            return None
        p = self.config.pruning
        verdict = judge(
            self.trial.study, self.trial.number, step, m.tokens_per_s, m.batch_size, p.percentile, p.startup_trials
        )
        return verdict.reason(p.percentile) if verdict.prune else None


def pruning_saved_s(outcome: RunOutcome, config: StudyConfig, reference: TrialMetrics | None) -> float:
    """Engine time not spent: the repeats left, each at the pace of its own batch size.

    A batch size this trial measured: its remaining repeats at this trial's mean pace there. One it
    never reached: the reference trial's (the best baseline's) mean pace there, scaled by how much
    slower or faster this trial was than the reference at the batch sizes both measured. Without a
    reference pace for that batch size: this trial's mean pace over all its measured repeats.
    """
    measured = [e.measurement for e in outcome.events if e.measurement is not None]
    if not measured:
        return 0.0
    w = config.workload
    own: dict[int, list[float]] = {}
    for m in measured:
        own.setdefault(m.batch_size, []).append(m.elapsed_s)
    ref_pace = {lv.batch_size: fmean(lv.repeat_s) for lv in (reference.levels if reference else []) if lv.repeat_s}
    ratios = [fmean(own[bs]) / ref_pace[bs] for bs in own if ref_pace.get(bs)]
    scale = fmean(ratios) if ratios else 1.0
    fallback = fmean([m.elapsed_s for m in measured])
    saved = 0.0
    for bs in w.batch_sizes:
        if bs in own:
            saved += max(0, w.repeats - len(own[bs])) * fmean(own[bs])
        elif bs in ref_pace:
            saved += w.repeats * ref_pace[bs] * scale
        else:
            saved += w.repeats * fallback
    return saved
