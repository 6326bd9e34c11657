"""The confirmation of the study's finalists in fresh engines: what was measured, and its rule.

One engine's throughput differs from another's of the same configuration by more than the repeats
inside one engine vary (docs/benchmarks.md: 616 against 439 tok/s on an H200). So after the trials the
best speculative configuration(s), the batch-size schedule when one was derived, and the best baseline
are measured again, each in ``confirm.rounds`` fresh engines, interleaved (A, B, A, B, ...), and
speculation is exported only when it wins by more than the spread between engines.

Rule: each confirmation engine gets a value, its weighted speedup over the baseline's confirmation
engines (per level: the engine's median tokens/s over the median of the baseline engines' medians,
weighted by ``workload.batch_weights``; under the goodput objective the highest request rate keeping the
SLO over the baseline engines', or the rate itself when the baseline engines kept it at no rate). A
speculative finalist wins when its **lowest** engine value is above the baseline's **highest**
(min A > max B): no pairing of engines reverses the order.

No engine is started when the best speculative trial is already more than the study's noise below
no speculation and no schedule was derived (``confirm.skip_when_behind``): the baseline is served.

Pure records and rules; tuner.trial.confirm measures the engines, tuner.results.outcome decides.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tuner.results import store
from tuner.results.noise import study_noise
from tuner.results.scoring import SLO_RATE_LEVEL, TrialMetrics, apply_reference

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig

CONFIRMATION = "confirmation"  # Optuna study user attribute: the current confirmation
HISTORY = "confirmation_history"  # earlier confirmations (other finalists or settings): never dropped
RULE = "min over A's engines > max over the baseline's engines"
SCHEDULE_LABEL = "batch-size schedule"


class EngineRun(BaseModel):
    round: int
    trial: int  # the finalist's trial number (the schedule's: its drafter's best trial)
    schedule: bool = False  # the schedule finalist's engine
    ranges: list[list[int]] = []  # the schedule engine's num_speculative_tokens_per_batch_size, as it ran
    levels: dict[int, float] = {}  # level -> median output tokens/s in this engine (SLO_RATE_LEVEL: the rate)
    metrics: TrialMetrics | None = None  # the schedule's engines: every figure, as a trial's
    engine: dict[str, str] = {}
    resolved_args: dict[str, int] = {}  # what the engine resolved where its arguments left it to vLLM
    measured_on: str = ""
    wall_s: float = 0.0
    failure: str | None = None
    mlflow_run_id: str = ""


class Finalist(BaseModel):
    trial: int
    label: str
    is_baseline: bool
    schedule: bool = False
    num_speculative_tokens: int | None = None  # a static speculative finalist's k: the tie-break among winners

    @property
    def key(self) -> tuple[int, bool]:
        return self.trial, self.schedule

    @property
    def question(self) -> tuple[int, bool, str]:
        """What its engines measure: a schedule finalist is its ranges (in its label) as well as its trial."""
        return self.trial, self.schedule, self.label if self.schedule else ""


class FinalistResult(BaseModel):
    trial: int
    label: str
    values: list[float]  # per engine: its value against the baseline's confirmation engines
    median: float
    low: float
    high: float
    spread: float  # (high - low) / median: the between-engine spread
    per_level: dict[int, float] = {}  # level -> median over its engines of tokens/s over the baseline engines'
    wins: bool = False
    schedule: bool = False
    num_speculative_tokens: int | None = None


class Decision(BaseModel):
    winner: int | None  # trial number of the confirmed static speculative winner; None: none won
    schedule_wins: bool = False  # the schedule won beyond the spread (whether it is served: tuner.results.outcome)
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
    # Winners whose median is within this (relative) of the best winner's are tied, and the one with the
    # fewest speculative tokens is served: the same speed for less drafting. The study's noise when the
    # confirmation was planned; 0 (no tie-break) in confirmations stored before the rule.
    tie_noise: float = 0.0

    def plan(self) -> list[tuple[int, Finalist]]:
        """Interleaved: round 1 A, B; round 2 A, B; ..."""
        if self.skipped:
            return []
        return [(r, f) for r in range(self.rounds) for f in self.finalists]

    def measured(self, round_: int, finalist: Finalist) -> EngineRun | None:
        return next((e for e in self.engines if e.round == round_ and (e.trial, e.schedule) == finalist.key), None)

    @property
    def complete(self) -> bool:
        return all(self.measured(r, f) is not None for r, f in self.plan())

    def engines_to_run(self) -> int:
        return sum(1 for r, f in self.plan() if self.measured(r, f) is None)

    def answering(self, other: Confirmation) -> Confirmation | None:
        """This stored confirmation as the answer to ``other``'s question: itself when the question is the
        same, its engines of ``other``'s finalists when ``other`` asks a part of it, else None."""
        return self if self.same_as(other) else self.narrowed_to(other)

    def same_as(self, other: Confirmation) -> bool:
        """Same finalists (a schedule of the same ranges), rounds, repeats and judged levels: its engines
        answer the same question."""
        return [f.question for f in self.finalists] == [f.question for f in other.finalists] and self._same_plan(other)

    def _same_plan(self, other: Confirmation) -> bool:
        return (self.rounds, self.repeats, self.weights) == (other.rounds, other.repeats, other.weights)

    def narrowed_to(self, other: Confirmation) -> Confirmation | None:
        """This confirmation's engines of ``other``'s finalists, when ``other`` asks for some of this one's
        finalists under the same plan (a finalist dropped, for example a schedule no longer derived): the
        engines left were measured interleaved with each other and answer ``other``'s question. None: not
        a part of this one."""
        mine = {f.question for f in self.finalists}
        if self.skipped or not self._same_plan(other) or any(f.question not in mine for f in other.finalists):
            return None
        keys = {f.key for f in other.finalists}
        engines = [e for e in self.engines if (e.trial, e.schedule) in keys]
        return other.model_copy(update={"engines": engines, "skipped": ""})

    def _engines_of(self, finalist: Finalist) -> list[EngineRun]:
        return [e for e in self.engines if (e.trial, e.schedule) == finalist.key]

    def reference(self) -> dict[int, float] | None:
        """Per level: the median over the baseline's confirmation engines of their medians; None: no baseline
        engine completed. A rate of 0 (the baseline kept the SLO at no rate tried) is a reference too."""
        base = next((f for f in self.finalists if f.is_baseline), None)
        runs = [e for e in self._engines_of(base) if e.failure is None] if base is not None else []
        if not runs:
            return None
        ref = {}
        for level in self.weights:
            values = [e.levels[level] for e in runs if level in e.levels]
            if values:
                ref[level] = statistics.median(values)
        return ref

    def engine_value(self, run: EngineRun) -> float:
        """One engine's weighted value against the baseline's confirmation engines."""
        ref = self.reference() or {}
        total = 0.0
        value = 0.0
        for level, w in self.weights.items():
            if level not in run.levels or level not in ref:
                continue
            if ref[level] > 0:
                value += w * run.levels[level] / ref[level]
            elif level == SLO_RATE_LEVEL:  # the baseline kept the SLO at no rate: the rate itself
                value += w * run.levels[level]
            else:
                continue
            total += w
        return value / total if total else 0.0

    def decide(self) -> Decision:
        base = next((f for f in self.finalists if f.is_baseline), None)
        if base is None:
            return Decision(winner=None, baseline=None, speculative=[], note="no baseline finalist")
        if self.skipped:
            return Decision(winner=None, baseline=None, speculative=[], note=self.skipped)
        ref = self.reference()
        if ref is None:
            return Decision(winner=None, baseline=None, speculative=[], note="no baseline engine completed")

        def result(f: Finalist) -> FinalistResult | None:
            runs = self._engines_of(f)
            if not runs or any(e.failure for e in runs):
                return None
            values = [self.engine_value(e) for e in runs]
            mid = statistics.median(values)
            per_level = {
                level: statistics.median(e.levels[level] / ref[level] for e in runs)
                for level in self.weights
                if level != SLO_RATE_LEVEL and ref.get(level) and all(level in e.levels for e in runs)
            }
            return FinalistResult(
                trial=f.trial,
                label=f.label,
                values=values,
                median=mid,
                low=min(values),
                high=max(values),
                spread=(max(values) - min(values)) / mid if mid else 0.0,
                per_level=per_level,
                schedule=f.schedule,
                num_speculative_tokens=f.num_speculative_tokens,
            )

        baseline = result(base)
        spec_results: list[FinalistResult] = []
        notes = []
        for f in self.finalists:
            if f.is_baseline:
                continue
            r = result(f)
            if r is None:
                notes.append(f"{f.label} (trial {f.trial}) failed in a confirmation engine")
                continue
            r.wins = baseline is not None and r.low > baseline.high
            spec_results.append(r)
        static = [r for r in spec_results if r.wins and not r.schedule]
        best = max(static, key=lambda r: r.median, default=None)
        if best is not None:
            fewer = _fewest_tokens_tied(static, best, self.tie_noise)
            if fewer is not best:
                notes.append(
                    f"{fewer.label} is served: its median {fewer.median:.3f}x is within the study's noise "
                    f"({self.tie_noise:.0%}) of {best.label}'s {best.median:.3f}x, with fewer speculative tokens"
                )
                best = fewer
        return Decision(
            winner=best.trial if best else None,
            schedule_wins=any(r.wins and r.schedule for r in spec_results),
            baseline=baseline,
            speculative=spec_results,
            note="; ".join(notes),
        )

    def summary_lines(self, level_word: str = "batch") -> list[str]:
        """Plain lines for the export header and the report; ``level_word`` names a level (batch, concurrency)."""
        if not self.complete:
            done = len(self.engines)
            return [f"confirmation in fresh engines incomplete ({done} of {len(self.plan())} engines measured)"]
        if self.skipped:
            return [f"not confirmed in fresh engines, none needed: {self.skipped}"]
        d = self.decide()
        if list(self.weights) == [SLO_RATE_LEVEL]:
            ref = self.reference() or {}
            value = (
                "highest request rate keeping the SLO (requests/s: the baseline engines kept it at no rate tried)"
                if ref.get(SLO_RATE_LEVEL) == 0
                else "highest request rate keeping the SLO over the baseline engines'"
            )
        else:
            value = "weighted speedup over the baseline's confirmation engines"
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
            if len(r.per_level) > 1:
                levels = ", ".join(f"{level_word} {lv}: {x:.2f}x" for lv, x in sorted(r.per_level.items()))
                lines.append(f"  confirmed per level (median over its engines): {levels}")
        if d.note:
            lines.append(d.note)
        return lines


