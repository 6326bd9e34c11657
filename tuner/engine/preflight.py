"""Checks every candidate before any engine starts; an unusable one leaves the space with its reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tuner.engine.hardware import describe as describe_hardware
from tuner.errors import UserError
from tuner.study import methods
from tuner.study.config import StudyConfig
from tuner.study.space import candidate_names, find_candidate
from tuner.study.spec import resolve_model, study_models, study_uses_demo

# Study user attribute: {candidate: why pre-flight removed it}, so that the report can say so offline.
REJECTED_ATTR = "preflight_rejected"
# A model-free configuration with a schedule: whether the installed vLLM knows the key at all.
SCHEDULE_PROBE: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 2,
    "prompt_lookup_max": 2,
    "prompt_lookup_min": 1,
    methods.SCHEDULE: [[1, 1, 2], [2, 2, 0]],
}


class Preflight(BaseModel):
    target_path: str
    allowed: list[str]
    rejected: dict[str, str] = {}
    schedule_skipped: str | None = None  # schedule.enabled, but no schedule will be derived: why


def ensure_demo_models(config: StudyConfig) -> None:
    if study_uses_demo(config):
        from tuner.models.demo import needs_wide, prepare_demo

        prepare_demo(log=lambda msg: None, wide=needs_wide(study_models(config)))


def run_preflight(config: StudyConfig) -> Preflight:
    ensure_demo_models(config)
    folders = model_folders(config)
    target_path = resolve_model(config.target.model)
    allowed: list[str] = []
    rejected: dict[str, str] = {}
    on_cpu = not describe_hardware().gpu_count
    for name in candidate_names(config):
        found = find_candidate(config, name)
        reason = cpu_problem(found.extra) if found is not None and on_cpu else None
        if reason is None and found is not None and found.model:
            target_dir, draft_dir = folders[target_path], folders[resolve_model(found.model)]
            if target_dir and draft_dir:  # a hub id the hub could not be asked about is left to the engine
                reason = check_draft_pair(target_dir, draft_dir, config.target.trust_remote_code, found.method)
        if reason:
            rejected[name] = reason
        else:
            allowed.append(name)
    # One vLLM process answers every probe; the checks below read its verdicts.
    engine = engine_args_probe(config)
    _validate(
        [p for _, p in _candidate_probes(config, allowed)]
        + ([engine] if engine else [])
        + ([SCHEDULE_PROBE] if config.schedule.enabled else [])
    )
    verdict = _validate([engine]) if engine else None
    if verdict and verdict[0]:
        how = "`vllm serve --config`" if config.workload.mode == "serve" else "vllm.LLM"
        raise UserError(
            f"target.engine_args: {how} rejects the trials' engine arguments ({verdict[0]}); "
            "fix: use vLLM's engine argument names and values (`vllm serve --help=all`; snake_case here)"
        )
    for name, reason in check_with_vllm(config, allowed).items():
        allowed.remove(name)
        rejected[name] = reason
    if not any(n != "none" and find_candidate(config, n) is not None for n in allowed) and rejected:
        raise UserError(
            "candidates: no speculative candidate passed the pre-flight checks ("
            + "; ".join(f"{k}: {v}" for k, v in rejected.items())
            + "); fix: correct the draft models"
        )
    return Preflight(
        target_path=target_path, allowed=allowed, rejected=rejected, schedule_skipped=check_schedule(config)
    )


def model_folders(config: StudyConfig) -> dict[str, str | None]:
    """Each model's local folder by its resolved reference (None: a hub id the hub could not be asked about
    now), found once for all the checks; a path that does not exist or a hub id that no engine here could
    load stops the study, naming its field."""
    from tuner.study.hub import model_folder

    fields = [("target.model", config.target.model, "give the path of a Hugging Face checkpoint")] + [
        (f"candidates.{index}.model", c.model, "give the path of a draft checkpoint (or demo:NAME)")
        for index, c in enumerate(config.candidates)
        if c.model
    ]
    folders: dict[str, str | None] = {}
    for field, ref, fix in fields:
        path = resolve_model(ref)
        if path not in folders:
            folders[path] = model_folder(field, path, fix)
    return folders


def engine_args_probe(config: StudyConfig) -> dict[str, Any] | None:
    """The baseline's engine arguments (compiled: the ``no-enforce-eager`` form of the served file) as the
    trial's engine takes them; every trial adds only its speculative config, probed on its own. None when
    the study sets no ``engine_args`` (the tuner's own arguments need no check) or trials run a stand-in
    engine (``SPECDEC_TUNER_ENGINE_MODULE``), whose arguments are its own."""
    from tuner.engine.process import DEFAULT_ENGINE_MODULE, engine_module
    from tuner.engine.serve_file import serve_yaml
    from tuner.engine.vllm_checks import LLM_KWARGS, SERVE_FILE
    from tuner.study.spec import baseline_spec, llm_kwargs

    if not config.target.engine_args or engine_module() != DEFAULT_ENGINE_MODULE:
        return None
    # The parser checks no path: a fixed stand-in for the model keeps the probe (and its cached verdict)
    # the same wherever the checkpoint lives.
    kwargs = llm_kwargs(config.target, "MODEL", baseline_spec(False))
    if config.workload.mode == "serve":
        return {SERVE_FILE: serve_yaml(kwargs)}
    return {LLM_KWARGS: sorted(kwargs)}


def schedule_problem(config: StudyConfig) -> tuple[str, str] | None:
    """Why vLLM would reject or ignore a batch-size schedule in this study, and the fix; None: nothing known."""
    if len(config.workload.batch_sizes) < 2:
        return "one batch size: a schedule needs two or more measured levels", "add a level to workload.batch_sizes"
    dp = config.target.engine_args.get("data_parallel_size")
    if isinstance(dp, int) and dp > 1:
        # vllm/config/vllm.py, _maybe_disable_dynamic_sd_for_data_parallel: ranks could pick different k's.
        return (
            f"vLLM drops num_speculative_tokens_per_batch_size when data_parallel_size > 1 (here {dp})",
            "set schedule.enabled: false, or data_parallel_size 1",
        )
    if not any(methods.rules(c.method).batch_schedule for c in config.speculative_candidates()):
        return "no candidate's method takes a batch-size schedule", "set schedule.enabled: false"
    errors = _validate([SCHEDULE_PROBE])
    if errors and errors[0]:
        return (
            f"the installed vLLM rejects num_speculative_tokens_per_batch_size ({errors[0]})",
            "use vLLM 0.25 or later, or set schedule.enabled: false",
        )
    return None


def check_schedule(config: StudyConfig) -> str | None:
    """None when a schedule can be tried; else the one-line note why not, or (a named drafter forces the
    schedule) a UserError."""
    if not config.schedule.enabled:
        return None
    problem = schedule_problem(config)
    if problem is None:
        return None
    text, fix = problem
    if config.schedule.drafter:
        raise UserError(f"schedule: {text}; fix: {fix}")
    return text


def cpu_problem(extra: dict[str, Any]) -> str | None:
    """What vLLM's CPU build cannot run of a candidate's settings, or None."""
    if extra.get("rejection_sample_method") == "synthetic":
        # vllm/utils/cpu_triton_utils.py (0.32), _rejection_greedy_sample_kernel_impl: the C++ kernel has no
        # synthetic mode; the engine starts and fails at the first verified draft.
        return (
            "vLLM on CPU has no synthetic rejection sampling (extra.rejection_sample_method: synthetic; it fails "
            "with 'Synthetic acceptance not supported with CPU sampling'); fix: remove it from extra on CPU"
        )
    return None


def check_draft_pair(
    target: str, draft: str, trust_remote_code: bool, method: methods.Method = "draft_model"
) -> str | None:
    """Reason the draft cannot serve this target, or None. Cheap: tokenizers and configs only (an EAGLE
    head's shapes instead of a tokenizer: tuner.study.heads). Hub ids are checked on their cached or
    downloaded config and tokenizer files; one that cannot be had is left to the engine."""
    from tuner.study.heads import check_head
    from tuner.study.hub import local_checkpoint
    from tuner.study.pair_check import compare_pair

    target_dir, draft_dir = local_checkpoint(target), local_checkpoint(draft)
    if target_dir is None or draft_dir is None or not (Path(target_dir).exists() and Path(draft_dir).exists()):
        return None
    if methods.rules(method).head:
        head = check_head(target_dir, draft_dir, method)
        return None if head.compatible else head.reason
    report = compare_pair(target_dir, draft_dir, trust_remote_code=trust_remote_code, load_weights=False)
    return None if report.compatible else report.reason


def check_with_vllm(config: StudyConfig, names: list[str]) -> dict[str, str]:
    """The corners of each model-free candidate's ranges, built as vLLM ``SpeculativeConfig``s."""
    probes = _candidate_probes(config, names)
    errors = _validate([p for _, p in probes])
    if errors is None:
        return {}
    rejected: dict[str, str] = {}
    for (name, probe), error in zip(probes, errors, strict=True):
        if error and name not in rejected:
            rejected[name] = f"vLLM rejects {probe}: {error}"
    return rejected


def _candidate_probes(config: StudyConfig, names: list[str]) -> list[tuple[str, dict[str, Any]]]:
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
    return probes


# vLLM's verdict on each probe, kept for this process's life (vLLM does not change under it): a
# process that runs several studies (a test session) starts vLLM's check once per new probe.
_VERDICTS: dict[str, str | None] = {}


def _validate(probes: list[dict[str, Any]]) -> list[str | None] | None:
    from tuner.engine.vllm_checks import validate_in_subprocess

    keys = [json.dumps(p, sort_keys=True) for p in probes]
    new = list(dict.fromkeys(k for k in keys if k not in _VERDICTS))
    if new:
        errors = validate_in_subprocess([json.loads(k) for k in new])
        if errors is None:
            return None
        _VERDICTS.update(zip(new, errors, strict=True))
    return [_VERDICTS[k] for k in keys]
