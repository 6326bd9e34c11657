"""The report's data: one row per trial, read from the Optuna storage alone, and the report's shape.

The low module of ``tuner.outputs.report``: plots, the notebook and every renderer build on these rows
(each trial's ``spec``, ``metrics``, failure and pruning attributes), so a report works offline and long
after the MLflow server is gone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.results import store
from tuner.results.record import TrialRecord
from tuner.results.scoring import TrialMetrics, apply_reference
from tuner.results.store import config_from_study
from tuner.study.spec import TrialSpec

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.outputs.report.schedule_section import ScheduleSection
    from tuner.results.outcome import StudyOutcome


@dataclass
class TrialRow:
    """One Optuna trial, with what the tuner recorded on it."""

    number: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    spec: TrialSpec | None
    metrics: TrialMetrics | None
    reason: str = ""
    partial_tokens_per_s: float | None = None
    partial_speedup: float | None = None  # the same over the reference median at that batch size (score units)
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
class ServedLevelRow:
    """Serve mode: one configuration at one ``--max-concurrency`` level, as ``vllm bench serve`` measured it."""

    level: int
    role: str  # "chosen", "baseline", "best speculative"
    row: TrialRow
    latency_ms: dict[str, float]  # "ttft_p90", ...: the median over the level's windows
    request_throughput: float | None
    tokens_per_s: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    slo_held: bool | None  # None: no SLO set


@dataclass
class SloTrialRow:
    """One completed trial's search for the highest request rate that keeps the SLO."""

    row: TrialRow
    max_rate_rps: float
    rate_speedup: float | None  # over the best baseline's highest rate
    probes: list[tuple[float, bool]]  # (requests/s, held), in the order probed
    truncated: bool
    elapsed_s: float


@dataclass
class SloSummary:
    percentile: int
    ttft_ms: float | None
    tpot_ms: float | None
    objective: str  # "throughput" or "goodput"
    baseline_rate_rps: float | None
    trials: list[SloTrialRow]

    def limits(self) -> str:
        """``p90 TTFT ≤ 200 ms and p90 TPOT ≤ 50 ms``."""
        parts = [
            f"p{self.percentile} {name} ≤ {limit:g} ms"
            for name, limit in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms))
            if limit is not None
        ]
        return " and ".join(parts)


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
    removed: str = ""  # why pre-flight took it out of the search space


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
    confirmation: list[str] = field(
        default_factory=list
    )  # finalists re-measured in fresh engines (tuner.trial.confirm)
    mode: str = "offline"  # "serve": levels are --max-concurrency of a served load
    measurement: list[str] = field(default_factory=list)  # how it was measured: mode, sampling, SLO
    served: list[ServedLevelRow] = field(default_factory=list)  # serve mode: latency per level of the finalists
    slo: SloSummary | None = None
    schedule: ScheduleSection | None = None  # the batch-size schedule, when the study asked for one
    outcome: StudyOutcome | None = None  # the study's answer (tuner.results.outcome) the report renders
    decided: list[str] = field(default_factory=list)  # the outcome's rule and reason, as export states them

    def level_name(self, level: int) -> str:
        return level_name(self.mode, level)

    @property
    def level_noun(self) -> str:
        return level_noun(self.mode)

    @property
    def finalists(self) -> list[tuple[str, TrialRow]]:
        """The chosen configuration, the best baseline, and the best speculative one if neither, once each."""
        out: list[tuple[str, TrialRow]] = []
        for role, row in (("chosen", self.chosen), ("baseline", self.baseline), ("best speculative", self.featured)):
            if row is not None and row.metrics is not None and all(r.number != row.number for _, r in out):
                out.append((role, row))
        return out


def level_noun(mode: str) -> str:
    return "concurrency" if mode == "serve" else "batch size"


def level_name(mode: str, level: int) -> str:
    """How the report names a level: ``concurrency 4`` (served load) or ``batch 4`` (offline)."""
    return f"concurrency {level}" if mode == "serve" else f"batch {level}"


def rows_mode(rows: Sequence[TrialRow]) -> str:
    """The workload mode the trials were measured in, from their own records."""
    return next((r.metrics.mode for r in rows if r.metrics is not None), "offline")


def collect_rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of the study, with its recorded settings, metrics and the reason it did not complete."""
    trials = study.get_trials(deepcopy=False)
    retried_by = {int(r): t.number for t in trials if (r := store.record_value(t, "retry_of")) is not None}
    rows = [_row(t, retried_by.get(t.number)) for t in trials]
    by_number = {r.number: r for r in rows}
    for row in rows:
        source = by_number.get(row.duplicate_of) if row.duplicate_of is not None else None
        if row.partial_tokens_per_s is None and source is not None:
            row.partial_tokens_per_s = source.partial_tokens_per_s
    reference = store.reference(study)  # scores and speedups against the study's final baselines
    config = config_from_study(study)
    by_trial = {t.number: t for t in trials}
    for row, t in zip(rows, trials, strict=True):
        if row.metrics is not None:
            row.metrics = apply_reference(row.metrics, reference)
            row.speedup = row.metrics.speedup
        # A reused duplicate's partial value comes from its source trial's steps.
        measured = by_trial.get(row.duplicate_of, t) if row.duplicate_of is not None else t
        if row.partial_tokens_per_s and config is not None and measured.intermediate_values:
            w = config.workload
            index = (
                max(measured.intermediate_values) // w.repeats
            )  # steps are (batch size, repeat): tuner.trial.pruning
            ref = reference.get(w.batch_sizes[index]) if index < len(w.batch_sizes) else None
            row.partial_speedup = row.partial_tokens_per_s / ref if ref else None
    return rows


def _row(t: FrozenTrial, retried_as: int | None) -> TrialRow:
    try:
        rec = store.trial_record(t)
    except ValueError:  # a record this tuner cannot read: show the trial, without its details
        rec = TrialRecord()
    spec = rec.spec
    metrics = rec.metrics if t.state.name == "COMPLETE" else None
    duplicate = rec.duplicate_of
    partial = None
    if t.intermediate_values:
        partial = float(t.intermediate_values[max(t.intermediate_values)])
    state = t.state.name
    reason = ""
    if state == "FAIL":
        failure = rec.failure_class or "failed"
        error = str(rec.error or "").strip().splitlines()
        reason = f"{failure}: {error[0][:300]}" if error else str(failure)
        if retried_as is not None:
            reason += f"; retried as trial {retried_as}"
    elif state == "PRUNED":
        reason = "pruned: " + str(rec.pruned_reason or "below the study's other trials")
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
    if rec.retry_of is not None:
        note = f"retry of trial {rec.retry_of}"
        reason = f"{reason}; {note}" if reason else note
    return TrialRow(
        number=t.number,
        state=state,
        spec=spec,
        metrics=metrics,
        reason=reason,
        partial_tokens_per_s=partial,
        duplicate_of=int(duplicate) if duplicate is not None else None,
        mlflow_run_id=rec.mlflow_run_id,
        engine=dict(rec.engine or {}),
    )


def best_baseline(rows: Sequence[TrialRow]) -> TrialRow | None:
    bases = [r for r in rows if r.metrics is not None and r.spec is not None and r.spec.is_baseline]
    return max(bases, key=lambda r: r.metrics.score if r.metrics else -math.inf, default=None)


def best_scored(rows: Sequence[TrialRow]) -> TrialRow | None:
    scored = [r for r in rows if r.metrics is not None]
    return max(scored, key=lambda r: r.metrics.score if r.metrics else -math.inf, default=None)
