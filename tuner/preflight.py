"""Checks every candidate before any engine starts; an unusable one leaves the space with its reason."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.space import candidate_names, find_candidate
from tuner.study_config import StudyConfig
from tuner.trial_spec import local_path_missing, resolve_model, study_uses_demo


@dataclass
class Preflight:
    target_path: str
    allowed: list[str]
    rejected: dict[str, str] = field(default_factory=dict)


def ensure_demo_models(config: StudyConfig) -> None:
    if study_uses_demo(config):
        from tuner.models.demo import prepare_demo

        prepare_demo(log=lambda msg: None)


def run_preflight(config: StudyConfig) -> Preflight:
    ensure_demo_models(config)
    target_path = resolve_model(config.target.model)
    if local_path_missing(target_path):
        raise UserError(f"target.model: {target_path} does not exist; fix: give the path of a Hugging Face checkpoint")
    allowed: list[str] = []
    rejected: dict[str, str] = {}
    for index, candidate in enumerate(config.candidates):
        if candidate.model and local_path_missing(resolve_model(candidate.model)):
            raise UserError(
                f"candidates.{index}.model: {resolve_model(candidate.model)} does not exist; "
                "fix: give the path of a draft checkpoint (or demo:NAME)"
            )
    for name in candidate_names(config):
        found = find_candidate(config, name)
        reason = None
        if found is not None and found.model:
            reason = check_draft_pair(target_path, resolve_model(found.model), config.target.trust_remote_code)
        if reason:
            rejected[name] = reason
        else:
            allowed.append(name)
    for name, reason in check_with_vllm(config, allowed).items():
        allowed.remove(name)
        rejected[name] = reason
    if not any(n != "none" and find_candidate(config, n) is not None for n in allowed) and rejected:
        raise UserError(
            "candidates: no speculative candidate passed the pre-flight checks ("
            + "; ".join(f"{k}: {v}" for k, v in rejected.items())
            + "); fix: correct the draft models"
        )
    return Preflight(target_path=target_path, allowed=allowed, rejected=rejected)


def check_draft_pair(target: str, draft: str, trust_remote_code: bool) -> str | None:
    """Reason the draft cannot serve this target, or None. Cheap: tokenizers and configs only."""
    from tuner.pair_check import compare_pair

    if not (Path(target).exists() and Path(draft).exists()):
        return None  # hub ids: vLLM checks them when the engine starts
    report = compare_pair(target, draft, trust_remote_code=trust_remote_code, load_weights=False)
    return None if report.compatible else report.reason


def check_with_vllm(config: StudyConfig, names: list[str]) -> dict[str, str]:
    """The corners of each model-free candidate's ranges, built as vLLM ``SpeculativeConfig``s."""
    from tuner.runner import ENGINE_MODULE_ENV
    from tuner.vllm_checks import MODEL_FREE_METHODS, validate_in_subprocess

    if os.environ.get(ENGINE_MODULE_ENV):
        return {}  # another engine than vLLM (tests' stand-in): vLLM's rules do not apply

    probes: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        candidate = find_candidate(config, name)
        if candidate is None or candidate.method not in MODEL_FREE_METHODS:
            continue
        k = config.k_range(candidate)
        lookup_max = candidate.prompt_lookup_max
        lookup_min = candidate.prompt_lookup_min
        for k_value in sorted({k.low, k.high}):
            probe: dict[str, Any] = {"method": candidate.method, "num_speculative_tokens": k_value, **candidate.extra}
            if candidate.method == "ngram":
                high = lookup_max.high if lookup_max else 4
                probe["prompt_lookup_max"] = high
                probe["prompt_lookup_min"] = min(lookup_min.low if lookup_min else 2, high)
            probes.append((name, probe))
    errors = validate_in_subprocess([p for _, p in probes])
    if errors is None:
        return {}
    rejected: dict[str, str] = {}
    for (name, probe), error in zip(probes, errors, strict=True):
        if error and name not in rejected:
            rejected[name] = f"vLLM rejects {probe}: {error}"
    return rejected
