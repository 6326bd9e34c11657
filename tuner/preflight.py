"""Checks every candidate before any engine starts; an unusable one leaves the space with its reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

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
    for name in candidate_names(config):
        candidate = find_candidate(config, name)
        reason = None
        if candidate is not None and candidate.model:
            draft = resolve_model(candidate.model)
            if local_path_missing(draft):
                reason = f"draft model {draft} does not exist"
            else:
                reason = check_draft_pair(target_path, draft, config.target.trust_remote_code)
        if reason:
            rejected[name] = reason
        else:
            allowed.append(name)
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
