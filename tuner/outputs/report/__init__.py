"""``tuner report``: which configuration won, how much faster it is, and why — from the study alone.

One job per module: ``model`` (rows read from the Optuna storage, the report's data; what plots import),
``importances`` (fANOVA), ``prose`` (verdicts and "why" sentences), ``served`` (how it was measured; serve
mode's latency per level and SLO rates), ``build`` (assembling a report),
``tables`` (cells and DataFrames), ``html`` and ``markdown`` (renderers), ``publish`` (MLflow).
The command's glue (arguments, output path and format) is in ``tuner.cli``.
"""

from tuner.outputs.report.build import build_report
from tuner.outputs.report.html import figures, render_html
from tuner.outputs.report.importances import (
    FEATURES,
    MIN_IMPORTANCE_CONFIGS,
    MIN_IMPORTANCE_SETTINGS,
    param_importances,
)
from tuner.outputs.report.markdown import render_markdown
from tuner.outputs.report.model import CandidateSummary, LevelRow, StudyReport, TrialRow, collect_rows
from tuner.outputs.report.publish import (
    BEST_TAG,
    CONFIG_ARTIFACT,
    MARKDOWN_ARTIFACT,
    REPORT_ARTIFACT,
    log_study_artifacts,
)
from tuner.outputs.report.tables import compare_frame, trial_table, trials_frame

__all__ = [
    "BEST_TAG",
    "CONFIG_ARTIFACT",
    "FEATURES",
    "MARKDOWN_ARTIFACT",
    "MIN_IMPORTANCE_CONFIGS",
    "MIN_IMPORTANCE_SETTINGS",
    "REPORT_ARTIFACT",
    "CandidateSummary",
    "LevelRow",
    "StudyReport",
    "TrialRow",
    "build_report",
    "collect_rows",
    "compare_frame",
    "figures",
    "log_study_artifacts",
    "param_importances",
    "render_html",
    "render_markdown",
    "trial_table",
    "trials_frame",
]
