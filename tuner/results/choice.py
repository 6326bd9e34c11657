"""The study's recommendation, decided in one place: which trial to serve, against which baseline,
and whether speculation paid. Export and report both ask here."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from tuner.errors import UserError
from tuner.results import store

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


class Choice(NamedTuple):
    chosen: FrozenTrial  # the trial to serve (the baseline itself when speculation did not pay)
    baseline: FrozenTrial | None  # the best baseline without speculation
    paid: bool  # whether a speculative configuration beat the baseline


def choose(study: optuna.Study) -> Choice:
    """A finished confirmation of the current finalists decides (tuner.trial.confirm); without one, the trials do."""
    from tuner.trial import confirm  # confirm ranks finalists with this module's store: import when asked

    best = store.best_trial(study)
    if best is None:
        raise UserError(
            f"study '{study.study_name}' has no completed trial yet; fix: run `python -m tuner optimize` until one completes"
        )
    baseline = store.best_baseline(study)
    conf = confirm.current(study)
    if conf is not None and conf.complete and baseline is not None:
        winner = conf.decide().winner
        if winner is None:
            return Choice(baseline, baseline, False)
        return Choice(study.trials[winner], baseline, True)
    spec = store.trial_spec(best)
    if spec is None or spec.is_baseline or baseline is None:
        return Choice(baseline or best, baseline, False)
    return Choice(best, baseline, _score(study, best) > _score(study, baseline))


def _score(study: optuna.Study, trial: FrozenTrial) -> float:
    metrics = store.scored_metrics(study, trial)
    assert metrics is not None  # a completed trial (best_trial, best_baseline) has metrics
    return metrics.score
