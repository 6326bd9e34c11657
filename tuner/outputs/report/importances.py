"""Which settings explain the score: fANOVA over the normalised settings, or why there are too few trials."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.outputs.report.model import TrialRow
    from tuner.study.spec import TrialSpec

# Normalised settings the importances are computed over (Optuna's own parameter names are per candidate).
FEATURES = ("candidate", "num_speculative_tokens", "enforce_eager", "prompt_lookup_max", "prompt_lookup_min")
# fANOVA over fewer distinct points, or over one setting, attributes everything to whatever differs.
MIN_IMPORTANCE_CONFIGS = 4
MIN_IMPORTANCE_SETTINGS = 2


def _features(spec: TrialSpec) -> dict[str, Any]:
    return {
        "candidate": spec.candidate,
        "num_speculative_tokens": spec.num_speculative_tokens or 0,
        "enforce_eager": spec.enforce_eager,
        "prompt_lookup_max": spec.prompt_lookup_max or 0,
        "prompt_lookup_min": spec.prompt_lookup_min or 0,
    }


def param_importances(rows: Sequence[TrialRow]) -> tuple[dict[str, float] | None, str]:
    """fANOVA importances of the normalised settings for the score, or ``None`` and why not.

    Optuna's own parameters are per candidate (``ngram.num_speculative_tokens``) and mostly absent
    from other candidates' trials, so the importances are computed over the settings every trial has
    (``num_speculative_tokens`` is 0 without speculation; lookup sizes are 0 outside n-gram).
    """
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

    points = [r for r in rows if r.measured and r.spec is not None and r.metrics is not None]
    feats = [_features(r.spec) for r in points if r.spec is not None]
    distinct = len({tuple(f[k] for k in FEATURES) for f in feats})
    varying = [k for k in FEATURES if len({f[k] for f in feats}) >= 2]
    if distinct < MIN_IMPORTANCE_CONFIGS or len(varying) < MIN_IMPORTANCE_SETTINGS:
        return None, (
            f"Too few trials for parameter importances: they need at least {MIN_IMPORTANCE_CONFIGS} distinct "
            f"completed configurations that differ in at least {MIN_IMPORTANCE_SETTINGS} settings; this study has "
            f"{distinct} distinct completed configuration{'' if distinct == 1 else 's'}"
            + (f", differing in {', '.join(varying)}." if varying else ".")
        )
    scores = [r.metrics.score for r in points if r.metrics is not None]
    if max(scores) - min(scores) <= 0:
        return None, "Every completed trial has the same score; no setting explains a difference."
    dists: dict[str, BaseDistribution] = {}
    for key in varying:
        choices = sorted({f[key] for f in feats}, key=str)
        if isinstance(choices[0], bool | str):
            dists[key] = CategoricalDistribution(choices)
        else:
            dists[key] = IntDistribution(min(choices), max(choices))
    trials = [
        optuna.trial.create_trial(params={k: f[k] for k in varying}, distributions=dists, value=score)
        for f, score in zip(feats, scores, strict=True)
    ]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="maximize")
        study.add_trials(trials)
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        values = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except Exception as exc:  # small or degenerate studies: say so instead of failing the report
        return None, f"Parameter importances could not be computed ({type(exc).__name__}: {exc})."
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {k: float(v) for k, v in values.items()}, ""
