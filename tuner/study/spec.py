"""One concrete configuration to measure, and its translation into vLLM arguments."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from tuner.study import methods
from tuner.study.config import Candidate, StudyConfig, TargetConfig
from tuner.study.methods import Method


class TrialSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidate: str
    method: Method
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    enforce_eager: bool = True
    extra: dict[str, Any] = {}

    @property
    def is_baseline(self) -> bool:
        return not methods.rules(self.method).speculates

    def key(self) -> tuple[Any, ...]:
        """Identity of the measured configuration (two trials with one key measure the same thing)."""
        return (
            self.method,
            self.draft_model,
            self.num_speculative_tokens,
            self.prompt_lookup_min,
            self.prompt_lookup_max,
            self.enforce_eager,
            # JSON, so that list and dict values hash; sorted, so that key order does not matter.
            tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in self.extra.items())),
        )

    def speculative_config(self) -> dict[str, Any] | None:
        return methods.speculative_config(
            self.method,
            self.num_speculative_tokens,
            self.draft_model,
            self.prompt_lookup_min,
            self.prompt_lookup_max,
            self.extra,
        )

    def mlflow_params(self) -> dict[str, str]:
        params = {
            "candidate": self.candidate,
            "method": self.method,
            "draft_model": self.draft_model or "",
            "num_speculative_tokens": self.num_speculative_tokens or 0,
            "enforce_eager": self.enforce_eager,
        }
        if methods.rules(self.method).lookup:
            params["prompt_lookup_min"] = self.prompt_lookup_min
            params["prompt_lookup_max"] = self.prompt_lookup_max
        return {k: str(v) for k, v in params.items()}

    def label(self) -> str:
        core = methods.label(
            self.method, self.candidate, self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max
        )
        return core + (" eager" if self.enforce_eager else " compiled")


def baseline_spec(enforce_eager: bool) -> TrialSpec:
    return TrialSpec(candidate="none", method="none", enforce_eager=enforce_eager)


def llm_kwargs(target: TargetConfig, target_path: str, spec: TrialSpec) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM``: the exact engine construction of a trial."""
    kwargs: dict[str, Any] = {
        "model": target_path,
        "dtype": target.dtype,
        "seed": target.seed,
        "trust_remote_code": target.trust_remote_code,
        "enforce_eager": spec.enforce_eager,
        "disable_log_stats": False,
    }
    if target.max_model_len is not None:
        kwargs["max_model_len"] = target.max_model_len
    kwargs.update(target.engine_args)
    speculative = spec.speculative_config()
    if speculative is not None:
        kwargs["speculative_config"] = speculative
    return kwargs


def resolve_model(model: str) -> str:
    """``demo:NAME`` -> local checkpoint path; anything else is returned as given."""
    from tuner.models.demo import is_demo_ref, resolve_demo_ref

    if is_demo_ref(model):
        return str(resolve_demo_ref(model))
    return model


def spec_from_candidate(candidate: Candidate, **values: Any) -> TrialSpec:
    return TrialSpec(
        candidate=candidate.name,
        method=candidate.method,
        draft_model=resolve_model(candidate.model) if candidate.model else None,
        extra=dict(candidate.extra),
        **values,
    )


def study_models(study: StudyConfig) -> list[str]:
    """The target's and every draft's model reference, as written in the study file."""
    return [study.target.model] + [c.model for c in study.candidates if c.model]


def study_uses_demo(study: StudyConfig) -> bool:
    from tuner.models.demo import is_demo_ref

    return any(is_demo_ref(m) for m in study_models(study))
