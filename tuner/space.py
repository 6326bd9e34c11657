"""The Optuna search space: which candidate, its knobs, and enforce_eager.

Parameter names are prefixed with the candidate (``ngram.num_speculative_tokens``) so that
conditional parameters with different ranges never share one distribution.
"""

from __future__ import annotations

from typing import Any, Protocol

from tuner.study_config import Candidate, StudyConfig
from tuner.trial_spec import TrialSpec, baseline_spec, spec_from_candidate

CANDIDATE = "candidate"
ENFORCE_EAGER = "enforce_eager"
BASELINE_NAME = "none"


class Suggester(Protocol):
    """The part of ``optuna.Trial`` the space needs (a fake in unit tests)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int) -> int: ...


def candidate_names(study: StudyConfig) -> list[str]:
    names = [c.name for c in study.candidates]
    if not any(c.method == "none" for c in study.candidates):
        names.insert(0, BASELINE_NAME)
    return names


def find_candidate(study: StudyConfig, name: str) -> Candidate | None:
    return next((c for c in study.candidates if c.name == name), None)


def suggest(trial: Suggester, study: StudyConfig, allowed: list[str] | None = None) -> TrialSpec:
    names = allowed if allowed is not None else candidate_names(study)
    name = trial.suggest_categorical(CANDIDATE, names)
    eager = trial.suggest_categorical(ENFORCE_EAGER, study.search.enforce_eager)
    candidate = find_candidate(study, name)
    if candidate is None or candidate.method == "none":
        return baseline_spec(eager).model_copy(update={"candidate": name})
    k_range = study.k_range(candidate)
    values: dict[str, Any] = {
        "enforce_eager": eager,
        "num_speculative_tokens": trial.suggest_int(f"{name}.num_speculative_tokens", k_range.low, k_range.high),
    }
    if candidate.method == "ngram":
        lookup_max = candidate.prompt_lookup_max
        lookup_min = candidate.prompt_lookup_min
        hi = trial.suggest_int(f"{name}.prompt_lookup_max", lookup_max.low, lookup_max.high) if lookup_max else 4
        lo = trial.suggest_int(f"{name}.prompt_lookup_min", lookup_min.low, lookup_min.high) if lookup_min else 2
        # vLLM requires min <= max; clip rather than waste a trial.
        values["prompt_lookup_max"] = hi
        values["prompt_lookup_min"] = min(lo, hi)
    return spec_from_candidate(candidate, **values)


def baseline_params(study: StudyConfig, enforce_eager: bool) -> dict[str, Any]:
    """Fixed parameters for ``study.enqueue_trial``: the no-speculation baseline."""
    names = candidate_names(study)
    baseline = next((c.name for c in study.candidates if c.method == "none"), BASELINE_NAME)
    assert baseline in names
    return {CANDIDATE: baseline, ENFORCE_EAGER: enforce_eager}


def grid(study: StudyConfig, allowed: list[str] | None = None) -> list[TrialSpec]:
    """Every configuration of the space, for brute-force comparison and size estimates."""
    specs: list[TrialSpec] = []
    for name in allowed if allowed is not None else candidate_names(study):
        candidate = find_candidate(study, name)
        for eager in study.search.enforce_eager:
            if candidate is None or candidate.method == "none":
                specs.append(baseline_spec(eager).model_copy(update={"candidate": name}))
                continue
            k_range = study.k_range(candidate)
            for k in range(k_range.low, k_range.high + 1):
                if candidate.method != "ngram":
                    specs.append(spec_from_candidate(candidate, enforce_eager=eager, num_speculative_tokens=k))
                    continue
                hi_r = candidate.prompt_lookup_max
                lo_r = candidate.prompt_lookup_min
                for hi in range(hi_r.low, hi_r.high + 1) if hi_r else [4]:
                    for lo in range(lo_r.low, min(lo_r.high, hi) + 1) if lo_r else [min(2, hi)]:
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
        for key in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(first, key)
            if value is not None:
                params[f"{first.candidate}.{key}"] = value
        out.append(params)
    return out