def _fewest_tokens_tied(winners: list[FinalistResult], best: FinalistResult, noise: float) -> FinalistResult:
    """Among the winners within ``noise`` of the best median, the one with the fewest speculative tokens
    (then the higher median): a gap inside the noise says nothing about which is faster."""
    tied = [r for r in winners if r.median >= best.median * (1.0 - noise) and r.num_speculative_tokens is not None]
    if best.num_speculative_tokens is None or len(tied) < 2:
        return best
    return min(tied, key=lambda r: (r.num_speculative_tokens or 0, -r.median))


def _span(r: FinalistResult) -> str:
    values = ", ".join(f"{v:.3f}" for v in r.values)
    return f"median {r.median:.3f}x (engines {values}; spread {r.spread:.1%})"


# -- the study's finalists ------------------------------------------------------------------------------
def load(study: optuna.Study) -> Confirmation | None:
    raw = study.user_attrs.get(CONFIRMATION)
    return Confirmation.model_validate(raw) if raw else None


def history(study: optuna.Study) -> list[Confirmation]:
    return [Confirmation.model_validate(raw) for raw in study.user_attrs.get(HISTORY) or []]


def speculative_finalists(
    study: optuna.Study, n: int, eligible: set[int] | None = None, tie_noise: float = 0.0
) -> list[FrozenTrial]:
    """The n best speculative trials by their score against the study's current reference (a baseline
    measured after a trial moves it), one per configuration; ``eligible``: only these trial numbers.
    Trials within ``tie_noise`` of the best score are a tie and come first by fewest speculative tokens: the
    confirmation serves the fewest tokens among tied winners, so those are the ones worth fresh engines."""
    ref = store.reference(study)
    scored = []
    for t in store.completed(study):
        spec, metrics = store.trial_spec(t), store.trial_metrics(t)
        if spec is None or spec.is_baseline or metrics is None or (eligible is not None and t.number not in eligible):
            continue
        scored.append((apply_reference(metrics, ref).score, t, spec))
    scored.sort(key=lambda row: (-row[0], row[1].number))
    if scored and tie_noise > 0:
        floor = scored[0][0] * (1.0 - tie_noise)
        tied = [row for row in scored if row[0] >= floor]
        tied.sort(key=lambda row: (row[2].num_speculative_tokens or 0, -row[0], row[1].number))
        scored = tied + [row for row in scored if row[0] < floor]
    seen: set[Any] = set()
    out = []
    for _, t, spec in scored:
        if spec.key() in seen:
            continue
        seen.add(spec.key())
        out.append(t)
    return out[:n]


