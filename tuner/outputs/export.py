"""Write the best trial as a YAML file that ``vllm serve --config FILE`` accepts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.engine.serve_file import serve_config, serve_yaml
from tuner.errors import UserError
from tuner.results import store
from tuner.results.choice import choose
from tuner.results.scoring import TrialMetrics, level_name
from tuner.trial import confirm

__all__ = ["choose", "export_best", "render_export", "serve_config"]  # choose: report.py imports it from here
# vllm serve listens on every interface unless told otherwise.
USE_LINE = "# use: vllm serve --config THIS_FILE --host 127.0.0.1 (elsewhere: also --api-key KEY)"

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def _metrics(trial: FrozenTrial) -> TrialMetrics:
    metrics = store.trial_metrics(trial)
    assert metrics is not None
    return metrics


def _scored(study: optuna.Study, trial: FrozenTrial) -> TrialMetrics:
    metrics = store.scored_metrics(study, trial)
    assert metrics is not None
    return metrics


def render_export(study: optuna.Study, target_kwargs: dict[str, Any] | None = None) -> str:
    from tuner.outputs.export_schedule import render_schedule_export, schedule_lines
    from tuner.trial import schedule_check

    run = schedule_check.current(study)
    if run is not None and run.exported and target_kwargs is None:
        return render_schedule_export(study, run)
    chosen, baseline, paid = choose(study)
    spec = store.trial_spec(chosen)
    metrics = _scored(study, chosen)
    engine = store.trial_record(chosen).engine or {}
    kwargs = target_kwargs if target_kwargs is not None else _trial_kwargs(study, chosen)
    lines = [
        f"# specdec-tuner: best configuration of study '{study.study_name}' (trial {chosen.number})",
        f"# measured {_measured_on(chosen)} on {engine.get('device', '?')}, "
        f"vLLM {engine.get('vllm', '?')}, torch {engine.get('torch', '?')}; exported {dt.date.today().isoformat()}",
    ]
    label = spec.label() if spec else f"trial {chosen.number}"
    lines.append(f"# configuration: {label}")
    lines += measurement_lines(metrics)
    if baseline is not None:
        lines += _baseline_lines(study, metrics, _metrics(baseline), baseline.number)
    conf = confirm.current(study)
    if not paid:
        if conf is not None and conf.skipped:
            why = "came within the study's noise of the baseline"
        elif conf is not None and conf.complete:
            why = "beat the baseline beyond the spread between fresh engines"
        else:
            why = "beat the baseline on this model, hardware and workload"
        lines.append(f"# VERDICT: no speculative configuration {why};")
        lines.append("#          this file serves WITHOUT speculation.")
    elif metrics.spec.acceptance_rate is not None:
        lines.append(
            f"# acceptance rate {metrics.spec.acceptance_rate:.1%}, "
            f"mean acceptance length {metrics.spec.mean_acceptance_length:.2f} (tokens per drafted verification step)"
        )
    lines += confirmation_lines(study)
    lines += schedule_lines(study)
    lines.append(USE_LINE)
    return "\n".join(lines) + "\n" + serve_yaml(kwargs)


def measurement_lines(metrics: TrialMetrics) -> list[str]:
    name = level_name(metrics.mode)
    sampling = metrics.sampling
    lines = []
    if metrics.mode == "serve":
        lines.append(
            "# measured served: vllm serve under vllm bench serve load, at most "
            + ", ".join(str(lv.batch_size) for lv in metrics.levels)
            + " requests in flight"
        )
    if sampling:
        top_p = sampling.get("top_p")
        lines.append(
            f"# sampling sent with every request: temperature {sampling.get('temperature')}, "
            f"top_p {top_p if top_p is not None else '1.0 (vLLM default)'}, max_tokens {sampling.get('max_tokens')}"
        )
    if len(metrics.levels) > 1:
        weights = ", ".join(f"{name} {lv.batch_size}: {lv.weight:.2f}" for lv in metrics.levels)
        lines.append(
            f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s, the weighted mean over {name} levels "
            f"({weights}) of each level's median; per level below"
        )
    else:
        lines.append(f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s (median of repeats)")
    return lines


def _baseline_lines(study: optuna.Study, metrics: TrialMetrics, base: TrialMetrics, number: int) -> list[str]:
    name = level_name(metrics.mode)
    lines = [f"# baseline without speculation: {base.tokens_per_s:.1f} output tokens/s (trial {number})"]
    if metrics.speedup is not None:
        what = " (the weighted mean of the per-level speedups)" if len(metrics.levels) > 1 else ""
        lines.append(f"# speedup over no speculation: {metrics.speedup:.2f}x{what}")
    reference = store.reference(study)
    for level in metrics.levels:
        ref = reference.get(level.batch_size)
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
        cut = ", search stopped by its time limit" if slo.truncated else ""
        lines.append(f"# SLO {limits}: held up to {slo.max_rate_rps:g} requests/s{versus}{cut}")
        if metrics.objective == "goodput":
            lines.append("# objective: goodput (highest request rate keeping the SLO; ties broken by throughput)")
    return lines


def confirmation_lines(study: optuna.Study) -> list[str]:
    conf = confirm.current(study)
    if conf is None:
        if not confirm._speculative_finalists(study, 1):
            return []
        return ["# not confirmed in fresh engines: the choice rests on one engine per configuration"]
    return [f"# {line}" for line in conf.summary_lines()]


def _measured_on(trial: FrozenTrial) -> str:
    when = trial.datetime_complete or trial.datetime_start
    return when.date().isoformat() if when else "?"


def _trial_kwargs(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """The exact engine arguments of a trial, as the runner built them."""
    raw = store.trial_record(trial).llm_kwargs
    if raw is None:
        raise UserError(f"trial {trial.number} of study '{study.study_name}' has no recorded engine arguments")
    return dict(raw)


def export_best(study: optuna.Study, output: Path) -> str:
    text = render_export(study)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return text
