"""Confirm the study's finalists in fresh engines before export declares a winner.

One engine's throughput differs from another's of the same configuration by more than the repeats
inside one engine vary (docs/benchmarks.md: 616 against 439 tok/s on an H200). So after the trials the
best speculative configuration(s) and the best baseline are measured again, each in ``confirm.rounds``
fresh engines, interleaved (A, B, A, B, ...), and speculation is exported only when it wins by more
than the spread between engines.

Rule: each confirmation engine gets a value, its weighted speedup over the baseline's confirmation
engines (per batch size: the engine's median tokens/s over the median of the baseline engines' medians,
weighted by ``workload.batch_weights``). A speculative finalist wins when its **lowest** engine value is
above the baseline's **highest** (min A > max B): no pairing of engines reverses the order.

No engine is started when the best speculative trial is already more than the study's noise below
no speculation (``confirm.skip_when_behind``, pruning's noise): the baseline is served, and the stored
confirmation says why no engine was measured.

Every engine's result is written to the Optuna study (user attribute ``confirmation``) as soon as it is
measured: an interrupted confirmation resumes where it stopped and loses nothing measured; ``export``
and ``report`` read the decision from there.
"""

from __future__ import annotations

import statistics
import sys
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tuner.results import store
from tuner.trial.interrupts import sigterm_interrupts

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig
    from tuner.trial.optimize import StudyRunner

CONFIRMATION = "confirmation"  # Optuna study user attribute
RULE = "min over A's engines > max over the baseline's engines"


class EngineRun(BaseModel):
    round: int
    trial: int  # the finalist's trial number
    levels: dict[int, float] = {}  # batch size -> median output tokens/s in this engine
    wall_s: float = 0.0
    failure: str | None = None
    mlflow_run_id: str = ""


class Finalist(BaseModel):
    trial: int
    label: str
    is_baseline: bool


class FinalistResult(BaseModel):
    trial: int
    label: str
    values: list[float]  # per engine: weighted speedup over the baseline's confirmation engines
    median: float
    low: float
    high: float
    spread: float  # (high - low) / median: the between-engine spread
    wins: bool = False


class Decision(BaseModel):
    winner: int | None  # trial number of the confirmed speculative winner; None: serve the baseline
    baseline: FinalistResult | None
    speculative: list[FinalistResult]
    note: str = ""


