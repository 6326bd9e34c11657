"""The study's batch-size schedule: derived from its trials, validated in one fresh engine, stored.

Runs after the confirmation (``optimize``, when ``schedule.enabled``). The rules (which k per level,
the range boundaries, when the schedule may be exported) are in tuner.results.schedule; this module
feeds them the study, runs the validation engine through ``run_engine`` as the confirmation does, logs
it as an MLflow child run, and stores everything as the study user attribute ``batch_schedule`` as
soon as the engine is measured: an interrupted run resumes without measuring it again, and ``export``
and ``report`` read the verdict from there.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tuner.redaction import redact
from tuner.results import store
from tuner.results.schedule import DEFAULT_CAP, Derivation, Option, Schedule, StaticBest, Verdict, decide, derive
from tuner.results.scoring import TrialMetrics, apply_reference
from tuner.study import methods
from tuner.study.spec import TrialSpec
from tuner.trial.interrupts import sigterm_interrupts

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig
    from tuner.trial.optimize import StudyRunner

SCHEDULE_ATTR = "batch_schedule"  # Optuna study user attribute
WORKDIR = "schedule-validation"


class ScheduleRun(BaseModel):
    basis: list[int]  # the completed trials the derivation and the verdict read
    derivation: Derivation = Derivation()
    note: str = ""  # why no schedule was validated
    llm_kwargs: dict[str, Any] | None = None  # the validation engine's arguments
    metrics: TrialMetrics | None = None  # scored against the study's reference when the verdict was made
    failure: str | None = None
    engine: dict[str, str] = {}
    measured_on: str = ""  # the validation engine's date
    wall_s: float = 0.0
    mlflow_run_id: str = ""
    verdict: Verdict | None = None

    @property
    def schedule(self) -> Schedule | None:
        return self.derivation.schedule

    @property
    def measured(self) -> bool:
        return self.metrics is not None or self.failure is not None

    @property
    def exported(self) -> bool:
        return self.schedule is not None and self.verdict is not None and self.verdict.exported

    def outcome(self) -> str:
        """One line: what became of the schedule, and why."""
        if self.schedule is None:
            return f"no batch-size schedule: {self.note or self.derivation.note}"
        head = f"batch-size schedule of {self.schedule.drafter} ({self.schedule.text()}; k=0: no speculation)"
        if self.failure:
            return f"{head} NOT exported: its validation engine failed: {self.failure[:200]}"
        if self.verdict is None:
            return f"{head}: not validated yet"
        return f"{head} {'exported' if self.verdict.exported else 'NOT exported'}: {self.verdict.reason}"


def drafter_label(spec: TrialSpec) -> str:
    """A drafter's settings but k: what one schedule varies k over."""
    parts = [spec.candidate]
    if methods.rules(spec.method).lookup:
        parts.append(f"lookup {spec.prompt_lookup_min}-{spec.prompt_lookup_max}")
    parts.append("eager" if spec.enforce_eager else "compiled")
    return " ".join(parts)


def _drafter_key(spec: TrialSpec) -> tuple[Any, ...]:
    extra = json.dumps(spec.extra, sort_keys=True, default=str)
    return (spec.method, spec.draft_model, spec.enforce_eager, spec.prompt_lookup_min, spec.prompt_lookup_max, extra)


# -- reading the study --------------------------------------------------------------------------------
def load(study: optuna.Study) -> ScheduleRun | None:
    raw = study.user_attrs.get(SCHEDULE_ATTR)
    return ScheduleRun.model_validate(raw) if raw else None


def current(study: optuna.Study) -> ScheduleRun | None:
    """The stored schedule run if it read the study's current trials (a resumed study may have more)."""
    run = load(study)
    return run if run is not None and run.basis == _basis(study) else None


def _basis(study: optuna.Study) -> list[int]:
    return sorted(t.number for t in store.completed(study))


def _scored(study: optuna.Study, trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, TrialSpec, TrialMetrics]]:
    out = []
    for t in trials:
        spec, metrics = store.trial_spec(t), store.scored_metrics(study, t)
        if spec is not None and metrics is not None:
            out.append((t, spec, metrics))
    return out


