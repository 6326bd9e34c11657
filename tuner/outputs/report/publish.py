"""The report in MLflow: report.html, report.md, best_config.yaml (in serve mode latency_vs_load.png; with a
batch-size schedule speedup_vs_batch_size.png) on the study's parent run, and tags."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tuner.outputs.report.build import build_report
from tuner.outputs.report.html import figures, render_html
from tuner.outputs.report.markdown import render_markdown

if TYPE_CHECKING:
    import optuna

    from tuner.outputs.report.model import StudyReport
    from tuner.results.tracking import Tracker
    from tuner.study.config import StudyConfig

REPORT_ARTIFACT = "report.html"
MARKDOWN_ARTIFACT = "report.md"
CONFIG_ARTIFACT = "best_config.yaml"
BEST_TAG = "best"


def log_study_artifacts(
    tracker: Tracker, parent_run: str, study: optuna.Study, config: StudyConfig | None = None
) -> None:
    """At the end of ``optimize``: report.html, report.md, best_config.yaml (serve mode: also the latency plot;
    schedule enabled: the speedup-against-load plot)
    on the parent run, and the ``best`` tag on the chosen trial's run (``tags.best = 'true'`` in the MLflow UI).
    Never raises."""
    try:
        from tuner.outputs.latency_plots import LATENCY_ARTIFACT
        from tuner.outputs.schedule_plot import SCHEDULE_ARTIFACT

        report = build_report(study, config, "")
        figs = figures(report)  # drawn once: embedded in report.html, and some logged as images of their own
        tracker.log_text(parent_run, render_html(report, figs), REPORT_ARTIFACT)
        tracker.log_text(parent_run, render_markdown(report), MARKDOWN_ARTIFACT)
        if report.best_config:
            tracker.log_text(parent_run, report.best_config, CONFIG_ARTIFACT)
        for name, artifact in (("latency", LATENCY_ARTIFACT), ("schedule", SCHEDULE_ARTIFACT)):
            if name in figs:
                tracker.client.log_figure(parent_run, figs[name], artifact)
        _tag_best(tracker, study.study_name, _served_run(report))
        out = report.outcome
        if out is not None:
            tags = {"verdict": report.headline, "outcome": out.summary()}
            if out.exported is not None:
                tags["best_config"] = out.exported.label
            tracker.set_tags(parent_run, tags)
    except Exception as exc:  # the study is measured and stored; a report problem must not fail the command
        print(f"warning: could not log the report to MLflow ({type(exc).__name__}: {exc})", file=sys.stderr)


def _served_run(report: StudyReport) -> str | None:
    """The MLflow run of what is served: the chosen trial's, or the schedule's engine when a schedule is."""
    out = report.outcome
    if out is not None and out.verdict == "schedule" and out.schedule is not None:
        return out.schedule.mlflow_run_id or None
    if out is not None and out.exported is None:
        return None
    return report.chosen.mlflow_run_id if report.chosen is not None else None


def _tag_best(tracker: Tracker, study_name: str, keep: str | None) -> None:
    from tuner.results.tracking import STUDY_TAG

    flagged = tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.`{STUDY_TAG}` = '{study_name}' and tags.{BEST_TAG} = 'true'"
    )
    for run in flagged:
        if run.info.run_id != keep:
            tracker.client.delete_tag(run.info.run_id, BEST_TAG)
    if keep:
        tracker.set_tags(keep, {BEST_TAG: "true"})
