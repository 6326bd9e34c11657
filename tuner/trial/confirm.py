"""Measure the study's finalists in fresh engines (the records and the rule: tuner.results.confirmation).

Every engine's result is written to the Optuna study (user attribute ``confirmation``) as soon as it is
measured: an interrupted confirmation resumes where it stopped and loses nothing measured. A confirmation
of other finalists, rounds or repeats than the study now calls for is kept under ``confirmation_history``
before a new one starts, never overwritten.
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
from typing import TYPE_CHECKING

from tuner.redaction import redact
from tuner.results import confirmation as confirmations
from tuner.results import outcome as outcomes
from tuner.results import store
from tuner.results.confirmation import CONFIRMATION, HISTORY, Confirmation, EngineRun, Finalist
from tuner.results.schedule_run import ScheduleRun, schedule_spec
from tuner.results.scoring import SLO_RATE_LEVEL, level_metrics, level_name, score_result
from tuner.study import methods
from tuner.trial.deadline import confirmation_engine_s
from tuner.trial.interrupts import sigterm_interrupts
from tuner.trial.progress import format_left

if TYPE_CHECKING:
    from tuner.trial.optimize import StudyRunner


def confirm_study(runner: StudyRunner, schedule: ScheduleRun | None = None) -> Confirmation | None:
    """Measure the finalists (and ``schedule``, when one was derived) in fresh engines, resuming a stored,
    unfinished confirmation of the same finalists."""
    config, study = runner.config, runner.study
    if study is None or not config.confirm.enabled:
        return None
    wanted = outcomes.expected_finalists(study, config, config.confirm.speculative, schedule)
    if wanted is None:
        return None
    conf = confirmations.load(study)
    if conf is not None and conf.skipped and not conf.engines and _behind(runner, conf) != conf.skipped:
        conf = None  # skipped under other settings or trials: nothing was measured, so nothing to keep
    if conf is not None and not conf.same_as(wanted):
        study.set_user_attr(HISTORY, [*(study.user_attrs.get(HISTORY) or []), conf.model_dump(mode="json")])
        conf = conf.narrowed_to(wanted)
        if conf is not None:
            study.set_user_attr(CONFIRMATION, conf.model_dump(mode="json"))
    if conf is None:
        conf = wanted
        conf.skipped = _behind(runner, conf)
        study.set_user_attr(CONFIRMATION, conf.model_dump(mode="json"))
    with sigterm_interrupts():
        for round_, finalist in conf.plan():
            if conf.measured(round_, finalist) is not None:
                continue
            if not runner.deadline.allows(study.get_trials(deepcopy=False), "a confirmation engine"):
                return conf  # unfinished: no decision yet; the next run resumes here
            conf.engines.append(_measure(runner, conf, round_, finalist, schedule))
            study.set_user_attr(CONFIRMATION, conf.model_dump(mode="json"))  # durable before the next engine
    for line in conf.summary_lines(level_name(runner.config.workload.mode)):
        _say(runner, line)
    return conf


def _behind(runner: StudyRunner, conf: Confirmation) -> str:
    """Why no fresh engine is needed (confirm.skip_when_behind), or ""."""
    study = runner.ready().study
    specs = [f for f in conf.finalists if not f.is_baseline and not f.schedule]
    if not runner.config.confirm.skip_when_behind or not specs or any(f.schedule for f in conf.finalists):
        return ""
    return confirmations.clearly_behind(study, runner.config, study.trials[specs[0].trial])


def _left(runner: StudyRunner, conf: Confirmation) -> str:
    """The confirmation's engines still to run, this one included, at the median time of those it measured
    (before any, the trials' estimate: tuner.trial.deadline.confirmation_engine_s)."""
    todo = conf.engines_to_run()
    walls = [e.wall_s for e in conf.engines]
    if walls:
        each: float | None = statistics.median(walls)
    else:
        each = confirmation_engine_s(runner.ready().study.get_trials(deepcopy=False), runner.config)
    return "?" if each is None else format_left(todo * each)


def _level_text(level: int, value: float) -> str:
    return f"SLO kept up to {value:g} requests/s" if level == SLO_RATE_LEVEL else f"level {level}: {value:.1f} tok/s"


def _say(runner: StudyRunner, text: str) -> None:
    if runner.show_progress:
        print(f"confirm: {text}", file=sys.stderr, flush=True)


def _measure(
    runner: StudyRunner, conf: Confirmation, round_: int, finalist: Finalist, schedule: ScheduleRun | None
) -> EngineRun:
    from tuner.engine.process import run_engine
    from tuner.engine.request import TrialRequest
    from tuner.results.tracking import PARENT_TAG, ROLE_TAG, STUDY_TAG
    from tuner.study.spec import llm_kwargs

    ps = runner.ready()
    if finalist.schedule:
        assert schedule is not None and schedule.schedule is not None  # a schedule finalist comes from one
        spec = schedule_spec(ps.study, schedule.schedule)
        # same_as holds: the derived schedule is the finalist's (its label carries the ranges)
        assert finalist.label.endswith(schedule.schedule.text())
    else:
        found = store.trial_spec(ps.study.trials[finalist.trial])
        assert found is not None
        spec = found
    kwargs = llm_kwargs(runner.config.target, ps.preflight.target_path, spec)
    request = TrialRequest.for_study(runner.config, ps.prompts, kwargs).model_copy(update={"repeats": conf.repeats})
    _say(
        runner,
        f"round {round_ + 1}/{conf.rounds}: {finalist.label} (trial {finalist.trial}) in a fresh engine; "
        f"left ~{_left(runner, conf)}",
    )
    name = "schedule" if finalist.schedule else f"trial-{finalist.trial:03d}"
    outcome = run_engine(
        request, runner.workdir / f"confirm-r{round_ + 1}-{name}", runner.config.budget.trial_timeout_s
    )
    run = EngineRun(
        round=round_,
        trial=finalist.trial,
        schedule=finalist.schedule,
        ranges=spec.extra.get(methods.SCHEDULE, []) if finalist.schedule else [],
        wall_s=outcome.wall_s,
        measured_on=dt.date.today().isoformat(),
    )
    if outcome.result is None:
        run.failure = f"{outcome.failure}: {outcome.message}"[:500]
        _say(runner, f"  failed: {run.failure[:160]}")
    else:
        result = outcome.result
        for bs in runner.config.workload.batch_sizes:
            reps = [r for r in result.repeats if r.batch_size == bs]
            if reps:
                run.levels[bs] = level_metrics(bs, reps, 0.0).tokens_per_s
        if result.slo is not None:
            run.levels[SLO_RATE_LEVEL] = result.slo.max_rate_rps
        run.engine = {
            "vllm": result.vllm_version,
            "torch": result.torch_version,
            "device": result.device,
            **result.runner,  # model_runner, cudagraph_mode: they decide a verdict as much as the drafter
        }
        run.resolved_args = dict(result.resolved_args)
        if finalist.schedule:  # judged level by level against the trials too (tuner.results.schedule)
            tokens = store.baseline_tokens(store.best_baseline(ps.study))
            run.metrics = score_result(
                result, runner.config, baseline_tokens=tokens, reference=store.reference(ps.study)
            )
        _say(runner, "  " + ", ".join(_level_text(bs, v) for bs, v in run.levels.items()))
    if runner.tracker is not None:
        tracker = runner.tracker
        role = "schedule_validation" if finalist.schedule else "confirmation"
        mlrun = tracker.client.create_run(
            tracker.experiment_id,
            run_name=f"confirm r{round_ + 1} {finalist.label} (trial {finalist.trial})",
            tags={
                PARENT_TAG: runner.parent_run,
                STUDY_TAG: runner.config.name,
                ROLE_TAG: role,
                "confirm.round": str(round_ + 1),
                "confirm.trial": str(finalist.trial),
                "is_baseline": str(finalist.is_baseline).lower(),
            },
        )
        run.mlflow_run_id = str(mlrun.info.run_id)
        if finalist.schedule:
            tracker.log_dict(run.mlflow_run_id, redact(kwargs), "vllm_args.json")
        metrics = {(f"tokens_per_s_bs{bs}" if bs else "slo_max_rate_rps"): v for bs, v in run.levels.items()}
        metrics["engine_wall_s"] = run.wall_s
        tracker.log_metrics(run.mlflow_run_id, metrics)
        if run.failure:
            tracker.set_tags(run.mlflow_run_id, {"failure_class": outcome.failure or "", "error": run.failure})
        tracker.end_trial(run.mlflow_run_id, "FAILED" if run.failure else "FINISHED")
    return run
