"""The study's answer, decided once: the baselines, the best per level, the confirmation, the schedule's
verdict, and the exact configuration exported. Export, report, MLflow and the notebook render this object
and decide nothing of their own.

Rules, in the order they apply:
  1. No completed baseline without speculation: no winner is declared (a speedup needs a baseline).
  2. A speculative trial's speedup is stated only against a completed baseline of its own mode
     (``enforce_eager``); trials of a mode without one have an unknown speedup and cannot be chosen.
  3. Speedups and scores are against the study's current reference (per level, the fastest completed
     baseline of any mode), never the one current when a trial ended.
  4. With a complete confirmation in fresh engines, it decides: a speculative finalist (or the batch-size
     schedule) is served only if its lowest engine beats the baseline's highest (tuner.results.confirmation);
     the schedule also needs its validation (tuner.results.schedule) and must lead every static winner.
     A confirmation skipped by ``confirm.skip_when_behind`` serves the baseline.
  5. Without one (``confirm.enabled: false``, or not finished), the trials decide: the best speculative
     trial is served if its score is above the best baseline's; the answer says it rests on one engine each.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from tuner.errors import UserError
from tuner.results import confirmation as confirmations
from tuner.results import schedule_run as schedules
from tuner.results import store
from tuner.results.confirmation import Confirmation, Decision
from tuner.results.noise import NOISE_FLOOR, study_noise
from tuner.results.schedule_run import ScheduleRun
from tuner.results.scoring import SLO_RATE_LEVEL, apply_reference

if TYPE_CHECKING:
    import optuna

    from tuner.study.config import StudyConfig

OUTCOME_ATTR = "outcome"  # Optuna study user attribute
VERSION = 1
STALE_SCHEDULE = "the stored batch-size schedule read fewer trials than the study has: run `optimize` again"
Verdict = Literal["speculation", "schedule", "no speculation", "no baseline"]


class ModeBaseline(BaseModel):
    """The best completed baseline of one enforce_eager mode, or the attempts that did not complete."""

    enforce_eager: bool
    trial: int | None = None
    tokens_per_s: dict[int, float] = {}
    failures: list[str] = []  # "trial 3: timeout", one per attempt that did not complete


class LevelBest(BaseModel):
    """The fastest completed configuration at one level, and its speedup over the reference there."""

    level: int
    trial: int
    label: str
    tokens_per_s: float
    speedup: float | None = None
    is_baseline: bool = False


class Exported(BaseModel):
    """What ``export`` writes: the engine arguments exactly as measured."""

    kind: Literal["trial", "schedule"]
    trial: int  # the trial measured with these arguments (a schedule: its drafter's best trial)
    label: str
    speculative: bool
    llm_kwargs: dict[str, Any]
    resolved_args: dict[str, int] = {}  # what the measured engine resolved and the file pins (max_num_seqs, ...)
    env: dict[str, str] = {}  # the measured engine's environment variables (target.env): the file names them


class StudyOutcome(BaseModel):
    version: int = VERSION
    basis: str  # what it was computed from: a resumed study with more measured is decided again
    study_name: str
    mode: str = "offline"
    reference: dict[int, float] = {}
    baselines: list[ModeBaseline] = []
    best_per_level: list[LevelBest] = []
    best_speculative: int | None = None  # the best speculative trial with a known speedup
    unknown_speedup: list[int] = []  # speculative trials with no completed baseline of their mode
    confirmation: Confirmation | None = None  # the current one (same finalists), measured or not
    decision: Decision | None = None
    schedule: ScheduleRun | None = None  # the current one, its verdict filled in
    verdict: Verdict
    rule: str
    reason: str
    chosen: int | None = None  # the trial whose configuration is served (the baseline when speculation lost)
    baseline: int | None = None  # the best baseline
    speedup: float | None = None  # the served configuration's stated speedup (confirmed median, else its trial's)
    confirmed: bool = False  # the verdict rests on fresh engines
    exported: Exported | None = None

    @property
    def paid(self) -> bool:
        return self.verdict in ("speculation", "schedule")

    def summary(self) -> str:
        """One line: what is served and why."""
        if self.exported is None:
            return f"no winner: {self.reason}"
        what = self.exported.label
        speed = f" at {self.speedup:.2f}x no speculation" if self.speedup is not None and self.paid else ""
        return f"{'serve' if self.paid else 'serve without speculation:'} {what}{speed}: {self.reason}"


# -- reading --------------------------------------------------------------------------------------------
def basis(study: optuna.Study) -> str:
    """What the outcome reads from the study: its finished trials, the stored confirmation and schedule.
    (Settings that change the rules, confirm and schedule, take effect when ``optimize`` decides again.)"""
    trials = [
        (t.number, t.state.name, store.failure_class(t))
        for t in study.get_trials(deepcopy=False)
        if t.state.name in ("COMPLETE", "FAIL")
    ]
    blob = {
        "v": VERSION,
        "trials": trials,
        "confirmation": study.user_attrs.get(confirmations.CONFIRMATION),
        "schedule": study.user_attrs.get(schedules.SCHEDULE_ATTR),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load(study: optuna.Study) -> StudyOutcome | None:
    raw = study.user_attrs.get(OUTCOME_ATTR)
    if not raw or raw.get("version") != VERSION:
        return None
    return StudyOutcome.model_validate(raw)


def read(study: optuna.Study, config: StudyConfig | None = None) -> StudyOutcome:
    """The stored outcome while nothing it read has changed, else the same decision computed now, under the
    settings of the study file last run (stored with the study)."""
    stored = load(study)
    if stored is not None and stored.basis == basis(study):
        return stored
    return decide(study, config or store.config_from_study(study))


def save(study: optuna.Study, outcome: StudyOutcome) -> None:
    study.set_user_attr(OUTCOME_ATTR, outcome.model_dump(mode="json"))


# -- deciding -------------------------------------------------------------------------------------------
def expected_finalists(
    study: optuna.Study,
    config: StudyConfig | None,
    n: int,
    schedule: ScheduleRun | None,
    tie_noise: float | None = None,
) -> Confirmation | None:
    """The confirmation the study's current trials call for (engines not measured), or None: nothing to confirm.
    ``tie_noise``: the tie rule's noise to choose finalists with (a stored confirmation's, to check it against
    the rule it was planned under; 0 before the rule); by default the study's noise now."""
    stored = confirmations.load(study)
    rounds = config.confirm.rounds if config is not None else (stored.rounds if stored else 1)
    repeats = (
        (config.confirm.repeats or config.workload.repeats) if config is not None else (stored.repeats if stored else 1)
    )
    weights = confirmations.judged_levels(config) if config is not None else (stored.weights if stored else {})
    done = store.completed(study)
    noise = max((study_noise(done, level) for level in weights if level != SLO_RATE_LEVEL), default=NOISE_FLOOR)
    base = store.best_baseline(study)
    eligible = _eligible(study)
    specs = confirmations.speculative_finalists(study, n, eligible, noise if tie_noise is None else tie_noise)
    drafter = schedule.schedule if schedule is not None else None
    if base is None or (not specs and drafter is None):
        return None
    chosen = (drafter.trial, f"{drafter.drafter}: {drafter.text()}") if drafter is not None else None
    return Confirmation(
        finalists=confirmations.finalists(specs, base, chosen),
        rounds=rounds,
        repeats=repeats,
        weights=weights,
        tie_noise=noise,
    )