def finalists(specs: list[FrozenTrial], base: FrozenTrial, schedule: tuple[int, str] | None) -> list[Finalist]:
    """The speculative finalists, the schedule (its drafter's trial and label) and the baseline, in that order."""
    out = []
    for t in specs:
        spec = store.trial_spec(t)
        assert spec is not None
        out.append(
            Finalist(
                trial=t.number,
                label=spec.label(),
                is_baseline=False,
                num_speculative_tokens=spec.num_speculative_tokens,
            )
        )
    if schedule is not None:
        out.append(
            Finalist(trial=schedule[0], label=f"{SCHEDULE_LABEL} {schedule[1]}", is_baseline=False, schedule=True)
        )
    spec = store.trial_spec(base)
    assert spec is not None
    out.append(Finalist(trial=base.number, label=spec.label(), is_baseline=True))
    return out


def judged_levels(config: StudyConfig) -> dict[int, float]:
    """What each confirmation engine is judged on: the weighted levels, or under the goodput objective
    the SLO rate alone (kept under ``SLO_RATE_LEVEL``)."""
    w = config.workload
    if w.mode == "serve" and w.serve.objective == "goodput":
        return {SLO_RATE_LEVEL: 1.0}
    return dict(zip(w.batch_sizes, w.weights(), strict=True))


def clearly_behind(study: optuna.Study, config: StudyConfig, best_spec: FrozenTrial) -> str:
    """Why fresh engines cannot matter, or "": the best speculative trial's weighted speedup (against the
    current reference) is more than the study's noise (the largest over the measured levels of the median
    within-trial CV there, at least 3%: tuner.results.noise) below 1. Under the goodput objective the SLO
    search decides: always confirmed."""
    if list(judged_levels(config)) == [SLO_RATE_LEVEL]:
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