class Confirmation(BaseModel):
    finalists: list[Finalist]
    rounds: int
    repeats: int
    weights: dict[int, float]
    engines: list[EngineRun] = []
    skipped: str = ""  # why no fresh engine was needed (confirm.skip_when_behind); the baseline is served

    def plan(self) -> list[tuple[int, Finalist]]:
        """Interleaved: round 1 A, B; round 2 A, B; ..."""
        if self.skipped:
            return []
        return [(r, f) for r in range(self.rounds) for f in self.finalists]

    def measured(self, round_: int, trial: int) -> EngineRun | None:
        return next((e for e in self.engines if e.round == round_ and e.trial == trial), None)

    @property
    def complete(self) -> bool:
        return all(self.measured(r, f.trial) is not None for r, f in self.plan())

    def same_finalists(self, other: list[Finalist]) -> bool:
        return [f.trial for f in self.finalists] == [f.trial for f in other]

    def _reference(self) -> dict[int, float]:
        """Per batch size: the median over the baseline's confirmation engines of their medians."""
        base = {f.trial for f in self.finalists if f.is_baseline}
        runs = [e for e in self.engines if e.trial in base and e.failure is None]
        ref = {}
        for bs in self.weights:
            values = [e.levels[bs] for e in runs if bs in e.levels]
            if values and statistics.median(values) > 0:
                ref[bs] = statistics.median(values)
        return ref

    def engine_value(self, run: EngineRun) -> float:
        """One engine's weighted speedup over the baseline's confirmation engines."""
        ref = self._reference()
        used = {bs: w for bs, w in self.weights.items() if bs in run.levels and bs in ref}
        total = sum(used.values())
        return sum(w * run.levels[bs] / ref[bs] for bs, w in used.items()) / total if total else 0.0

    def decide(self) -> Decision:
        base = next((f for f in self.finalists if f.is_baseline), None)
        specs = [f for f in self.finalists if not f.is_baseline]
        if base is None:
            return Decision(winner=None, baseline=None, speculative=[], note="no baseline finalist")
        if self.skipped:
            return Decision(winner=None, baseline=None, speculative=[], note=self.skipped)
        if not self._reference():
            return Decision(winner=None, baseline=None, speculative=[], note="no baseline engine completed")
        value = self.engine_value

        def result(f: Finalist) -> FinalistResult | None:
            runs = [e for e in self.engines if e.trial == f.trial]
            if not runs or any(e.failure for e in runs):
                return None
            values = [value(e) for e in runs]
            mid = statistics.median(values)
            return FinalistResult(
                trial=f.trial,
                label=f.label,
                values=values,
                median=mid,
                low=min(values),
                high=max(values),
                spread=(max(values) - min(values)) / mid if mid else 0.0,
            )

        baseline = result(base)
        spec_results: list[FinalistResult] = []
        notes = []
        for f in specs:
            r = result(f)
            if r is None:
                notes.append(f"{f.label} (trial {f.trial}) failed in a confirmation engine")
                continue
            r.wins = baseline is not None and r.low > baseline.high
            spec_results.append(r)
        winners = [r for r in spec_results if r.wins]
        best = max(winners, key=lambda r: r.median, default=None)
        return Decision(
            winner=best.trial if best else None, baseline=baseline, speculative=spec_results, note="; ".join(notes)
        )

    def summary_lines(self) -> list[str]:
        """Plain lines for the export header and the report."""
        if not self.complete:
            done = len(self.engines)
            return [f"confirmation in fresh engines incomplete ({done} of {len(self.plan())} engines measured)"]
        if self.skipped:
            return [f"not confirmed in fresh engines, none needed: {self.skipped}"]
        d = self.decide()
        from tuner.results.scoring import SLO_RATE_LEVEL

        value = (
            "highest request rate keeping the SLO over the baseline engines'"
            if list(self.weights) == [SLO_RATE_LEVEL]
            else "weighted speedup over the baseline's confirmation engines"
        )
        lines = [
            f"confirmed in {self.rounds} fresh engine(s) per finalist, interleaved, {self.repeats} repeat(s) per "
            f"level; value = {value}; rule: {RULE}"
        ]
        if d.baseline is not None:
            b = d.baseline
            lines.append(f"baseline {b.label} (trial {b.trial}): {_span(b)}")
        for r in d.speculative:
            verdict = "WINS beyond the between-engine spread" if r.wins else "does NOT win beyond the spread"
            lines.append(f"{r.label} (trial {r.trial}): {_span(r)}: {verdict}")
        if d.note:
            lines.append(d.note)
        return lines


def _span(r: FinalistResult) -> str:
    values = ", ".join(f"{v:.3f}" for v in r.values)
    return f"median {r.median:.3f}x (engines {values}; spread {r.spread:.1%})"


# -- reading it back ----------------------------------------------------------------------------------
def load(study: optuna.Study) -> Confirmation | None:
    raw = study.user_attrs.get(CONFIRMATION)
    return Confirmation.model_validate(raw) if raw else None


def current(study: optuna.Study) -> Confirmation | None:
    """The stored confirmation if it is of the study's current finalists (a resumed study may have new ones)."""
    conf = load(study)
    if conf is None:
        return None
    specs = _speculative_finalists(study, len([f for f in conf.finalists if not f.is_baseline]))
    base = store.best_baseline(study)
    if base is None or not specs:
        return None
    return conf if conf.same_finalists(_finalists(specs, base)) else None


def _speculative_finalists(study: optuna.Study, n: int) -> list[FrozenTrial]:
    """The n best speculative trials by score, one per configuration."""
    ranked = sorted(
        (t for t in store.completed(study) if (s := store.trial_spec(t)) is not None and not s.is_baseline),
        key=lambda t: (-(m.score if (m := store.trial_metrics(t)) else float("-inf")), t.number),
    )
    seen: set[Any] = set()
    out = []
    for t in ranked:
        spec = store.trial_spec(t)
        assert spec is not None
        if spec.key() in seen:
            continue
        seen.add(spec.key())
        out.append(t)
    return out[:n]


