"""Export lines of the batch-size schedule: the whole file when the schedule passed its validation,
else the lines that say why the static configuration is served."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from tuner.engine.serve_file import pin_resolved, serve_yaml
from tuner.outputs.export_lines import USE_LINE, decision_lines, env_lines, measurement_lines, pinned_lines
from tuner.results.outcome import StudyOutcome
from tuner.results.schedule import RULE, VALIDATION_RULE, LevelCheck, LevelChoice, StaticBest
from tuner.results.schedule_run import ScheduleRun
from tuner.results.scoring import level_name
from tuner.study import methods

if TYPE_CHECKING:
    import optuna


def render_schedule_export(study: optuna.Study, out: StudyOutcome) -> str:
    """The file for a validated schedule: the drafter's engine arguments with k by batch size."""
    run = out.schedule
    assert run is not None
    schedule, verdict, metrics = run.schedule, run.verdict, run.metrics
    assert schedule is not None and verdict is not None and metrics is not None and run.llm_kwargs is not None
    name = level_name(metrics.mode)
    engine = run.engine
    lines = [
        f"# specdec-tuner: best configuration of study '{study.study_name}': a {name}-size schedule of k",
        f"# validated {run.measured_on or '?'} on {engine.get('device', '?')}, vLLM {engine.get('vllm', '?')}, "
        f"torch {engine.get('torch', '?')}; exported {dt.date.today().isoformat()}",
        f"# configuration: {schedule.drafter}, num_speculative_tokens by {name} size: {schedule.text()} "
        "(k=0: no speculation)",
        f"# (num_speculative_tokens {schedule.max_k} is the largest k; vLLM picks each step's k by its {name} size)",
    ]
    lines += measurement_lines(metrics)
    if metrics.speedup is not None:
        lines.append(f"# speedup over no speculation in the validation engine: {metrics.speedup:.2f}x (weighted)")
    lines += level_lines(run)
    lines.append(f"# validation in fresh engines: {verdict.reason}: the schedule is exported")
    lines += caveat_lines(run)
    lines += decision_lines(out)
    exported = out.exported
    assert exported is not None
    lines += pinned_lines(exported.resolved_args, exported.llm_kwargs)
    lines += env_lines(exported.env)
    lines.append(USE_LINE)
    return "\n".join(lines) + "\n" + serve_yaml(pin_resolved(exported.llm_kwargs, exported.resolved_args))


def level_lines(run: ScheduleRun) -> list[str]:
    """Per level: the k chosen from the trials and its measured speedup, then the validation engine's figure."""
    schedule = run.schedule
    if schedule is None:
        return []
    name = level_name(run.metrics.mode if run.metrics is not None else "offline")
    checks = {c.level: c for c in run.verdict.levels} if run.verdict is not None else {}
    lines = [f"# per {name} size: the k chosen from the trials (its speedup there), then the validation engine"]
    for choice in schedule.levels:
        lines.append(f"#   {name} {choice.level}: {choice_text(choice)}{_check_text(checks.get(choice.level))}")
    lines.append(f"# rules: {RULE}; the last range runs to {schedule.cap}; {VALIDATION_RULE}")
    return lines


def k_text(k: int) -> str:
    return f"k={k}" if k else "k=0 (no speculation)"


def choice_text(choice: LevelChoice) -> str:
    """A level's chosen k with the trial that chose it: ``k=3 (trial 1: 140.0 tok/s, 1.40x)``."""
    return f"{k_text(choice.k)} ({choice_source(choice)})"


def choice_source(choice: LevelChoice) -> str:
    """The trial measurement that chose a level's k: ``trial 1: 140.0 tok/s, 1.40x``."""
    speed = f", {choice.speedup:.2f}x" if choice.speedup is not None else ""
    return f"trial {choice.trial}: {choice.tokens_per_s:.1f} tok/s{speed}"


def validation_text(check: LevelCheck) -> str:
    """The validation engine at one level: ``151.2 tok/s = 1.40x``."""
    speed = f" = {check.speedup:.2f}x" if check.speedup is not None else ""
    return f"{check.tokens_per_s:.1f} tok/s{speed}"


