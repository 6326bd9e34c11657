"""The end of a study: its outcome decided once (tuner.results.outcome), stored with the study, and the
verdict written to the MLflow parent run for the UI's searches."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from tuner.results import outcome as outcomes
from tuner.results.confirmation import RULE
from tuner.results.outcome import StudyOutcome

if TYPE_CHECKING:
    from tuner.trial.optimize import StudyRunner


def conclude(runner: StudyRunner) -> StudyOutcome | None:
    study = runner.study
    if study is None:
        return None
    out = outcomes.decide(study, runner.config)
    outcomes.save(study, out)
    if runner.show_progress:
        if out.schedule is not None:
            print(f"schedule: {out.schedule.outcome()}", file=sys.stderr, flush=True)
        print(f"outcome: {out.summary()}", file=sys.stderr, flush=True)
    if runner.tracker is not None:
        _log(runner, out)
    return out


def _log(runner: StudyRunner, out: StudyOutcome) -> None:
    tracker = runner.tracker
    assert tracker is not None
    tags: dict[str, Any] = {"outcome.verdict": out.verdict, "outcome.rule": out.rule, "outcome.reason": out.reason}
    exported = out.exported
    tags["best_trial"] = "none" if exported is None else ("schedule" if exported.kind == "schedule" else exported.trial)
    answer = _answer_metrics(out)
    if answer:
        tracker.log_metrics(runner.parent_run, answer)
    conf, decision = out.confirmation, out.decision
    if conf is not None and decision is not None:
        winner = (
            "schedule"
            if out.verdict == "schedule"
            else (str(decision.winner) if decision.winner is not None else "none")
        )
        tags.update(
            {
                "confirm.rule": RULE,
                "confirm.winner": winner,
                "confirm.verdict": "speculation confirmed" if out.paid else "baseline (not confirmed)",
            }
        )
        metrics: dict[str, float] = {}
        if decision.baseline is not None:
            metrics["confirm_baseline_spread"] = decision.baseline.spread
        for r in decision.speculative:
            name = "schedule" if r.schedule else f"trial{r.trial}"
            metrics[f"confirm_speedup_{name}"] = r.median
            metrics[f"confirm_spread_{name}"] = r.spread
            for level, x in r.per_level.items():
                metrics[f"confirm_speedup_{name}_level{level}"] = x
        if metrics:
            tracker.log_metrics(runner.parent_run, metrics)
        if conf.reference() is not None:
            for e in conf.engines:
                if e.mlflow_run_id and e.failure is None:
                    tracker.log_metrics(e.mlflow_run_id, {"confirm_value": conf.engine_value(e)})
    if out.schedule is not None:
        run = out.schedule
        verdict = "none" if run.schedule is None else ("exported" if run.exported else "not exported")
        tags.update({"schedule.verdict": verdict, "schedule.outcome": run.outcome()})
    tracker.set_tags(runner.parent_run, tags)


def _answer_metrics(out: StudyOutcome) -> dict[str, float]:
    """What is served, as parent-run metrics a search can filter on: its stated speedup over no speculation
    (1.0 when the baseline is served) and whether fresh engines confirmed it."""
    if out.exported is None:
        return {}
    speedup = out.speedup if out.paid else 1.0
    metrics = {"answer_confirmed": 1.0 if out.confirmed else 0.0}
    if speedup is not None:
        metrics["answer_speedup"] = speedup
    return metrics