def _eligible(study: optuna.Study) -> set[int]:
    modes = store.baseline_modes(study)
    return {
        t.number
        for t in store.completed(study)
        if (s := store.trial_spec(t)) is not None and not s.is_baseline and s.enforce_eager in modes
    }


def current_confirmation(
    study: optuna.Study, config: StudyConfig | None, schedule: ScheduleRun | None
) -> Confirmation | None:
    """The stored confirmation if it is of the finalists, rounds and repeats the study calls for now."""
    stored = confirmations.load(study)
    if stored is None:
        return None
    n = len([f for f in stored.finalists if not f.is_baseline and not f.schedule])
    if config is not None:
        n = config.confirm.speculative
    expected = expected_finalists(study, config, n, schedule, tie_noise=stored.tie_noise)
    if expected is None:
        return None
    return stored.answering(expected)


def decide(study: optuna.Study, config: StudyConfig | None = None) -> StudyOutcome:
    completed = store.completed(study)
    if not completed:
        raise UserError(
            f"study '{study.study_name}' has no completed trial yet; fix: run `python -m tuner optimize` until one completes"
        )
    ref = store.reference(study)
    out = StudyOutcome(
        basis=basis(study),
        study_name=study.study_name,
        mode=next((m.mode for t in completed if (m := store.trial_metrics(t)) is not None), "offline"),
        reference=ref,
        baselines=_baselines(study, config, ref),
        best_per_level=_best_per_level(study, ref),
        verdict="no baseline",
        rule="",
        reason="",
    )
    base = store.best_baseline(study)
    eligible = _eligible(study)
    out.unknown_speedup = sorted(
        t.number
        for t in completed
        if (s := store.trial_spec(t)) is not None and not s.is_baseline and t.number not in eligible
    )
    if base is None:
        tried = "; ".join(f for b in out.baselines for f in b.failures) or "none measured"
        out.rule = "a speedup needs a completed baseline without speculation"
        out.reason = (
            f"no baseline without speculation completed ({tried}); fix: run `python -m tuner optimize` again "
            "(a failed baseline is retried), or raise budget.trial_timeout_s"
        )
        return out
    out.baseline = base.number
    best = confirmations.speculative_finalists(study, 1, eligible)
    out.best_speculative = best[0].number if best else None
    schedule_enabled = config.schedule.enabled if config is not None else schedules.load(study) is not None
    run = schedules.current(study) if schedule_enabled else None
    if run is None and schedule_enabled and schedules.load(study) is not None:
        run = ScheduleRun(basis=[], note=STALE_SCHEDULE)
    conf = current_confirmation(study, config, run)
    out.confirmation = conf
    if run is not None:
        out.schedule = _schedule_verdict(study, config, run, conf, ref)
    confirm_enabled = config.confirm.enabled if config is not None else conf is not None
    if conf is not None and conf.complete and confirm_enabled:
        _by_confirmation(study, out, conf, base.number)
    else:
        why = (
            "confirm.enabled is false"
            if not confirm_enabled
            else ("the confirmation is unfinished" if conf is not None else "nothing was confirmed yet")
        )
        _by_trials(study, out, base.number, why)
    out.exported = _exported(study, out)
    return out


