"""``tuner report``: which configuration won, how much faster it is, and why — from the study alone.

The report is built from the Optuna storage (each trial's ``spec``, ``metrics``, failure and pruning
attributes), so it works offline and long after the MLflow server is gone. Two renderings:

* HTML: one self-contained file (inline CSS, plots as base64 PNG, no JavaScript, nothing fetched);
* Markdown: the same tables and explanation, to paste into a pull request.

``log_study_artifacts`` attaches both, and the best configuration, to the study's MLflow parent run.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner import study_store as store
from tuner.errors import UserError
from tuner.redaction import redact
from tuner.scoring import TrialMetrics
from tuner.trial_spec import TrialSpec

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study_config import StudyConfig
    from tuner.tracking import Tracker

FORMATS = ("html", "md")
REPORT_ARTIFACT = "report.html"
MARKDOWN_ARTIFACT = "report.md"
CONFIG_ARTIFACT = "best_config.yaml"
BEST_TAG = "best"
# Normalised settings the importances are computed over (Optuna's own parameter names are per candidate).
FEATURES = ("candidate", "num_speculative_tokens", "enforce_eager", "prompt_lookup_max", "prompt_lookup_min")
LOW_ACCEPTANCE = 0.2


# -- the data -----------------------------------------------------------------------------------------
@dataclass
class TrialRow:
    """One Optuna trial, with what the tuner recorded on it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    spec: TrialSpec | None
    metrics: TrialMetrics | None
    reason: str = ""
    partial_tokens_per_s: float | None = None
    duplicate_of: int | None = None
    mlflow_run_id: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    speedup: float | None = None  # against the study's best baseline (not the one current when measured)

    @property
    def label(self) -> str:
        return self.spec.label() if self.spec else f"trial {self.number}"

    @property
    def candidate(self) -> str:
        return self.spec.candidate if self.spec else "?"

    @property
    def measured(self) -> bool:
        """Completed with its own engine (not a reused duplicate)."""
        return self.metrics is not None and self.duplicate_of is None


@dataclass
class LevelRow:
    batch_size: int
    tokens_per_s: float
    baseline_tokens_per_s: float | None
    speedup: float | None
    ttft_s: float | None
    baseline_ttft_s: float | None
    tpot_s: float | None
    baseline_tpot_s: float | None
    lossless: float | None


@dataclass
class CandidateSummary:
    name: str
    method: str
    trials: int
    completed: int
    pruned: int
    failed: int
    best: TrialRow | None
    verdict: str


@dataclass
class StudyReport:
    study_name: str
    storage: str
    generated: str
    rows: list[TrialRow]
    chosen: TrialRow | None  # what `tuner export` writes
    baseline: TrialRow | None
    paid: bool
    featured: TrialRow | None  # the best speculative trial (the chosen one when speculation paid)
    headline: str
    why: list[str]
    levels: list[LevelRow]
    candidates: list[CandidateSummary]
    best_config: str | None
    best_config_note: str
    importances: dict[str, float] | None
    importance_note: str
    settings: dict[str, str]
    engine: dict[str, Any]


