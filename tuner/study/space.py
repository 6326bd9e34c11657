"""The Optuna search space: which candidate, its knobs, and enforce_eager.

Parameter names are prefixed with the candidate (``ngram.num_speculative_tokens``) so that
conditional parameters with different ranges never share one distribution.
"""

from __future__ import annotations

from typing import Any, Protocol

from tuner.study import methods
from tuner.study.config import Candidate, StudyConfig
from tuner.study.spec import TrialSpec, baseline_spec, spec_from_candidate

CANDIDATE = "candidate"
ENFORCE_EAGER = "enforce_eager"
BASELINE_NAME = "none"


class Suggester(Protocol):
    """The part of ``optuna.Trial`` the space needs (a fake in unit tests)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int) -> int: ...


def candidate_names(study: StudyConfig) -> list[str]:
    names = [c.name for c in study.candidates]
    if not any(_is_baseline(c) for c in study.candidates):
        names.insert(0, BASELINE_NAME)
    return names


def _is_baseline(candidate: Candidate) -> bool:
    return not methods.rules(candidate.method).speculates


def find_candidate(study: StudyConfig, name: str) -> Candidate | None:
    return next((c for c in study.candidates if c.name == name), None)


def suggest(trial: Suggester, study: StudyConfig, allowed: list[str] | None = None) -> TrialSpec:
    names = allowed if allowed is not None else candidate_names(study)
    name = trial.suggest_categorical(CANDIDATE, names)
    eager = trial.suggest_categorical(ENFORCE_EAGER, study.search.enforce_eager)
    candidate = find_candidate(study, name)
    if candidate is None or _is_baseline(candidate):
        return baseline_spec(eager).model_copy(update={"candidate": name})
    k_range = study.k_range(candidate)
    k = trial.suggest_int(f"{name}.{methods.K}", k_range.low, k_range.high)
    if not methods.rules(candidate.method).lookup:
        return spec_from_candidate(candidate, enforce_eager=eager, num_speculative_tokens=k)
    lookup_max, lookup_min = candidate.prompt_lookup_max, candidate.prompt_lookup_min
    hi = trial.suggest_int(f"{name}.{methods.LOOKUP_MAX}", lookup_max.low, lookup_max.high) if lookup_max else None
    lo = trial.suggest_int(f"{name}.{methods.LOOKUP_MIN}", lookup_min.low, lookup_min.high) if lookup_min else None
    hi, lo = methods.clip_lookup(hi, lo)
    return spec_from_candidate(
        candidate, enforce_eager=eager, num_speculative_tokens=k, prompt_lookup_max=hi, prompt_lookup_min=lo
    )


def baseline_params(study: StudyConfig, enforce_eager: bool) -> dict[str, Any]:
    """Fixed parameters for ``study.enqueue_trial``: the no-speculation baseline."""
    names = candidate_names(study)
    baseline = next((c.name for c in study.candidates if _is_baseline(c)), BASELINE_NAME)
    assert baseline in names
    return {CANDIDATE: baseline, ENFORCE_EAGER: enforce_eager}


def grid(study: StudyConfig, allowed: list[str] | None = None) -> list[TrialSpec]:
    """Every configuration of the space, for brute-force comparison and size estimates."""
    specs: list[TrialSpec] = []
    for name in allowed if allowed is not None else candidate_names(study):
        candidate = find_candidate(study, name)
        for eager in study.search.enforce_eager:
            if candidate is None or _is_baseline(candidate):
                specs.append(baseline_spec(eager).model_copy(update={"candidate": name}))
                continue
            k_range = study.k_range(candidate)
            for k in range(k_range.low, k_range.high + 1):
                if not methods.rules(candidate.method).lookup:
                    specs.append(spec_from_candidate(candidate, enforce_eager=eager, num_speculative_tokens=k))
                    continue
                for hi, lo in methods.lookup_grid(candidate.prompt_lookup_max, candidate.prompt_lookup_min):
                    specs.append(
                        spec_from_candidate(
                            candidate,
                            enforce_eager=eager,
                            num_speculative_tokens=k,
                            prompt_lookup_max=hi,
                            prompt_lookup_min=lo,
                        )
                    )
    return specs


def first_trial_params(study: StudyConfig) -> list[dict[str, Any]]:
    """``search.first_trials`` as Optuna parameters for ``enqueue_trial``."""
    out = []
    for first in study.search.first_trials:
        eager = first.enforce_eager if first.enforce_eager is not None else study.search.enforce_eager[0]
        params: dict[str, Any] = {CANDIDATE: first.candidate, ENFORCE_EAGER: eager}
        for key in methods.KNOBS:
            value = getattr(first, key)
            if value is not None:
                params[f"{first.candidate}.{key}"] = value
        out.append(params)
    return out