def derive_for(study: optuna.Study, config: StudyConfig) -> Derivation:
    """The schedule of the named drafter (``schedule.drafter``), or else of the best speculative trial's."""
    rows = _scored(study, store.completed(study))
    wanted = config.schedule.drafter
    drafts = [
        r
        for r in rows
        if not r[1].is_baseline and methods.rules(r[1].method).batch_schedule and wanted in (None, r[1].candidate)
    ]
    bases = [r for r in rows if r[1].is_baseline]
    if not drafts or not bases:
        return Derivation(note="no completed " + ("speculative trial" if not drafts else "baseline"))
    best = max(drafts, key=lambda r: (r[2].score, -r[0].number))
    group = [r for r in drafts if _drafter_key(r[1]) == _drafter_key(best[1])]
    same_eager = [r for r in bases if r[1].enforce_eager == best[1].enforce_eager] or bases
    base = max(same_eager, key=lambda r: r[2].score)
    per_k: dict[int, tuple[FrozenTrial, TrialSpec, TrialMetrics]] = {}
    for r in sorted(group, key=lambda r: (-r[2].score, r[0].number)):
        per_k.setdefault(r[1].num_speculative_tokens or 0, r)
    options = [_option(0, base[0], base[2])] + [_option(k, t, m) for k, (t, _, m) in per_k.items()]
    levels = config.workload.batch_sizes
    return derive(drafter_label(best[1]), best[0].number, options, levels, _noise(study, levels), _cap(config))


def _option(k: int, trial: FrozenTrial, metrics: TrialMetrics) -> Option:
    return Option(
        k=k,
        trial=trial.number,
        tokens_per_s={lv.batch_size: lv.tokens_per_s for lv in metrics.levels},
        speedup={lv.batch_size: lv.speedup for lv in metrics.levels},
    )


def _noise(study: optuna.Study, levels: list[int]) -> dict[int, float]:
    from tuner.results.noise import study_noise

    done = store.completed(study)
    return {level: study_noise(done, level) for level in levels}


def _cap(config: StudyConfig) -> int:
    value = config.target.engine_args.get("max_num_seqs")
    return value if isinstance(value, int) and value > 0 else DEFAULT_CAP


def verdict_for(study: optuna.Study, config: StudyConfig, metrics: TrialMetrics) -> Verdict | None:
    """The validation rule (tuner.results.schedule.decide) against the study's best static configurations."""
    rows = _scored(study, store.completed(study))
    if not rows:
        return None
    best_static: dict[int, StaticBest] = {}
    for t, spec, m in rows:
        for lv in m.levels:
            held = best_static.get(lv.batch_size)
            if held is None or lv.tokens_per_s > held.tokens_per_s:
                best_static[lv.batch_size] = StaticBest(
                    trial=t.number, label=spec.label(), tokens_per_s=lv.tokens_per_s
                )
    t, spec, m = max(rows, key=lambda r: (r[2].score, -r[0].number))
    return decide(
        {lv.batch_size: lv.tokens_per_s for lv in metrics.levels},
        {lv.batch_size: lv.speedup for lv in metrics.levels},
        metrics.score,
        best_static,
        _noise(study, config.workload.batch_sizes),
        (t.number, spec.label(), m.score),
    )


def schedule_spec(study: optuna.Study, schedule: Schedule) -> TrialSpec:
    """The drafter trial's settings with k = the schedule's largest and the schedule itself."""
    spec = store.trial_spec(study.trials[schedule.trial])
    assert spec is not None  # the derivation read this trial's spec
    extra = {**spec.extra, methods.SCHEDULE: schedule.vllm_value()}
    return spec.model_copy(update={"num_speculative_tokens": schedule.max_k, "extra": extra})