def _by_confirmation(study: optuna.Study, out: StudyOutcome, conf: Confirmation, base: int) -> None:
    out.confirmed = True
    out.rule = f"fresh engines, interleaved: {confirmations.RULE}"
    if conf.skipped:
        out.decision = conf.decide()
        out.verdict, out.chosen = "no speculation", base
        out.rule = "confirm.skip_when_behind: no fresh engine can reverse an order this far beyond the noise"
        out.reason = conf.skipped
        return
    decision = conf.decide()
    out.decision = decision
    if out.schedule is not None and out.schedule.exported:
        mine = next(r for r in decision.speculative if r.schedule)
        out.verdict, out.chosen, out.speedup = "schedule", None, mine.median
        out.reason = out.schedule.verdict.reason if out.schedule.verdict is not None else ""
        return
    if decision.winner is not None:
        won = next(r for r in decision.speculative if r.trial == decision.winner and not r.schedule)
        out.verdict, out.chosen, out.speedup = "speculation", decision.winner, won.median
        out.reason = f"{won.label} won beyond the spread between fresh engines ({won.low:.3f}x at its lowest)"
        return
    out.verdict, out.chosen = "no speculation", base
    out.reason = "no speculative configuration beat the baseline beyond the spread between fresh engines"
    if decision.note:
        out.reason += f" ({decision.note})"


def _by_trials(study: optuna.Study, out: StudyOutcome, base: int, why: str) -> None:
    out.rule = f"the trials alone, one engine per configuration ({why}): best score against the best baseline's"
    ref = out.reference
    base_metrics = store.trial_metrics(study.trials[base])
    assert base_metrics is not None
    base_score = apply_reference(base_metrics, ref).score
    if out.best_speculative is not None:
        metrics = store.trial_metrics(study.trials[out.best_speculative])
        assert metrics is not None
        scored = apply_reference(metrics, ref)
        if scored.score > base_score:
            out.verdict, out.chosen, out.speedup = "speculation", out.best_speculative, scored.speedup
            out.reason = f"score {scored.score:.3f} over the baseline's {base_score:.3f}, in one engine each"
            return
        out.reason = f"the best speculative trial scored {scored.score:.3f}, not above the baseline's {base_score:.3f}"
    else:
        out.reason = "no speculative trial with a known speedup completed"
    if out.unknown_speedup:
        modes = ", ".join(sorted({_mode(study, n) for n in out.unknown_speedup}))
        out.reason += (
            f"; trials {out.unknown_speedup} ({modes}) have no completed baseline of their mode: speedup unknown"
        )
    out.verdict, out.chosen = "no speculation", base


