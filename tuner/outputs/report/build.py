"""Assembling the report of a study: the chosen configuration, per-level speedups, candidates, prose."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.engine.preflight import REJECTED_ATTR
from tuner.errors import UserError
from tuner.outputs.report.importances import param_importances
from tuner.outputs.report.model import (
    CandidateSummary,
    LevelRow,
    StudyReport,
    TrialRow,
    best_scored,
    collect_rows,
    config_from_study,
)
from tuner.outputs.report.prose import explain, headline, settings, verdict
from tuner.outputs.report.schedule_section import schedule_section
from tuner.outputs.report.served import measurement_lines, served_levels, slo_summary, workload_mode
from tuner.redaction import mask_url
from tuner.results.scoring import level_name

if TYPE_CHECKING:
    import optuna

    from tuner.results.outcome import StudyOutcome
    from tuner.results.scoring import LevelMetrics
    from tuner.study.config import StudyConfig


def build_report(study: optuna.Study, config: StudyConfig | None = None, storage: str = "") -> StudyReport:
    from tuner.outputs.export import render_export
    from tuner.results import outcome as outcomes

    config = config or config_from_study(study)
    rows = collect_rows(study)
    by_number = {r.number: r for r in rows}
    best = best_scored(rows)
    chosen: TrialRow | None = None
    baseline: TrialRow | None = None
    speculative: TrialRow | None = None
    paid = False
    best_config: str | None = None
    note = ""
    out: StudyOutcome | None = None
    try:
        out = outcomes.read(study, config)  # the study's one answer: the export renders the same object
    except UserError as exc:  # no completed trial
        note = str(exc)
    if out is not None:
        exported = out.exported
        # A schedule is served with its drafter's settings: the report features that drafter's best trial.
        chosen = by_number.get(exported.trial) if exported is not None else None
        baseline = by_number.get(out.baseline) if out.baseline is not None else None
        speculative = by_number.get(out.best_speculative) if out.best_speculative is not None else None
        paid = out.paid
        try:
            best_config = render_export(study, out)
        except UserError as exc:  # no winner declared (no baseline), or no recorded engine arguments
            note = str(exc)
    featured = chosen if paid else speculative
    candidates = _candidate_summaries(rows, config, dict(study.user_attrs.get(REJECTED_ATTR) or {}))
    importances, importance_note = param_importances(rows)
    engine = next((r.engine for r in (chosen, featured, best) if r is not None and r.engine), {})
    mode = workload_mode(config, rows)
    report = StudyReport(
        study_name=study.study_name,
        storage=mask_url(storage),
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
        settings=settings(config),
        engine=engine,
        mode=mode,
        slo=slo_summary(rows, config) if mode == "serve" else None,
    )
    report.measurement = measurement_lines(config, mode, report.slo)
    if mode == "serve":
        report.served = served_levels(report.finalists)
    report.headline = headline(report)
    report.why = explain(report, config)
    report.outcome = out
    if out is not None:
        report.decided = [f"answer: {out.summary()}", f"rule: {out.rule}"]
    report.confirmation = _confirmation(study, out)
    report.schedule = schedule_section(out, config) if out is not None else None
    return report


def _confirmation(study: optuna.Study, out: StudyOutcome | None) -> list[str]:
    from tuner.results import confirmation

    if out is not None and out.confirmation is not None:
        return out.confirmation.summary_lines(level_name(out.mode))
    if confirmation.load(study) is not None:
        return ["the stored confirmation is of other finalists (the study went on since): run `optimize` again"]
    return []


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
                # the reference of this level's speedup: the best baseline at this batch size (collect_rows)
                baseline_tokens_per_s=lv.tokens_per_s / lv.speedup if lv.speedup else (bl.tokens_per_s if bl else None),
                speedup=lv.speedup,
                ttft_s=_median_latency(lv, "ttft"),
                baseline_ttft_s=_median_latency(bl, "ttft"),
                tpot_s=_median_latency(lv, "tpot"),
                baseline_tpot_s=_median_latency(bl, "tpot"),
                lossless=lv.lossless_match_rate,
            )
        )
    return out


def _median_latency(lv: LevelMetrics | None, metric: str) -> float | None:
    """Median TTFT or TPOT in seconds: the offline per-request median, or a served window's p50."""
    if lv is None:
        return None
    offline = lv.ttft_median_s if metric == "ttft" else lv.tpot_median_s
    served = lv.latency_ms.get(f"{metric}_p50")
    return offline if offline is not None else (served / 1000 if served is not None else None)


def _candidate_summaries(
    rows: Sequence[TrialRow], config: StudyConfig | None, rejected: dict[str, str] | None = None
) -> list[CandidateSummary]:
    rejected = rejected or {}
    names: list[str] = [c.name for c in config.candidates] if config is not None else []
    methods: dict[str, str] = {c.name: c.method for c in config.candidates} if config is not None else {}
    names += [name for name in rejected if name not in names]
    for r in rows:
        if r.spec is not None and r.spec.candidate not in names:
            names.append(r.spec.candidate)
            methods[r.spec.candidate] = r.spec.method
    out = []
    for name in names:
        own = [r for r in rows if r.spec is not None and r.spec.candidate == name and r.duplicate_of is None]
        best = best_scored(own)
        summary = CandidateSummary(
            name=name,
            method=methods.get(name, "?"),
            trials=len(own),
            completed=sum(1 for r in own if r.metrics is not None),
            pruned=sum(1 for r in own if r.state == "PRUNED"),
            failed=sum(1 for r in own if r.state == "FAIL"),
            best=best,
            verdict="",
            removed=str(rejected.get(name, "")),
        )
        summary.verdict = verdict(summary, own)
        if summary.removed and own:  # measured in an earlier run, refused by the latest pre-flight
            summary.verdict += f"; removed by pre-flight since: {summary.removed}"
        out.append(summary)
    return out