def _finalists(specs: list[FrozenTrial], base: FrozenTrial) -> list[Finalist]:
    out = []
    for t in [*specs, base]:
        spec = store.trial_spec(t)
        assert spec is not None
        out.append(Finalist(trial=t.number, label=spec.label(), is_baseline=spec.is_baseline))
    return out


# -- measuring ----------------------------------------------------------------------------------------
def confirm_study(runner: StudyRunner) -> Confirmation | None:
    """Measure the finalists in fresh engines (resuming a stored, unfinished confirmation)."""
    config, study = runner.config, runner.study
    if study is None or not config.confirm.enabled:
        return None
    base = store.best_baseline(study)
    specs = _speculative_finalists(study, config.confirm.speculative)
    if base is None or not specs:
        return None
    finalists = _finalists(specs, base)
    conf = load(study)
    same = conf is not None and conf.same_finalists(finalists)
    kept = conf.engines if conf is not None and same else []  # engines measured are never dropped
    behind = clearly_behind(study, config, specs[0]) if config.confirm.skip_when_behind else ""
    if (behind and not kept) or conf is None or not same or conf.skipped or conf.rounds != config.confirm.rounds:
        conf = Confirmation(
            finalists=finalists,
            rounds=config.confirm.rounds,
            repeats=config.confirm.repeats or config.workload.repeats,
            weights=_weights(config),
            engines=list(kept),
            skipped="" if kept else behind,
        )
        study.set_user_attr(CONFIRMATION, conf.model_dump(mode="json"))
    with sigterm_interrupts():
        for round_, finalist in conf.plan():
            if conf.measured(round_, finalist.trial) is not None:
                continue
            if not runner.deadline.allows(study.get_trials(deepcopy=False), "a confirmation engine"):
                return conf  # unfinished: no decision yet; the next run resumes here
            run = _measure(runner, conf, round_, finalist)
            conf.engines.append(run)
            study.set_user_attr(CONFIRMATION, conf.model_dump(mode="json"))  # durable before the next engine
    _log_decision(runner, conf)
    return conf


def clearly_behind(study: optuna.Study, config: StudyConfig, best_spec: FrozenTrial) -> str:
    """Why fresh engines cannot matter, or "": the best speculative trial's weighted speedup is more than the
    study's noise below 1 (tuner.trial.pruning's noise: the largest spread between one engine's repeats at any
    measured level, at least 3%). Under the goodput objective the SLO search decides: always confirmed."""
    from tuner.results.noise import study_noise
    from tuner.results.scoring import SLO_RATE_LEVEL

    if list(_weights(config)) == [SLO_RATE_LEVEL]:
        return ""
    metrics = store.scored_metrics(study, best_spec)
    spec = store.trial_spec(best_spec)
    if metrics is None or metrics.speedup is None or spec is None:
        return ""
    done = store.completed(study)
    noise = max(study_noise(done, level) for level in config.workload.batch_sizes)
    if metrics.speedup >= 1.0 - noise:
        return ""
    return (
        f"the best speculative trial, {spec.label()} (trial {best_spec.number}), measured {metrics.speedup:.2f}x "
        f"no speculation, more than the study's noise ({noise:.0%}) below it; no speculation is served "
        "(confirm.skip_when_behind)"
    )


def _weights(config: StudyConfig) -> dict[int, float]:
    """What each confirmation engine is judged on: the weighted levels, or under the goodput objective
    the SLO rate alone (kept under ``SLO_RATE_LEVEL``)."""
    from tuner.results.scoring import SLO_RATE_LEVEL

    w = config.workload
    if w.mode == "serve" and w.serve.objective == "goodput":
        return {SLO_RATE_LEVEL: 1.0}
    return dict(zip(w.batch_sizes, w.weights(), strict=True))


def _level_text(level: int, value: float) -> str:
    from tuner.results.scoring import SLO_RATE_LEVEL

    return f"SLO kept up to {value:g} requests/s" if level == SLO_RATE_LEVEL else f"level {level}: {value:.1f} tok/s"


def _say(runner: StudyRunner, text: str) -> None:
    if runner.show_progress:
        print(f"confirm: {text}", file=sys.stderr, flush=True)


