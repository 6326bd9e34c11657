"""Write the best trial as a YAML file that ``vllm serve --config FILE`` accepts."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner import study_store as store
from tuner.errors import UserError
from tuner.redaction import is_secret_key
from tuner.scoring import TrialMetrics

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def serve_config(llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments -> ``vllm serve`` config keys (dashes, CLI defaults omitted).

    Credentials (``hf_token`` and the like) are left out: set them in the serving environment.
    """
    out: dict[str, Any] = {}
    for key, value in llm_kwargs.items():
        if key in ("disable_log_stats",) or is_secret_key(key):
            continue
        if isinstance(value, bool) and not value:
            continue  # vLLM 0.26 drops `false` from config files; false is every such flag's default
        out[key.replace("_", "-")] = value
    return out


def _metrics(trial: FrozenTrial) -> TrialMetrics:
    metrics = store.trial_metrics(trial)
    assert metrics is not None
    return metrics


def choose(study: optuna.Study) -> tuple[FrozenTrial, FrozenTrial | None, bool]:
    """(trial to export, baseline, whether speculation paid)."""
    best = store.best_trial(study)
    if best is None:
        raise UserError(
            f"study '{study.study_name}' has no completed trial yet; fix: run `python -m tuner optimize` until one completes"
        )
    baseline = store.best_baseline(study)
    spec = store.trial_spec(best)
    if spec is None or spec.is_baseline or baseline is None:
        return (baseline or best), baseline, False
    return best, baseline, _metrics(best).score > _metrics(baseline).score


def render_export(study: optuna.Study, target_kwargs: dict[str, Any] | None = None) -> str:
    chosen, baseline, paid = choose(study)
    spec = store.trial_spec(chosen)
    metrics = _metrics(chosen)
    engine = chosen.user_attrs.get(store.ENGINE, {})
    kwargs = target_kwargs if target_kwargs is not None else _trial_kwargs(study, chosen)
    lines = [
        f"# specdec-tuner: best configuration of study '{study.study_name}' (trial {chosen.number})",
        f"# measured {_measured_on(chosen)} on {engine.get('device', '?')}, "
        f"vLLM {engine.get('vllm', '?')}, torch {engine.get('torch', '?')}; exported {dt.date.today().isoformat()}",
    ]
    label = spec.label() if spec else f"trial {chosen.number}"
    lines.append(f"# configuration: {label}")
    if len(metrics.levels) > 1:
        weights = ", ".join(f"batch {lv.batch_size}: {lv.weight:.2f}" for lv in metrics.levels)
        lines.append(
            f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s, the weighted mean over batch sizes "
            f"({weights}) of each level's median; per level below"
        )
    else:
        lines.append(f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s (median of repeats)")
    if baseline is not None:
        base = _metrics(baseline)
        lines.append(
            f"# baseline without speculation: {base.tokens_per_s:.1f} output tokens/s (trial {baseline.number})"
        )
        ratio = metrics.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
        lines.append(f"# speedup over no speculation: {ratio:.2f}x")
        for level in metrics.levels:
            bl = base.level(level.batch_size)
            if bl and bl.tokens_per_s:
                lines.append(
                    f"#   batch {level.batch_size}: {level.tokens_per_s:.1f} vs {bl.tokens_per_s:.1f} tokens/s "
                    f"= {level.tokens_per_s / bl.tokens_per_s:.2f}x"
                )
    if not paid:
        lines.append("# VERDICT: no speculative configuration beat the baseline on this model, hardware and workload;")
        lines.append("#          this file serves WITHOUT speculation.")
    elif metrics.spec.acceptance_rate is not None:
        lines.append(
            f"# acceptance rate {metrics.spec.acceptance_rate:.1%}, "
            f"mean acceptance length {metrics.spec.mean_acceptance_length:.2f}"
        )
    lines.append("# use: vllm serve --config THIS_FILE")
    body = yaml.safe_dump(serve_config(kwargs), sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def _measured_on(trial: FrozenTrial) -> str:
    when = trial.datetime_complete or trial.datetime_start
    return when.date().isoformat() if when else "?"


def _trial_kwargs(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """The exact engine arguments of a trial, as the runner built them."""
    raw = trial.user_attrs.get(store.LLM_KWARGS)
    if raw is None:
        raise UserError(f"trial {trial.number} of study '{study.study_name}' has no recorded engine arguments")
    return dict(raw)


def export_best(study: optuna.Study, output: Path) -> str:
    text = render_export(study)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return text