def _mode(study: optuna.Study, number: int) -> str:
    spec = store.trial_spec(study.trials[number])
    return "eager" if spec is not None and spec.enforce_eager else "compiled"


def _schedule_verdict(
    study: optuna.Study, config: StudyConfig | None, run: ScheduleRun, conf: Confirmation | None, ref: dict[int, float]
) -> ScheduleRun:
    """The stored schedule with what its confirmation engines measured and the verdict on it."""
    run = run.model_copy(deep=True)
    if run.schedule is None or conf is None:
        if run.schedule is not None:
            run.note = run.note or "no confirmation of it yet"
        return run
    engine = schedules.representative(conf)
    if engine is None:
        run.note = "not measured yet"
        return run
    run.mlflow_run_id, run.wall_s, run.measured_on, run.engine = (
        engine.mlflow_run_id,
        engine.wall_s,
        engine.measured_on,
        engine.engine,
    )
    if engine.failure:
        run.failure = engine.failure
        return run
    if engine.metrics is None or config is None:
        return run
    run.metrics = apply_reference(engine.metrics, ref)
    decision = conf.decide() if conf.complete else None
    run.verdict = schedules.verdict_for(study, config, run.metrics, schedules.confirmed_by(conf, decision))
    return run


def _exported(study: optuna.Study, out: StudyOutcome) -> Exported | None:
    if out.verdict == "schedule" and out.schedule is not None and out.schedule.schedule is not None:
        s = out.schedule.schedule
        engine = schedules.representative(out.confirmation) if out.confirmation is not None else None
        return Exported(
            kind="schedule",
            trial=s.trial,
            label=f"{s.drafter}, num_speculative_tokens by level: {s.text()}",
            speculative=True,
            llm_kwargs=dict(out.schedule.llm_kwargs or {}),
            resolved_args=dict(engine.resolved_args) if engine is not None else {},
            env=dict(store.trial_record(study.trials[s.trial]).env or {}),
        )
    if out.chosen is None:
        return None
    trial = study.trials[out.chosen]
    record = store.trial_record(trial)
    if record.llm_kwargs is None:
        raise UserError(f"trial {trial.number} of study '{study.study_name}' has no recorded engine arguments")
    spec = record.spec
    return Exported(
        kind="trial",
        trial=trial.number,
        label=spec.label() if spec else f"trial {trial.number}",
        speculative=spec is not None and not spec.is_baseline,
        llm_kwargs=dict(record.llm_kwargs),
        resolved_args=dict(record.resolved_args or {}),
        env=dict(record.env or {}),
    )


def _baselines(study: optuna.Study, config: StudyConfig | None, ref: dict[int, float]) -> list[ModeBaseline]:
    modes = {eager: ModeBaseline(enforce_eager=eager) for eager in (config.search.enforce_eager if config else [])}
    best_score: dict[bool, float] = {}
    for t in study.get_trials(deepcopy=False):
        spec = store.trial_spec(t)
        if spec is None or not spec.is_baseline:
            continue
        mode = modes.setdefault(spec.enforce_eager, ModeBaseline(enforce_eager=spec.enforce_eager))
        metrics = store.trial_metrics(t) if t.state.name == "COMPLETE" else None
        if metrics is None:
            if t.state.name == "FAIL":
                mode.failures.append(f"trial {t.number}: {store.failure_class(t) or 'failed'}")
            continue
        score = apply_reference(metrics, ref).score
        if score > best_score.get(spec.enforce_eager, float("-inf")):
            best_score[spec.enforce_eager] = score
            mode.trial = t.number
            mode.tokens_per_s = {lv.batch_size: lv.tokens_per_s for lv in metrics.levels}
    return [modes[k] for k in sorted(modes)]


def _best_per_level(study: optuna.Study, ref: dict[int, float]) -> list[LevelBest]:
    best: dict[int, LevelBest] = {}
    for t in store.completed(study):
        spec, metrics = store.trial_spec(t), store.trial_metrics(t)
        if spec is None or metrics is None:
            continue
        for lv in apply_reference(metrics, ref).levels:
            held = best.get(lv.batch_size)
            if held is None or lv.tokens_per_s > held.tokens_per_s:
                best[lv.batch_size] = LevelBest(
                    level=lv.batch_size,
                    trial=t.number,
                    label=spec.label(),
                    tokens_per_s=lv.tokens_per_s,
                    speedup=lv.speedup,
                    is_baseline=spec.is_baseline,
                )
    return [best[k] for k in sorted(best)]
