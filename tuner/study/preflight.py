"""Checks every candidate before any engine starts; an unusable one leaves the space with its reason."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.study import methods
from tuner.study.config import StudyConfig
from tuner.study.space import candidate_names, find_candidate
from tuner.trial.spec import local_path_missing, resolve_model, study_models, study_uses_demo

# Study user attribute: {candidate: why pre-flight removed it}, so that the report can say so offline.
REJECTED_ATTR = "preflight_rejected"


@dataclass
class Preflight:
    target_path: str
    allowed: list[str]
    rejected: dict[str, str] = field(default_factory=dict)


def ensure_demo_models(config: StudyConfig) -> None:
    if study_uses_demo(config):
        from tuner.models.demo import needs_wide, prepare_demo

        prepare_demo(log=lambda msg: None, wide=needs_wide(study_models(config)))


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
    from tuner.study.pair_check import compare_pair

    if not (Path(target).exists() and Path(draft).exists()):
        return None  # hub ids: vLLM checks them when the engine starts
    report = compare_pair(target, draft, trust_remote_code=trust_remote_code, load_weights=False)
    return None if report.compatible else report.reason


def check_with_vllm(config: StudyConfig, names: list[str]) -> dict[str, str]:
    """The corners of each model-free candidate's ranges, built as vLLM ``SpeculativeConfig``s."""
    probes: list[tuple[str, dict[str, Any]]] = []
    for name in names:
        candidate = find_candidate(config, name)
        if candidate is None or not methods.rules(candidate.method).checkable_without_model:
            continue
        k = config.k_range(candidate)
        lookup: tuple[int | None, int | None] = (None, None)
        if methods.rules(candidate.method).lookup:
            lookup = methods.lookup_probe(candidate.prompt_lookup_max, candidate.prompt_lookup_min)
        for k_value in sorted({k.low, k.high}):
            probe = methods.speculative_config(
                candidate.method,
                k_value,
                prompt_lookup_max=lookup[0],
                prompt_lookup_min=lookup[1],
                extra=candidate.extra,
            )
            if probe is not None:
                probes.append((name, probe))
    errors = _validate([p for _, p in probes])
    if errors is None:
        return {}
    rejected: dict[str, str] = {}
    for (name, probe), error in zip(probes, errors, strict=True):
        if error and name not in rejected:
            rejected[name] = f"vLLM rejects {probe}: {error}"
    return rejected


# vLLM's verdict on each probe, kept for this process's life (vLLM does not change under it): a
# process that runs several studies (a test session) starts vLLM's check once per new probe.
_VERDICTS: dict[str, str | None] = {}


def _validate(probes: list[dict[str, Any]]) -> list[str | None] | None:
    from tuner.study.vllm_checks import validate_in_subprocess

    keys = [json.dumps(p, sort_keys=True) for p in probes]
    new = list(dict.fromkeys(k for k in keys if k not in _VERDICTS))
    if new:
        errors = validate_in_subprocess([json.loads(k) for k in new])
        if errors is None:
            return None
        _VERDICTS.update(zip(new, errors, strict=True))
    return [_VERDICTS[k] for k in keys]
