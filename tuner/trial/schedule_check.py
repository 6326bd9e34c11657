"""The study's batch-size schedule before its confirmation: derived from the trials (the rules:
tuner.results.schedule) and stored as the study user attribute ``batch_schedule``, with the engine arguments
its fresh engines run. Its engines are confirmation finalists (tuner.trial.confirm); the verdict is the
study's outcome's (tuner.results.outcome)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from tuner.redaction import redact
from tuner.results.schedule_run import SCHEDULE_ATTR, ScheduleRun, basis, derive_for, schedule_spec

if TYPE_CHECKING:
    from tuner.trial.optimize import StudyRunner


def derive_schedule(runner: StudyRunner) -> ScheduleRun | None:
    """The schedule the study's trials call for (``schedule.enabled``), stored; None when not asked for.
    Switching the schedule off later leaves what was stored and measured in place."""
    from tuner.study.spec import llm_kwargs

    config, study = runner.config, runner.study
    if study is None or not config.schedule.enabled:
        return None
    ps = runner.ready()
    run = ScheduleRun(basis=basis(study))
    if ps.preflight.schedule_skipped:
        run.note = f"skipped before any engine started: {ps.preflight.schedule_skipped}"
    else:
        run.derivation = derive_for(study, config)
    if run.schedule is not None:
        spec = schedule_spec(study, run.schedule)
        run.llm_kwargs = redact(llm_kwargs(config.target, ps.preflight.target_path, spec))
    study.set_user_attr(SCHEDULE_ATTR, run.model_dump(mode="json"))
    if runner.show_progress:
        what = run.schedule.text() if run.schedule is not None else (run.note or run.derivation.note)
        print(f"schedule: {'derived ' if run.schedule else ''}{what}", file=sys.stderr, flush=True)
    return run