# -- measuring ----------------------------------------------------------------------------------------
def validate_schedule(runner: StudyRunner) -> ScheduleRun | None:
    """Derive the schedule and measure it in a fresh engine (reusing a stored measurement of the same engine)."""
    from tuner.study.spec import llm_kwargs

    config, study = runner.config, runner.study
    if study is None:
        return None
    if not config.schedule.enabled:
        if load(study) is not None:  # switched off since: export serves the static choice again
            study.set_user_attr(SCHEDULE_ATTR, None)
        return None
    ps = runner.ready()
    run = ScheduleRun(basis=_basis(study))
    if ps.preflight.schedule_skipped:
        run.note = f"skipped before any engine started: {ps.preflight.schedule_skipped}"
    else:
        run.derivation = derive_for(study, config)
    schedule = run.schedule
    if schedule is not None:
        run.llm_kwargs = redact(llm_kwargs(config.target, ps.preflight.target_path, schedule_spec(study, schedule)))
        stored = load(study)
        if stored is not None and stored.measured and stored.llm_kwargs == run.llm_kwargs:
            _say(runner, "the stored validation engine of this schedule is reused")
            for field in ("metrics", "failure", "engine", "measured_on", "wall_s", "mlflow_run_id"):
                setattr(run, field, getattr(stored, field))
        elif not runner.deadline.allows(study.get_trials(deepcopy=False), "the schedule-validation engine"):
            return None  # nothing stored: the next run measures it
        else:
            _measure(runner, run, schedule)
            study.set_user_attr(SCHEDULE_ATTR, run.model_dump(mode="json"))  # durable before the verdict
        if run.metrics is not None:
            run.metrics = apply_reference(run.metrics, store.reference(study))
            run.verdict = verdict_for(study, config, run.metrics)
    study.set_user_attr(SCHEDULE_ATTR, run.model_dump(mode="json"))
    _say(runner, run.outcome())
    _log(runner, run)
    return run


def _say(runner: StudyRunner, text: str) -> None:
    if runner.show_progress:
        print(f"schedule: {text}", file=sys.stderr, flush=True)


def _measure(runner: StudyRunner, run: ScheduleRun, schedule: Schedule) -> None:
    from tuner.engine.process import run_engine
    from tuner.engine.request import TrialRequest
    from tuner.results.scoring import score_result
    from tuner.study.spec import llm_kwargs

    ps = runner.ready()
    kwargs = llm_kwargs(runner.config.target, ps.preflight.target_path, schedule_spec(ps.study, schedule))
    request = TrialRequest.for_study(runner.config, ps.prompts, kwargs)
    _say(runner, f"validating {schedule.text()} ({schedule.drafter}) in a fresh engine")
    with sigterm_interrupts():
        outcome = run_engine(request, runner.workdir / WORKDIR, runner.config.budget.trial_timeout_s)
    run.wall_s = outcome.wall_s
    run.measured_on = dt.date.today().isoformat()
    if outcome.result is None:
        run.failure = f"{outcome.failure}: {outcome.message}"[:500]
        return
    result = outcome.result
    tokens = store.baseline_tokens(store.best_baseline(ps.study))
    run.metrics = score_result(result, runner.config, baseline_tokens=tokens, reference=store.reference(ps.study))
    run.engine = {"vllm": result.vllm_version, "torch": result.torch_version, "device": result.device}


def _log(runner: StudyRunner, run: ScheduleRun) -> None:
    """The validation engine's MLflow child run (created once per measurement) and the parent's verdict tags."""
    from tuner.results.tracking import PARENT_TAG, ROLE_TAG, STUDY_TAG

    tracker = runner.tracker
    if tracker is None:
        return
    verdict = "none" if run.schedule is None else ("exported" if run.exported else "not exported")
    tracker.set_tags(runner.parent_run, {"schedule.verdict": verdict, "schedule.outcome": run.outcome()})
    schedule = run.schedule
    if schedule is None or not run.measured:
        return
    if not run.mlflow_run_id:
        mlrun = tracker.client.create_run(
            tracker.experiment_id,
            run_name=f"schedule {schedule.drafter}: {schedule.text()}",
            tags={PARENT_TAG: runner.parent_run, STUDY_TAG: runner.config.name, ROLE_TAG: "schedule_validation"},
        )
        run.mlflow_run_id = str(mlrun.info.run_id)
        tracker.log_params(
            run.mlflow_run_id,
            {
                "drafter": schedule.drafter,
                "num_speculative_tokens": schedule.max_k,
                methods.SCHEDULE: json.dumps(schedule.vllm_value()),
            },
        )
        tracker.log_dict(run.mlflow_run_id, run.llm_kwargs or {}, "vllm_args.json")
        if run.metrics is not None:
            tracker.log_metrics(run.mlflow_run_id, {**run.metrics.flat(), "engine_wall_s": run.wall_s})
        tracker.end_trial(run.mlflow_run_id, "FAILED" if run.failure else "FINISHED")
        assert runner.study is not None
        runner.study.set_user_attr(SCHEDULE_ATTR, run.model_dump(mode="json"))
    tags = {"schedule.verdict": verdict, "schedule.outcome": run.outcome()}
    if run.failure:
        tags["error"] = run.failure
    tracker.set_tags(run.mlflow_run_id, tags)
