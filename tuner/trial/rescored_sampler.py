"""The sampler sees every completed trial's value against the study's current reference.

A trial's stored Optuna value is its score against the baselines measured when it ended; a baseline that
completes later (compiled after eager, a retried one) moves the reference, and Optuna cannot change a
finished trial's value. So the sampler is handed a view of the study whose completed trials carry their
score recomputed from their stored metrics (tuner.results.scoring.apply_reference): the values TPE splits
into good and bad are in one unit, whatever order trials and baselines ended in.
"""

from __future__ import annotations

import copy
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

import optuna
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from tuner.results import store
from tuner.results.scoring import apply_reference

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution


def rescored_trials(study: optuna.Study, trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    ref = store.reference(study)
    out = []
    for t in trials:
        metrics = store.trial_metrics(t) if t.state == TrialState.COMPLETE else None
        if metrics is None or t.values is None:
            out.append(t)
            continue
        fresh = copy.copy(t)
        fresh.value = apply_reference(metrics, ref).score
        out.append(fresh)
    return out


class _RescoredStudy:
    """The study as the sampler reads it: the same in every respect but completed trials' values."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None, use_cache: bool = False
    ) -> list[FrozenTrial]:
        trials = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
        return rescored_trials(self._study, trials)

    def get_trials(self, deepcopy: bool = True, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        return rescored_trials(self._study, self._study.get_trials(deepcopy=deepcopy, states=states))

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()


class RescoredSampler(BaseSampler):
    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner

    def _view(self, study: optuna.Study) -> Any:
        return _RescoredStudy(study)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(self._view(study), trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self.inner.sample_relative(self._view(study), trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.inner.sample_independent(self._view(study), trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()