def _measure(runner: StudyRunner, conf: Confirmation, round_: int, finalist: Finalist) -> EngineRun:
    from tuner.engine.process import run_engine
    from tuner.engine.request import TrialRequest
    from tuner.results.scoring import SLO_RATE_LEVEL, level_metrics
    from tuner.results.tracking import PARENT_TAG, ROLE_TAG, STUDY_TAG
    from tuner.study.spec import llm_kwargs

    ps = runner.ready()
    trial = ps.study.trials[finalist.trial]
    spec = store.trial_spec(trial)
    assert spec is not None
    kwargs = llm_kwargs(runner.config.target, ps.preflight.target_path, spec)
    request = TrialRequest.for_study(runner.config, ps.prompts, kwargs).model_copy(update={"repeats": conf.repeats})
    _say(runner, f"round {round_ + 1}/{conf.rounds}: {finalist.label} (trial {finalist.trial}) in a fresh engine")
    workdir = runner.workdir / f"confirm-r{round_ + 1}-trial-{finalist.trial:03d}"
    outcome = run_engine(request, workdir, runner.config.budget.trial_timeout_s)
    run = EngineRun(round=round_, trial=finalist.trial, wall_s=outcome.wall_s)
    if outcome.result is None:
        run.failure = f"{outcome.failure}: {outcome.message}"[:500]
        _say(runner, f"  failed: {run.failure[:160]}")
    else:
        for bs in runner.config.workload.batch_sizes:
            reps = [r for r in outcome.result.repeats if r.batch_size == bs]
            if reps:
                run.levels[bs] = level_metrics(bs, reps, 0.0).tokens_per_s
        if outcome.result.slo is not None:
            run.levels[SLO_RATE_LEVEL] = outcome.result.slo.max_rate_rps
        _say(runner, "  " + ", ".join(_level_text(bs, v) for bs, v in run.levels.items()))
    if runner.tracker is not None:
        tracker = runner.tracker
        mlrun = tracker.client.create_run(
            tracker.experiment_id,
            run_name=f"confirm r{round_ + 1} {finalist.label} (trial {finalist.trial})",
            tags={
                PARENT_TAG: runner.parent_run,
                STUDY_TAG: runner.config.name,
                ROLE_TAG: "confirmation",
                "confirm.round": str(round_ + 1),
                "confirm.trial": str(finalist.trial),
                "is_baseline": str(finalist.is_baseline).lower(),
            },
        )
        run.mlflow_run_id = str(mlrun.info.run_id)
        metrics = {(f"tokens_per_s_bs{bs}" if bs else "slo_max_rate_rps"): v for bs, v in run.levels.items()}
        metrics["engine_wall_s"] = run.wall_s
        tracker.log_metrics(run.mlflow_run_id, metrics)
        if run.failure:
            tracker.set_tags(run.mlflow_run_id, {"failure_class": outcome.failure or "", "error": run.failure})
        tracker.end_trial(run.mlflow_run_id, "FAILED" if run.failure else "FINISHED")
    return run


def _log_decision(runner: StudyRunner, conf: Confirmation) -> None:
    decision = conf.decide()
    for line in conf.summary_lines():
        _say(runner, line)
    if runner.tracker is None:
        return
    tracker = runner.tracker
    tags: dict[str, Any] = {
        "confirm.rule": RULE,
        "confirm.winner": str(decision.winner) if decision.winner is not None else "none",
        "confirm.verdict": "speculation confirmed" if decision.winner is not None else "baseline (not confirmed)",
    }
    tracker.set_tags(runner.parent_run, tags)
    metrics: dict[str, float] = {}
    if decision.baseline is not None:
        metrics["confirm_baseline_spread"] = decision.baseline.spread
    for r in decision.speculative:
        metrics[f"confirm_speedup_trial{r.trial}"] = r.median
        metrics[f"confirm_spread_trial{r.trial}"] = r.spread
    for e in conf.engines:
        if e.mlflow_run_id and e.failure is None:
            tracker.log_metrics(e.mlflow_run_id, {"confirm_value": conf.engine_value(e)})
    if metrics:
        tracker.log_metrics(runner.parent_run, metrics)