def collect_rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of the study, with its recorded settings, metrics and the reason it did not complete."""
    trials = study.get_trials(deepcopy=False)
    retried_by = {
        int(t.user_attrs[store.RETRY_OF]): t.number for t in trials if t.user_attrs.get(store.RETRY_OF) is not None
    }
    rows = [_row(t, retried_by.get(t.number)) for t in trials]
    base = _best_baseline(rows)
    for row in rows:
        row.speedup = _speedup(row, base)
    return rows


def _row(t: FrozenTrial, retried_as: int | None) -> TrialRow:
    attrs = t.user_attrs
    try:
        spec = store.trial_spec(t)
    except ValueError:
        spec = None
    try:
        metrics = store.trial_metrics(t) if t.state.name == "COMPLETE" else None
    except ValueError:
        metrics = None
    duplicate = attrs.get(store.DUPLICATE_OF)
    partial = None
    if t.intermediate_values:
        partial = float(t.intermediate_values[max(t.intermediate_values)])
    state = t.state.name
    reason = ""
    if state == "FAIL":
        failure = attrs.get(store.FAILURE) or "failed"
        error = str(attrs.get(store.ERROR, "")).strip().splitlines()
        reason = f"{failure}: {error[0][:300]}" if error else str(failure)
        if retried_as is not None:
            reason += f"; retried as trial {retried_as}"
    elif state == "PRUNED":
        reason = "pruned: " + str(attrs.get(store.PRUNED_REASON) or "below the study's other trials")
    elif state == "WAITING":
        reason = "queued, not run (the budget was reached first)"
    elif state == "RUNNING":
        reason = "running, or its process died (the next `optimize` retries it)"
    elif duplicate is not None:
        reason = f"same configuration as trial {duplicate}; its result was reused"
    if metrics is not None:
        rates = [lv.lossless_match_rate for lv in metrics.levels if lv.lossless_match_rate is not None]
        if rates and min(rates) < 1.0 and spec is not None and not spec.is_baseline:
            note = f"output differs from the baseline on {1 - min(rates):.0%} of prompts"
            reason = f"{reason}; {note}" if reason else note
    if attrs.get(store.RETRY_OF) is not None:
        note = f"retry of trial {attrs[store.RETRY_OF]}"
        reason = f"{reason}; {note}" if reason else note
    return TrialRow(
        number=t.number,
        state=state,
        spec=spec,
        metrics=metrics,
        reason=reason,
        partial_tokens_per_s=partial,
        duplicate_of=int(duplicate) if duplicate is not None else None,
        mlflow_run_id=attrs.get(store.MLFLOW_RUN),
        engine=dict(attrs.get(store.ENGINE) or {}),
    )


def _best_baseline(rows: Sequence[TrialRow]) -> TrialRow | None:
    bases = [r for r in rows if r.metrics is not None and r.spec is not None and r.spec.is_baseline]
    return max(bases, key=lambda r: r.metrics.score if r.metrics else -math.inf, default=None)


def _speedup(row: TrialRow, base: TrialRow | None) -> float | None:
    if row.metrics is None or base is None or base.metrics is None or not base.metrics.tokens_per_s:
        return None
    return row.metrics.tokens_per_s / base.metrics.tokens_per_s


def _best(rows: Sequence[TrialRow]) -> TrialRow | None:
    scored = [r for r in rows if r.metrics is not None]
    return max(scored, key=lambda r: r.metrics.score if r.metrics else -math.inf, default=None)


# -- importances --------------------------------------------------------------------------------------
def _features(spec: TrialSpec) -> dict[str, Any]:
    return {
        "candidate": spec.candidate,
        "num_speculative_tokens": spec.num_speculative_tokens or 0,
        "enforce_eager": spec.enforce_eager,
        "prompt_lookup_max": spec.prompt_lookup_max or 0,
        "prompt_lookup_min": spec.prompt_lookup_min or 0,
    }


def param_importances(rows: Sequence[TrialRow]) -> tuple[dict[str, float] | None, str]:
    """fANOVA importances of the normalised settings for the score, or ``None`` and why not.

    Optuna's own parameters are per candidate (``ngram.num_speculative_tokens``) and mostly absent
    from other candidates' trials, so the importances are computed over the settings every trial has
    (``num_speculative_tokens`` is 0 without speculation; lookup sizes are 0 outside n-gram).
    """
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

    points = [r for r in rows if r.measured and r.spec is not None and r.metrics is not None]
    if len(points) < 2:
        return None, f"Parameter importances need at least 2 completed trials; this study has {len(points)}."
    feats = [_features(r.spec) for r in points if r.spec is not None]
    varying = [k for k in FEATURES if len({f[k] for f in feats}) >= 2]
    if not varying:
        return None, "Every completed trial has the same settings; importances need settings that vary."
    scores = [r.metrics.score for r in points if r.metrics is not None]
    if max(scores) - min(scores) <= 0:
        return None, "Every completed trial has the same score; no setting explains a difference."
    dists: dict[str, BaseDistribution] = {}
    for key in varying:
        choices = sorted({f[key] for f in feats}, key=str)
        if isinstance(choices[0], bool | str):
            dists[key] = CategoricalDistribution(choices)
        else:
            dists[key] = IntDistribution(min(choices), max(choices))
    trials = [
        optuna.trial.create_trial(params={k: f[k] for k in varying}, distributions=dists, value=score)
        for f, score in zip(feats, scores, strict=True)
    ]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="maximize")
        study.add_trials(trials)
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        values = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except Exception as exc:  # small or degenerate studies: say so instead of failing the report
        return None, f"Parameter importances could not be computed ({type(exc).__name__}: {exc})."
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {k: float(v) for k, v in values.items()}, ""


# -- building the report ------------------------------------------------------------------------------
def build_report(study: optuna.Study, config: StudyConfig | None = None, storage: str = "") -> StudyReport:
    from tuner.export import choose, render_export

    config = config or _config_from_study(study)
    rows = collect_rows(study)
    by_number = {r.number: r for r in rows}
    baseline = _best_baseline(rows)
    best = _best(rows)
    speculative = _best([r for r in rows if r.spec is not None and not r.spec.is_baseline])
    paid = bool(
        best is not None
        and best.spec is not None
        and not best.spec.is_baseline
        and baseline is not None
        and best.metrics is not None
        and baseline.metrics is not None
        and best.metrics.score > baseline.metrics.score
    )
    chosen = best if paid or baseline is None else baseline
    best_config: str | None = None
    note = ""
    try:
        best_config = render_export(study)
        chosen = by_number.get(choose(study)[0].number, chosen)  # the trial the exported YAML holds
    except UserError as exc:  # no completed trial (or no recorded engine arguments)
        note = str(exc)
    featured = chosen if paid else speculative
    candidates = _candidate_summaries(rows, config)
    importances, importance_note = param_importances(rows)
    engine = next((r.engine for r in (chosen, featured, best) if r is not None and r.engine), {})
    report = StudyReport(
        study_name=study.study_name,
        storage=_safe_url(storage),
        generated=dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        rows=rows,
        chosen=chosen,
        baseline=baseline,
        paid=paid,
        featured=featured,
        headline="",
        why=[],
        levels=_levels(featured or chosen, baseline),
        candidates=candidates,
        best_config=best_config,
        best_config_note=note,
        importances=importances,
        importance_note=importance_note,
        settings=_settings(config),
        engine=engine,
    )
    report.headline = _headline(report)
    report.why = _explain(report, config)
    return report


def _config_from_study(study: optuna.Study) -> StudyConfig | None:
    """The study file stored with the study (prompts paths may not resolve here; only settings are shown)."""
    import yaml
    from pydantic import ValidationError

    from tuner.study_config import StudyConfig

    text = study.user_attrs.get(store.STUDY_FILE)
    if not text:
        return None
    try:
        return StudyConfig.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError, TypeError):
        return None


def _levels(row: TrialRow | None, base: TrialRow | None) -> list[LevelRow]:
    if row is None or row.metrics is None:
        return []
    out = []
    for lv in row.metrics.levels:
        bl = base.metrics.level(lv.batch_size) if base is not None and base.metrics is not None else None
        out.append(
            LevelRow(
                batch_size=lv.batch_size,
                tokens_per_s=lv.tokens_per_s,
                baseline_tokens_per_s=bl.tokens_per_s if bl else None,
                speedup=lv.tokens_per_s / bl.tokens_per_s if bl and bl.tokens_per_s else None,
                ttft_s=lv.ttft_median_s,
                baseline_ttft_s=bl.ttft_median_s if bl else None,
                tpot_s=lv.tpot_median_s,
                baseline_tpot_s=bl.tpot_median_s if bl else None,
                lossless=lv.lossless_match_rate,
            )
        )
    return out


def _candidate_summaries(rows: Sequence[TrialRow], config: StudyConfig | None) -> list[CandidateSummary]:
    names: list[str] = [c.name for c in config.candidates] if config is not None else []
    methods: dict[str, str] = {c.name: c.method for c in config.candidates} if config is not None else {}
    for r in rows:
        if r.spec is not None and r.spec.candidate not in names:
            names.append(r.spec.candidate)
            methods[r.spec.candidate] = r.spec.method
    out = []
    for name in names:
        own = [r for r in rows if r.spec is not None and r.spec.candidate == name and r.duplicate_of is None]
        best = _best(own)
        summary = CandidateSummary(
            name=name,
            method=methods.get(name, "?"),
            trials=len(own),
            completed=sum(1 for r in own if r.metrics is not None),
            pruned=sum(1 for r in own if r.state == "PRUNED"),
            failed=sum(1 for r in own if r.state == "FAIL"),
            best=best,
            verdict="",
        )
        summary.verdict = _verdict(summary, own)
        out.append(summary)
    return out


def _verdict(c: CandidateSummary, own: Sequence[TrialRow]) -> str:
    if c.method == "none":
        return (
            "the reference every speedup is measured against" if c.best else "not measured: no speedup can be computed"
        )
    best = c.best
    if best is None or best.metrics is None:
        if c.failed:
            classes = sorted({r.reason.split(":", 1)[0] for r in own if r.state == "FAIL"})
            return f"no trial completed: {c.failed} failed ({', '.join(classes)})"
        if c.pruned:
            first = next(r.reason for r in own if r.state == "PRUNED")
            return f"no trial completed: {c.pruned} pruned ({first.removeprefix('pruned: ')})"
        return "not measured (the sampler never chose it within the budget)"
    rate = best.metrics.spec.acceptance_rate
    accepted = f"{rate:.0%} of drafted tokens accepted" if rate is not None else "no acceptance counters"
    if best.speedup is None:
        text = f"{accepted}; no baseline to compare with"
    elif best.speedup > 1.0:
        text = f"{best.speedup:.2f}× faster than no speculation at best; {accepted}"
    elif rate is not None and rate < LOW_ACCEPTANCE:
        text = f"slower ({best.speedup:.2f}× at best): drafts are rarely accepted ({accepted}), verifying them is wasted work"
    else:
        text = f"slower ({best.speedup:.2f}× at best): {accepted}, but drafting and verifying cost more than they save"
    failed = [r for r in own if r.state == "FAIL"]
    if failed:
        ks = ", ".join(
            f"k={r.spec.num_speculative_tokens}: {r.reason.split(':', 1)[0]}" for r in failed if r.spec is not None
        )
        text += f"; {len(failed)} failed ({ks})"
    return text


def _headline(r: StudyReport) -> str:
    if not r.rows:
        return f"Study '{r.study_name}' has no trials yet: run `python -m tuner optimize` first."
    if r.chosen is None or r.chosen.metrics is None:
        return f"No trial of study '{r.study_name}' completed yet, so there is no best configuration."
    base = r.baseline
    if base is None or base.metrics is None:
        return (
            f"Best measured configuration: {r.chosen.label} (trial {r.chosen.number}) at "
            f"{r.chosen.metrics.tokens_per_s:.1f} output tokens/s; no baseline without speculation completed, "
            "so its speedup is unknown."
        )
    if r.featured is None:
        return (
            f"No speculative configuration completed yet; without speculation the target runs at "
            f"{base.metrics.tokens_per_s:.1f} output tokens/s ({base.label}, trial {base.number})."
        )
    if r.paid and r.chosen.speedup is not None:
        return (
            f"Use {r.chosen.label} (trial {r.chosen.number}): {r.chosen.speedup:.2f}× the throughput of no speculation "
            f"({r.chosen.metrics.tokens_per_s:.1f} against {base.metrics.tokens_per_s:.1f} output tokens/s)."
        )
    tail = ""
    if r.featured is not None and r.featured.speedup is not None:
        tail = f" The best speculative configuration, {r.featured.label} (trial {r.featured.number}), reached {r.featured.speedup:.2f}×."
    return (
        f"Serve without speculation: no speculative configuration beat the baseline "
        f"({base.metrics.tokens_per_s:.1f} output tokens/s, {base.label}).{tail}"
    )


def _explain(r: StudyReport, config: StudyConfig | None) -> list[str]:
    """Plain sentences that answer "why": acceptance, k, batch sizes, other candidates, start-up, failures."""
    why: list[str] = []
    feat = r.featured
    if feat is not None and feat.metrics is not None and feat.spec is not None:
        s = feat.metrics.spec
        k = feat.spec.num_speculative_tokens
        if s.acceptance_rate is not None and s.mean_acceptance_length is not None:
            why.append(
                f"{feat.label}: {s.acceptance_rate:.0%} of {s.draft_tokens} drafted tokens were accepted, so each "
                f"target forward pass emitted {s.mean_acceptance_length:.2f} tokens on average instead of 1 "
                f"(k={k} drafted per step)."
            )
        rates = s.per_position_rate
        if len(rates) >= 2:
            text = ", ".join(f"{x:.0%}" for x in rates)
            sentence = f"Acceptance by draft position 1–{len(rates)}: {text}"
            weak = next((i for i, x in enumerate(rates) if x < 0.1), None)
            if weak is not None:
                sentence += (
                    f"; from position {weak + 1} on drafts are rarely accepted, so a larger k mostly adds drafting cost"
                )
            why.append(sentence + ".")
        siblings = _per_k(r.rows, feat.spec.candidate)
        if len(siblings) >= 2:
            parts = [f"k={kk}: {sp:.2f}×" for kk, sp in siblings.items()]
            why.append(f"{feat.spec.candidate} at other num_speculative_tokens (best trial each): {', '.join(parts)}.")
        if len(r.levels) >= 2 and all(lv.speedup is not None for lv in r.levels):
            parts = [f"batch {lv.batch_size}: {lv.speedup:.2f}×" for lv in r.levels]
            sentence = f"Speedup by batch size: {', '.join(parts)}"
            ups = [lv.speedup for lv in r.levels if lv.speedup is not None]
            if max(ups) > 1.0 > min(ups):
                sentence += (
                    "; speculation pays where the target is memory-bound (small batches) and costs throughput where "
                    "it is already compute-bound (large batches)"
                )
            weights = ""
            if config is not None and config.workload.batch_weights:
                ws = ", ".join(
                    f"{b}: {w:.2f}" for b, w in zip(config.workload.batch_sizes, config.workload.weights(), strict=True)
                )
                weights = f" The score weights the batch sizes as {ws}."
            why.append(sentence + "." + weights)
        lossless = [lv.lossless for lv in r.levels if lv.lossless is not None]
        if lossless and min(lossless) == 1.0:
            why.append(f"At temperature 0 {feat.label} produced exactly the baseline's tokens on every prompt.")
        elif lossless:
            why.append(
                f"Careful: at temperature 0 {feat.label}'s output differed from the baseline's on "
                f"{1 - min(lossless):.0%} of prompts."
            )
    for c in r.candidates:
        if c.method == "none" or (feat is not None and feat.spec is not None and c.name == feat.spec.candidate):
            continue
        why.append(f"{c.name}: {c.verdict}.")
    why += _eager_sentences(r.rows)
    counts = {s: sum(1 for row in r.rows if row.state == s) for s in ("COMPLETE", "PRUNED", "FAIL")}
    if counts["PRUNED"] or counts["FAIL"]:
        classes: dict[str, int] = {}
        for row in r.rows:
            if row.state == "FAIL":
                key = row.reason.split(":", 1)[0]
                classes[key] = classes.get(key, 0) + 1
        fails = ", ".join(f"{n}× {k}" for k, n in classes.items())
        why.append(
            f"{len(r.rows)} trials: {counts['COMPLETE']} completed, {counts['PRUNED']} pruned early, "
            f"{counts['FAIL']} failed" + (f" ({fails})" if fails else "") + "; the trials table gives each reason."
        )
    return why


def _per_k(rows: Sequence[TrialRow], candidate: str) -> dict[int, float]:
    best: dict[int, float] = {}
    for r in rows:
        if (
            r.spec is None
            or r.spec.candidate != candidate
            or r.speedup is None
            or r.spec.num_speculative_tokens is None
        ):
            continue
        k = r.spec.num_speculative_tokens
        best[k] = max(r.speedup, best.get(k, -math.inf))
    return dict(sorted(best.items()))


def _eager_sentences(rows: Sequence[TrialRow]) -> list[str]:
    measured = [r for r in rows if r.measured and r.spec is not None and r.metrics is not None]
    starts = {
        eager: [r.metrics.engine_start_s for r in measured if r.spec and r.metrics and r.spec.enforce_eager == eager]
        for eager in (True, False)
    }
    if not starts[True] or not starts[False]:
        return []
    bases = {
        eager: max(
            (
                r.metrics.tokens_per_s
                for r in measured
                if r.spec and r.metrics and r.spec.is_baseline and r.spec.enforce_eager == eager
            ),
            default=None,
        )
        for eager in (True, False)
    }
    sentence = (
        f"Engine start: {_median(starts[True]):.1f} s eager against {_median(starts[False]):.1f} s compiled "
        "(enforce_eager=false captures graphs / compiles first)"
    )
    eager_base, compiled_base = bases[True], bases[False]
    if eager_base and compiled_base:
        sentence += f"; without speculation compiled mode ran at {compiled_base / eager_base:.2f}× eager's throughput"
    return [sentence + "."]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _settings(config: StudyConfig | None) -> dict[str, str]:
    if config is None:
        return {}
    w = config.workload
    weights = ", ".join(f"{b}: {x:.2f}" for b, x in zip(w.batch_sizes, w.weights(), strict=True))
    return {
        "target model": config.target.model,
        "dtype": config.target.dtype,
        "candidates": ", ".join(f"{c.name} ({c.method})" for c in config.candidates),
        "enforce_eager": ", ".join(str(x).lower() for x in config.search.enforce_eager),
        "prompts": str(w.prompts.name),
        "max_tokens / temperature": f"{w.max_tokens} / {w.temperature}",
        "batch sizes (score weights)": weights,
        "repeats per batch size": str(w.repeats),
        "score": f"median − {config.scoring.mad_penalty} × MAD of output tokens/s",
        "sampler": f"{config.search.sampler} (seed {config.search.seed})",
        "budget": f"{config.budget.trials} trials, {config.budget.trial_timeout_s:.0f} s each at most",
    }


def _safe_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url


# -- rendering helpers --------------------------------------------------------------------------------
def _f(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f} ms"


def trial_table(rows: Sequence[TrialRow]) -> tuple[list[str], list[list[str]]]:
    """The all-trials table as header and string cells (shared by HTML, Markdown and the notebook)."""
    batch_sizes = sorted({lv.batch_size for r in rows if r.metrics for lv in r.metrics.levels})
    header = ["trial", "state", "configuration", "tokens/s", "speedup"]
    header += [f"tokens/s bs{b}" for b in batch_sizes]
    header += ["acceptance", "mean acc. length", "engine start", "notes"]
    body = []
    for r in rows:
        m = r.metrics
        tps = _f(m.tokens_per_s) if m else ("partial " + _f(r.partial_tokens_per_s) if r.partial_tokens_per_s else "–")
        cells = [str(r.number), r.state, r.label, tps, _x(r.speedup)]
        for b in batch_sizes:
            lv = m.level(b) if m else None
            cells.append(_f(lv.tokens_per_s) if lv else "–")
        cells += [
            _pct(m.spec.acceptance_rate) if m else "–",
            _f(m.spec.mean_acceptance_length, ".2f") if m else "–",
            _f(m.engine_start_s, ".1f", " s") if m else "–",
            r.reason,
        ]
        body.append(cells)
    return header, body


def trials_frame(rows: Sequence[TrialRow]) -> Any:
    """The trials as a pandas DataFrame (for the notebook): one row per trial, numbers as numbers."""
    import pandas as pd

    records = []
    for r in rows:
        m = r.metrics
        rec: dict[str, Any] = {
            "trial": r.number,
            "state": r.state,
            "candidate": r.candidate,
            "method": r.spec.method if r.spec else None,
            "k": r.spec.num_speculative_tokens if r.spec else None,
            "enforce_eager": r.spec.enforce_eager if r.spec else None,
            "configuration": r.label,
            "tokens_per_s": m.tokens_per_s if m else None,
            "score": m.score if m else None,
            "speedup": r.speedup,
            "acceptance_rate": m.spec.acceptance_rate if m else None,
            "mean_acceptance_length": m.spec.mean_acceptance_length if m else None,
            "engine_start_s": m.engine_start_s if m else None,
            "notes": r.reason,
        }
        for lv in m.levels if m else []:
            rec[f"tokens_per_s_bs{lv.batch_size}"] = lv.tokens_per_s
        records.append(rec)
    return pd.DataFrame.from_records(records)


def compare_frame(reports: dict[str, StudyReport]) -> Any:
    """Best trial of each candidate in several studies, side by side (pandas DataFrame, one row per pair)."""
    import pandas as pd

    records = []
    for name, rep in reports.items():
        for c in rep.candidates:
            b = c.best
            m = b.metrics if b is not None else None
            records.append(
                {
                    "study": name,
                    "device": (b.engine.get("device") if b is not None else None) or rep.engine.get("device"),
                    "candidate": c.name,
                    "best configuration": b.label if b is not None else None,
                    "tokens_per_s": m.tokens_per_s if m else None,
                    "speedup": b.speedup if b is not None else None,
                    "acceptance_rate": m.spec.acceptance_rate if m else None,
                    "mean_acceptance_length": m.spec.mean_acceptance_length if m else None,
                    "engine_start_s": m.engine_start_s if m else None,
                    "verdict": c.verdict,
                }
            )
    return pd.DataFrame.from_records(records)


def _level_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    who = r.featured.label if r.featured else "best"
    header = ["batch size", f"{who} tokens/s", "no speculation tokens/s", "speedup", "TTFT", "TPOT", "same tokens"]
    body = [
        [
            str(lv.batch_size),
            _f(lv.tokens_per_s),
            _f(lv.baseline_tokens_per_s),
            _x(lv.speedup),
            f"{_ms(lv.ttft_s)} (baseline {_ms(lv.baseline_ttft_s)})",
            f"{_ms(lv.tpot_s)} (baseline {_ms(lv.baseline_tpot_s)})",
            _pct(lv.lossless) if lv.lossless is not None else "–",
        ]
        for lv in r.levels
    ]
    return header, body


def _candidate_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    header = ["candidate", "method", "trials (done / pruned / failed)", "best", "speedup", "acceptance", "verdict"]
    body = []
    for c in r.candidates:
        b = c.best
        body.append(
            [
                c.name,
                c.method,
                f"{c.trials} ({c.completed} / {c.pruned} / {c.failed})",
                f"{b.label} (trial {b.number})" if b else "–",
                _x(b.speedup) if b else "–",
                _pct(b.metrics.spec.acceptance_rate) if b and b.metrics else "–",
                c.verdict,
            ]
        )
    return header, body


# -- HTML ---------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em}
.verdict{font-size:1.25em;padding:.8em 1em;border-radius:6px;background:#eef6ee;border-left:6px solid #2ca02c}
.verdict.no{background:#fbf3e6;border-left-color:#ff7f0e}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.COMPLETE td:nth-child(2){color:#2a7a2a} tr.PRUNED td:nth-child(2){color:#a66a00}
tr.FAIL td:nth-child(2){color:#c62828;font-weight:600} tr.best{background:#f0f8ff}
pre{background:#f7f7f7;padding:.8em;border-radius:4px;overflow-x:auto;font-size:.85em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
.note{color:#666;font-style:italic}
"""

