"""The study's batch-size schedule as stored: derived from the trials, measured among the confirmation's
fresh engines, and its verdict (the rules: tuner.results.schedule). Read here; engines run in tuner.trial."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tuner.results import store
from tuner.results.confirmation import Confirmation, Decision
from tuner.results.noise import study_noise
from tuner.results.schedule import DEFAULT_CAP, Derivation, Option, Schedule, StaticBest, Verdict, decide, derive
from tuner.results.scoring import TrialMetrics
from tuner.study import methods
from tuner.study.spec import TrialSpec

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig

SCHEDULE_ATTR = "batch_schedule"  # Optuna study user attribute


class ScheduleRun(BaseModel):
    basis: list[int]  # the completed trials the derivation and the verdict read
    derivation: Derivation = Derivation()
    note: str = ""  # why no schedule was measured
    llm_kwargs: dict[str, Any] | None = None  # the schedule engines' arguments (secrets masked)
    metrics: TrialMetrics | None = None  # its lowest-valued confirmation engine, scored as a trial
    failure: str | None = None
    engine: dict[str, str] = {}
    measured_on: str = ""  # the schedule engine's date
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
            return f"{head} NOT exported: its engine failed: {self.failure[:200]}"
        if self.verdict is None:
            return f"{head}: not validated yet{f' ({self.note})' if self.note else ''}"
        return f"{head} {'exported' if self.verdict.exported else 'NOT exported'}: {self.verdict.reason}"


def drafter_label(spec: TrialSpec) -> str:
    """A drafter's settings but k: what one schedule varies k over (named as its trials' labels name it)."""
    rule = methods.rules(spec.method)
    parts = [spec.method, spec.candidate] if rule.head else [spec.candidate]
    if rule.lookup:
        parts.append(f"lookup {spec.prompt_lookup_min}-{spec.prompt_lookup_max}")
    parts.append("eager" if spec.enforce_eager else "compiled")
    return " ".join(parts)


def _drafter_key(spec: TrialSpec) -> tuple[Any, ...]:
    extra = json.dumps(spec.extra, sort_keys=True, default=str)
    return (spec.method, spec.draft_model, spec.enforce_eager, spec.prompt_lookup_min, spec.prompt_lookup_max, extra)


def load(study: optuna.Study) -> ScheduleRun | None:
    raw = study.user_attrs.get(SCHEDULE_ATTR)
    return ScheduleRun.model_validate(raw) if raw else None


def current(study: optuna.Study) -> ScheduleRun | None:
    """The stored schedule run if it read the study's current trials (a resumed study may have more)."""
    run = load(study)
    return run if run is not None and run.basis == basis(study) else None


def basis(study: optuna.Study) -> list[int]:
    return sorted(t.number for t in store.completed(study))


def _scored(study: optuna.Study, trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, TrialSpec, TrialMetrics]]:
    out = []
    for t in trials:
        spec, metrics = store.trial_spec(t), store.scored_metrics(study, t)
        if spec is not None and metrics is not None:
            out.append((t, spec, metrics))
    return out


def derive_for(study: optuna.Study, config: StudyConfig) -> Derivation:
    """The schedule of the named drafter (``schedule.drafter``), or else of the best speculative trial's.
    Only drafters whose enforce_eager has a completed baseline (their speedups are known)."""
    rows = _scored(study, store.completed(study))
    wanted = config.schedule.drafter
    modes = store.baseline_modes(study)
    drafts = [
        r
        for r in rows
        if not r[1].is_baseline
        and methods.rules(r[1].method).batch_schedule
        and wanted in (None, r[1].candidate)
        and r[1].enforce_eager in modes
    ]
    bases = [r for r in rows if r[1].is_baseline]
    if not drafts or not bases:
        return Derivation(
            note="no completed " + ("speculative trial with a baseline of its mode" if not drafts else "baseline")
        )
    best = max(drafts, key=lambda r: (r[2].score, -r[0].number))
    group = [r for r in drafts if _drafter_key(r[1]) == _drafter_key(best[1])]
    same_eager = [r for r in bases if r[1].enforce_eager == best[1].enforce_eager]
    base = max(same_eager, key=lambda r: r[2].score)
    per_k: dict[int, tuple[FrozenTrial, TrialSpec, TrialMetrics]] = {}
    for r in sorted(group, key=lambda r: (-r[2].score, r[0].number)):
        per_k.setdefault(r[1].num_speculative_tokens or 0, r)
    options = [_option(0, base[0], base[2])] + [_option(k, t, m) for k, (t, _, m) in per_k.items()]
    levels = config.workload.batch_sizes
    return derive(drafter_label(best[1]), best[0].number, options, levels, noise(study, levels), _cap(config))


def _option(k: int, trial: FrozenTrial, metrics: TrialMetrics) -> Option:
    return Option(
        k=k,
        trial=trial.number,
        tokens_per_s={lv.batch_size: lv.tokens_per_s for lv in metrics.levels},
        speedup={lv.batch_size: lv.speedup for lv in metrics.levels},
    )


def noise(study: optuna.Study, levels: list[int]) -> dict[int, float]:
    done = store.completed(study)
    return {level: study_noise(done, level) for level in levels}


def _cap(config: StudyConfig) -> int:
    value = config.target.engine_args.get("max_num_seqs")
    return value if isinstance(value, int) and value > 0 else DEFAULT_CAP


def schedule_spec(study: optuna.Study, schedule: Schedule) -> TrialSpec:
    """The drafter trial's settings with k = the schedule's largest and the schedule itself."""
    spec = store.trial_spec(study.trials[schedule.trial])
    assert spec is not None  # the derivation read this trial's spec
    extra = {**spec.extra, methods.SCHEDULE: schedule.vllm_value()}
    return spec.model_copy(update={"num_speculative_tokens": schedule.max_k, "extra": extra})


def confirmed_by(conf: Confirmation | None, decision: Decision | None) -> tuple[bool, str]:
    """Rule 1 of the schedule's validation, read from the confirmation: whether it won, and why (not)."""
    if conf is None or decision is None or not conf.complete:
        return False, "the confirmation in fresh engines is not complete"
    mine = next((r for r in decision.speculative if r.schedule), None)
    if mine is None:
        return False, decision.note or "no schedule engine was measured"
    base = decision.baseline
    against = f"baseline engines up to {base.high:.3f}" if base is not None else "no baseline engine"
    if not mine.wins:
        return False, f"its engines {mine.low:.3f}-{mine.high:.3f} do not all beat the {against}"
    rival = max((r for r in decision.speculative if r.wins and not r.schedule), key=lambda r: r.median, default=None)
    if rival is not None and rival.median >= mine.median:
        return (
            False,
            f"the static {rival.label} (trial {rival.trial}) won by more ({rival.median:.3f} >= {mine.median:.3f})",
        )
    return True, f"its engines {mine.low:.3f}-{mine.high:.3f} beat the {against} (median {mine.median:.3f}x)"


def verdict_for(
    study: optuna.Study, config: StudyConfig, metrics: TrialMetrics, confirmed: tuple[bool, str]
) -> Verdict | None:
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
        noise(study, config.workload.batch_sizes),
        (t.number, spec.label(), m.score),
        confirmed,
    )


def representative(conf: Confirmation) -> Any:
    """The schedule's engine that speaks for it: the lowest-valued one (a schedule is judged by its worst engine)."""
    runs = [e for e in conf.engines if e.schedule]
    failed = next((e for e in runs if e.failure), None)
    if failed is not None or not runs:
        return failed
    values = [conf.engine_value(e) for e in runs]
    return runs[values.index(min(values))] if conf.reference() is not None else runs[0]