def static_text(best: StaticBest) -> str:
    """The best static configuration at one level: ``150.0 (ngram k=3, trial 1)``."""
    return f"{best.tokens_per_s:.1f} ({best.label}, trial {best.trial})"


def within_text(check: LevelCheck) -> str:
    return f"{'within' if check.within else 'NOT within'} noise ({check.noise:.0%})"


def _check_text(check: LevelCheck | None) -> str:
    if check is None:
        return ""
    return (
        f"; validation {validation_text(check)} vs best static {static_text(check.best_static)}: {within_text(check)}"
    )


def caveat_lines(run: ScheduleRun) -> list[str]:
    """What vLLM does differently under a schedule; the validation engine measured it, the trials did not."""
    kwargs = run.llm_kwargs or {}
    spec = kwargs.get("speculative_config") or {}
    lines = []
    if kwargs.get("enforce_eager") is False:
        lines += _graph_lines(run.engine)
    if run.schedule is not None and any(r.k == 0 for r in run.schedule.ranges):
        lines += _k0_lines(spec)
    return lines


def _graph_lines(engine: dict[str, str]) -> list[str]:
    """The CUDA graphs the schedule's validation engine ran, where they are not the compiled default. vLLM's V1
    runner forces PIECEWISE under a schedule (vLLM 0.26: about 30% lost at batch 64); V2 keeps FULL_AND_PIECEWISE
    (vLLM 0.32, 2026-12-07). Not yet measured: what V1 would do, as a condition."""
    mode, runner = engine.get("cudagraph_mode"), engine.get("model_runner")
    if mode is None:
        return ["# note: with a schedule vLLM's V1 model runner captures the target's CUDA graphs PIECEWISE, not FULL"]
    if "FULL" in mode:
        return []
    on = f"vLLM's {runner} model runner" if runner else "vLLM"
    return [f"# note: with the schedule {on} captured the target's CUDA graphs {mode}, not FULL (validation engine)"]


def _k0_lines(spec: dict[str, Any]) -> list[str]:
    """What still runs at k=0. vLLM 0.32 runs the drafter's first (prefill) pass before it looks at k, in both
    runners (vllm/v1/spec_decode/llm_base_proposer.py propose: "No draft tokens requested ... The prefill
    forward pass above already ran"; vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py
    propose). A head's pass reads the target's hidden states, so the target keeps handing them over too."""
    method = spec.get("method")
    if method in methods.METHODS and methods.rules(method).head:
        return [
            f"# note: at k=0 the {method} head still runs its first pass each step on the target's hidden states "
            "(vLLM keeps the head's KV cache in sync); it drafts nothing"
        ]
    if spec.get("model"):
        return ["# note: at k=0 a draft model still runs its first pass each step (vLLM keeps its KV cache)"]
    return []


def schedule_lines(out: StudyOutcome) -> list[str]:
    """For the static export: what became of the schedule, when one was asked for."""
    run = out.schedule
    if run is None:
        return []
    lines = [f"# {run.outcome()}"]
    if run.schedule is not None and run.verdict is not None:
        lines += level_lines(run)
    lines += [f"# {line}" for line in static_answer_lines(run, out.mode)]
    return lines


def static_answer_lines(run: ScheduleRun, mode: str = "offline") -> list[str]:
    """Without a schedule, why one k everywhere: per level the chosen k against the drafter's fastest k."""
    derivation = run.derivation
    if run.schedule is not None or not derivation.levels:
        return []
    name = level_name(mode)
    lines = [f"per {name} size, the k chosen against {derivation.drafter or 'the drafter'}'s fastest k there:"]
    for choice in derivation.levels:
        line = f"  {name} {choice.level}: {choice_text(choice)}"
        if choice.best_spec_k is not None and choice.best_spec_tokens_per_s is not None and choice.k == 0:
            speed = f" = {choice.best_spec_speedup:.2f}x" if choice.best_spec_speedup is not None else ""
            line += f"; fastest k={choice.best_spec_k}: {choice.best_spec_tokens_per_s:.1f} tok/s{speed}"
        lines.append(f"{line}; noise {choice.noise:.0%}")
    lines.append(f"rule: {RULE}")
    return lines
