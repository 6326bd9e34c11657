"""Write the best trial as a YAML file that ``vllm serve --config FILE`` accepts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.engine.serve_file import pin_resolved, serve_config, serve_yaml
from tuner.errors import UserError
from tuner.outputs.export_lines import USE_LINE, decision_lines, env_lines, measurement_lines, pinned_lines
from tuner.outputs.export_schedule import render_schedule_export, schedule_lines
from tuner.results import outcome as outcomes
from tuner.results import store
from tuner.results.outcome import StudyOutcome
from tuner.results.scoring import TrialMetrics, apply_reference, level_name

__all__ = ["USE_LINE", "export_best", "render_export", "serve_config"]

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def render_export(study: optuna.Study, outcome: StudyOutcome | None = None) -> str:
    """The study's outcome (tuner.results.outcome) as a ``vllm serve --config`` file with the reasons on top."""
    out = outcome or outcomes.read(study)
    exported = out.exported
    if exported is None:
        raise UserError(f"study '{study.study_name}': {out.reason}")
    if exported.kind == "schedule":
        return render_schedule_export(study, out)
    chosen = study.trials[exported.trial]
    measured = store.trial_metrics(chosen)
    assert measured is not None  # the outcome serves completed trials only
    metrics = apply_reference(measured, out.reference)
    engine = store.trial_record(chosen).engine or {}
    lines = [
        f"# specdec-tuner: best configuration of study '{study.study_name}' (trial {chosen.number})",
        f"# measured {_measured_on(chosen)} on {engine.get('device', '?')}, "
        f"vLLM {engine.get('vllm', '?')}, torch {engine.get('torch', '?')}; exported {dt.date.today().isoformat()}",
        f"# configuration: {exported.label}",
    ]
    lines += measurement_lines(metrics)
    if out.baseline is not None:
        base = store.trial_metrics(study.trials[out.baseline])
        assert base is not None
        lines += _baseline_lines(out, metrics, base)
    if not out.paid:
        lines.append(f"# VERDICT: no speculative configuration {_why_not(out)};")
        lines.append("#          this file serves WITHOUT speculation.")
    elif metrics.spec.acceptance_rate is not None:
        lines.append(
            f"# acceptance rate {metrics.spec.acceptance_rate:.1%}, "
            f"mean acceptance length {metrics.spec.mean_acceptance_length:.2f} (tokens per drafted verification step)"
        )
    lines += decision_lines(out)
    lines += schedule_lines(out)
    lines += pinned_lines(exported.resolved_args, exported.llm_kwargs)
    lines += env_lines(exported.env)
    lines.append(USE_LINE)
    return "\n".join(lines) + "\n" + serve_yaml(pin_resolved(exported.llm_kwargs, exported.resolved_args))


def _why_not(out: StudyOutcome) -> str:
    conf = out.confirmation
    if conf is not None and conf.skipped:
        return "came close enough to the baseline for fresh engines to matter (more than the study's noise below it)"
    if out.confirmed:
        return "beat the baseline beyond the spread between fresh engines"
    return "beat the baseline on this model, hardware and workload"


def _baseline_lines(out: StudyOutcome, metrics: TrialMetrics, base: TrialMetrics) -> list[str]:
    name = level_name(metrics.mode)
    lines = [f"# baseline without speculation: {base.tokens_per_s:.1f} output tokens/s (trial {out.baseline})"]
    if metrics.speedup is not None:
        what = ", the weighted mean of the per-level speedups" if len(metrics.levels) > 1 else ""
        lines.append(f"# speedup over no speculation: {metrics.speedup:.2f}x (in its trial's engine{what})")
    for level in metrics.levels:
        ref = out.reference.get(level.batch_size)
        if ref and level.speedup is not None:
            lines.append(
                f"#   {name} {level.batch_size}: {level.tokens_per_s:.1f} vs {ref:.1f} tokens/s = {level.speedup:.2f}x"
            )
    slo = metrics.slo
    if slo is not None:
        limits = " and ".join(
            f"p{slo.percentile} {what} <= {limit:g} ms"
            for what, limit in (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms))
            if limit is not None
        )
        versus = f" ({metrics.slo_rate_speedup:.2f}x the baseline's)" if metrics.slo_rate_speedup is not None else ""
        cut = " or more (a lower bound: the search stopped at its time limit)" if slo.truncated else ""
        lines.append(f"# SLO {limits}: held up to {slo.max_rate_rps:g} requests/s{cut}{versus}")
        if metrics.objective == "goodput":
            lines.append("# objective: goodput (highest request rate keeping the SLO; ties broken by throughput)")
    return lines


def _measured_on(trial: FrozenTrial) -> str:
    when = trial.datetime_complete or trial.datetime_start
    return when.date().isoformat() if when else "?"


def export_best(study: optuna.Study, output: Path) -> str:
    text = render_export(study)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return text