_PLOT_CAPTIONS = {
    "history": "Each trial's score; the line is the best so far. Crosses are pruned trials (their last partial "
    "throughput), red triangles failed trials.",
    "throughput": "Throughput of every speculative trial against num_speculative_tokens, per batch size; the dashed "
    "line is no speculation. Above the line, speculation pays.",
    "acceptance": "Share of drafts whose token at each position was accepted. Speculation pays when the early "
    "positions are accepted often; positions that are rarely accepted only cost drafting time.",
    "importances": "How much of the score's variation each setting explains (fANOVA over the completed trials).",
    "engine_start": "Engine start time per trial: compiled mode (enforce_eager=false) starts slower but may run faster.",
}


def _html_table(header: list[str], body: list[list[str]], row_classes: list[str] | None = None) -> str:
    def cell(value: str, tag: str) -> str:
        numeric = value[:1].isdigit() or value.startswith("–") or value.endswith("×")
        cls = ' class="num"' if tag == "td" and numeric and len(value) < 24 else ""
        return f"<{tag}{cls}>{html.escape(value)}</{tag}>"

    head = "".join(cell(h, "th") for h in header)
    lines = []
    for i, cells in enumerate(body):
        cls = f' class="{row_classes[i]}"' if row_classes else ""
        lines.append(f"<tr{cls}>" + "".join(cell(c, "td") for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def figures(report: StudyReport) -> dict[str, Any]:
    """The report's plots, by name (matplotlib Figures)."""
    from tuner import plots

    return {
        "history": plots.history(report.rows),
        "throughput": plots.throughput_vs_k(report.rows),
        "acceptance": plots.acceptance_per_position(report.rows),
        "importances": plots.importances(report.importances, report.importance_note),
        "engine_start": plots.engine_start_vs_eager(report.rows),
    }


def render_html(report: StudyReport) -> str:
    from tuner import plots

    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>specdec-tuner report: {esc(report.study_name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>specdec-tuner report: {esc(report.study_name)}</h1>",
        f'<p class="meta">generated {esc(report.generated)}'
        + (f" from {esc(report.storage)}" if report.storage else "")
        + (
            f" · measured on {esc(str(report.engine.get('device', '?')))}, vLLM {esc(str(report.engine.get('vllm', '?')))}, "
            f"torch {esc(str(report.engine.get('torch', '?')))}"
            if report.engine
            else ""
        )
        + "</p>",
        f'<p class="verdict{"" if report.paid else " no"}" id="verdict">{esc(report.headline)}</p>',
    ]
    if report.levels:
        parts.append("<h2>Speedup per batch size</h2>")
        parts.append(_html_table(*_level_table(report)))
    if report.why:
        parts.append('<h2>Why</h2><ul id="why">' + "".join(f"<li>{esc(s)}</li>" for s in report.why) + "</ul>")
    parts.append("<h2>Best configuration</h2>")
    if report.best_config:
        parts.append(
            "<p>Start it with <code>vllm serve --config best.yaml</code> "
            "(the same file <code>python -m tuner export</code> writes):</p>"
        )
        parts.append(f'<pre id="best-config">{esc(report.best_config)}</pre>')
    else:
        parts.append(f'<p class="note">{esc(report.best_config_note or "no completed trial")}</p>')
    if report.candidates:
        parts.append("<h2>Candidates</h2>")
        parts.append(_html_table(*_candidate_table(report)))
    parts.append("<h2>Plots</h2>")
    for name, fig in figures(report).items():
        data = plots.png_base64(fig)
        parts.append(
            f'<figure id="plot-{name}"><img alt="{esc(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(_PLOT_CAPTIONS[name])}</figcaption></figure>"
        )
    if report.importance_note:
        parts.append(f'<p class="note">{esc(report.importance_note)}</p>')
    parts.append("<h2>All trials</h2>")
    header, body = trial_table(report.rows)
    chosen = report.chosen.number if report.chosen else None
    classes = [r.state + (" best" if r.number == chosen else "") for r in report.rows]
    parts.append('<div id="trials">' + _html_table(header, body, classes) + "</div>")
    if report.settings:
        parts.append("<h2>Study settings</h2>")
        parts.append(_html_table(["setting", "value"], [[k, v] for k, v in report.settings.items()]))
    parts.append(
        '<p class="meta">Speedups are output tokens/s over the study\'s best trial without speculation, '
        "weighted over batch sizes as the score is; per batch size in the first table. "
        "Every figure is the median of the measured repeats.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -- Markdown -----------------------------------------------------------------------------------------
def _md_table(header: list[str], body: list[list[str]]) -> str:
    def clean(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(clean(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(clean(c) for c in cells) + " |" for cells in body]
    return "\n".join(lines)


def render_markdown(report: StudyReport) -> str:
    out = [f"### specdec-tuner: study `{report.study_name}`", "", f"**{report.headline}**", ""]
    if report.engine:
        out += [
            f"Measured on {report.engine.get('device', '?')}, vLLM {report.engine.get('vllm', '?')}, "
            f"torch {report.engine.get('torch', '?')}; report generated {report.generated}.",
            "",
        ]
    if report.levels:
        out += [_md_table(*_level_table(report)), ""]
    if report.why:
        out += ["**Why**", ""] + [f"- {s}" for s in report.why] + [""]
    if report.candidates:
        out += [_md_table(*_candidate_table(report)), ""]
    if report.best_config:
        out += [
            "<details><summary>Best configuration (<code>vllm serve --config best.yaml</code>)</summary>",
            "",
            "```yaml",
            report.best_config.rstrip(),
            "```",
            "",
            "</details>",
            "",
        ]
    header, body = trial_table(report.rows)
    out += [f"<details><summary>All {len(report.rows)} trials</summary>", "", _md_table(header, body), "", "</details>"]
    return "\n".join(out) + "\n"


def render(report: StudyReport, fmt: str) -> str:
    return render_markdown(report) if fmt == "md" else render_html(report)


# -- the command and the MLflow hook ------------------------------------------------------------------
def resolve_format(fmt: str | None, output: Path | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise UserError(f"--format: '{fmt}' is not a report format; fix: use one of {', '.join(FORMATS)}")
        return fmt
    if output is not None and output.suffix.lower() in (".md", ".markdown"):
        return "md"
    return "html"


def report_command(study_path: Path, storage: str | None, output: Path | None, fmt: str | None) -> str:
    """``python -m tuner report``: returns what to print (the Markdown itself when it goes to stdout)."""
    from tuner.study_loader import load_study

    fmt = resolve_format(fmt, output)
    if output is None and fmt == "html":
        output = Path("report.html")
    if output is not None and output.is_dir():
        raise UserError(f"--output: {output} is a directory; fix: give a file path such as {output / 'report.html'}")
    config = load_study(study_path)
    url = storage or config.storage
    study = store.load_existing(url, config.name)
    text = redact(render(build_report(study, config, url), fmt))
    if output is None:
        return text
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--output: cannot write {output} ({exc.strerror}); fix: choose a writable path") from None
    return f"report written to {output}"


def log_study_artifacts(
    tracker: Tracker, parent_run: str, study: optuna.Study, config: StudyConfig | None = None
) -> None:
    """At the end of ``optimize``: report.html, report.md and best_config.yaml on the parent run, and the
    ``best`` tag on the chosen trial's run (``tags.best = 'true'`` in the MLflow UI). Never raises."""
    try:
        report = build_report(study, config, "")
        tracker.log_text(parent_run, render_html(report), REPORT_ARTIFACT)
        tracker.log_text(parent_run, render_markdown(report), MARKDOWN_ARTIFACT)
        if report.best_config:
            tracker.log_text(parent_run, report.best_config, CONFIG_ARTIFACT)
        _tag_best(tracker, study.study_name, report.chosen)
        if report.chosen is not None and report.chosen.speedup is not None:
            tracker.set_tags(parent_run, {"best_config": report.chosen.label, "verdict": report.headline})
    except Exception as exc:  # the study is measured and stored; a report problem must not fail the command
        print(f"warning: could not log the report to MLflow ({type(exc).__name__}: {exc})", file=sys.stderr)


def _tag_best(tracker: Tracker, study_name: str, chosen: TrialRow | None) -> None:
    from tuner.tracking import STUDY_TAG

    keep = chosen.mlflow_run_id if chosen is not None else None
    flagged = tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{study_name}' and tags.{BEST_TAG} = 'true'"
    )
    for run in flagged:
        if run.info.run_id != keep:
            tracker.client.delete_tag(run.info.run_id, BEST_TAG)
    if keep:
        tracker.set_tags(keep, {BEST_TAG: "true"})
