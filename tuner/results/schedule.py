"""A ``num_speculative_tokens_per_batch_size`` schedule: one k per measured load, and whether it may be exported.

Pure logic on measured figures (no Optuna, no vLLM); ``tuner.trial.schedule_check`` feeds it a study.

Derivation (``derive``), per measured level (``workload.batch_sizes``; in serve mode concurrency levels):
  the options are the drafter's completed trials, one per k (same method, draft model, enforce_eager,
  lookup window and extra keys; the best-scoring trial where one k was measured twice), and k = 0: the
  best baseline without speculation of the same enforce_eager (else the best baseline). Each option's figure is its median output tokens/s at that level.
  The level takes the **smallest k whose median is within the study's noise of the fastest option's**
  (median >= fastest * (1 - noise)), noise being the pruner's (``tuner.results.noise.study_noise``: the
  median within-trial CV at that level over the completed trials, at least 3%). Two options closer than
  the noise cannot be told apart, and the smaller k drafts less (k = 0 not at all).

Boundaries (``ranges``): with the measured levels L1 < L2 < ... < Ln, level Li's k covers the batch sizes
  from L(i-1) + 1 up to Li; the first range starts at 1 (vLLM requires it), the last runs on to ``cap``
  (``max_num_seqs`` of the engine arguments when set, else ``DEFAULT_CAP``; vLLM carries the last k
  beyond it anyway). A level is measured at its size and below: an offline batch of Li requests runs Li
  at once only until the first one finishes, and Li requests in flight never batch more than Li, so the
  sizes under Li are what level Li's figure mostly holds. (The rule that gave Li's k to Li up to
  L(i+1) - 1 ran the H100 study's batch 64 at the k=0 of 16-63 for most of its steps: its schedule engine
  measured less than no speculation there, 2026-12-07, docs/measurement-log.md.) Neighbouring ranges of
  one k are merged. One range left: the schedule is constant, a static configuration is the answer, and
  there is no schedule.

Validation (``decide``): the schedule is a finalist of the confirmation (tuner.results.confirmation): fresh
  engines run it interleaved with the baseline's and every other finalist's. It is exported only if
  (1) it wins that comparison as a static winner must (its lowest engine above the baseline's highest) and
  leads every static speculative finalist that also won, (2) at every level its engines' median is within
  that level's noise of the best static configuration measured there (the fastest completed trial at that
  level, any candidate, baselines included), and (3) its weighted score (the study's score, against the
  same per-level reference) is above the best static configuration's score. Otherwise the static answer
  is exported, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

# Where the last range ends when the engine arguments do not set max_num_seqs.
DEFAULT_CAP = 1024
RULE = (
    "per level the smallest k within the study's noise of the fastest measured option (k=0: no speculation); "
    "a level's k holds from just above the measured level below it up to it"
)
VALIDATION_RULE = (
    "exported only if it wins the interleaved fresh-engine comparison against the baseline (as a static winner "
    "must), is within noise of the best static configuration at every level "
    "and above the best static configuration's weighted score"
)


class Option(BaseModel):
    """One static configuration a level can take: k (0: the baseline) and its measured per-level figures."""

    k: int
    trial: int
    tokens_per_s: dict[int, float]  # level -> median output tokens/s
    speedup: dict[int, float | None] = {}  # level -> median over the study's reference there


class LevelChoice(BaseModel):
    level: int
    k: int
    trial: int  # the trial whose measurement chose it (the baseline's for k = 0)
    tokens_per_s: float
    speedup: float | None = None
    fastest_k: int  # the fastest option's k at this level
    fastest_tokens_per_s: float
    noise: float
    # The drafter's fastest k > 0 at this level: what k=0 was measured against (why a static answer won).
    best_spec_k: int | None = None
    best_spec_tokens_per_s: float | None = None
    best_spec_speedup: float | None = None


class ScheduleRange(BaseModel):
    start: int
    end: int  # inclusive, as vLLM reads it
    k: int

    def text(self) -> str:
        sizes = str(self.start) if self.start == self.end else f"{self.start}-{self.end}"
        return f"{sizes}: k={self.k}"


class Schedule(BaseModel):
    drafter: str  # the drafter's label without k
    trial: int  # a trial of the drafter: the validation engine runs its settings with the schedule
    levels: list[LevelChoice]
    ranges: list[ScheduleRange]
    cap: int

    @property
    def max_k(self) -> int:
        """vLLM's ``num_speculative_tokens``: every k of the schedule is capped at it."""
        return max(r.k for r in self.ranges)

    def vllm_value(self) -> list[list[int]]:
        """``speculative_config.num_speculative_tokens_per_batch_size``."""
        return [[r.start, r.end, r.k] for r in self.ranges]

    def text(self) -> str:
        return "; ".join(r.text() for r in self.ranges)


class Derivation(BaseModel):
    drafter: str = ""  # the drafter's label without k (also when the answer is static)
    schedule: Schedule | None = None
    levels: list[LevelChoice] = []
    note: str = ""  # why there is no schedule


def choose_k(level: int, options: Sequence[Option], noise: float) -> LevelChoice | None:
    """The smallest k within ``noise`` (relative) of the fastest option at ``level``; None: none measured it."""
    measured = [o for o in options if level in o.tokens_per_s]
    if not measured:
        return None
    fastest = max(measured, key=lambda o: (o.tokens_per_s[level], -o.k))
    floor = fastest.tokens_per_s[level] * (1.0 - noise)
    chosen = min((o for o in measured if o.tokens_per_s[level] >= floor), key=lambda o: o.k)
    spec = max((o for o in measured if o.k > 0), key=lambda o: (o.tokens_per_s[level], -o.k), default=None)
    return LevelChoice(
        level=level,
        k=chosen.k,
        trial=chosen.trial,
        tokens_per_s=chosen.tokens_per_s[level],
        speedup=chosen.speedup.get(level),
        fastest_k=fastest.k,
        fastest_tokens_per_s=fastest.tokens_per_s[level],
        noise=noise,
        best_spec_k=spec.k if spec else None,
        best_spec_tokens_per_s=spec.tokens_per_s[level] if spec else None,
        best_spec_speedup=spec.speedup.get(level) if spec else None,
    )


def ranges(choices: Sequence[tuple[int, int]], cap: int) -> list[ScheduleRange]:
    """(level, k) pairs -> vLLM's inclusive ranges (the boundary rule of the module docstring)."""
    ordered = sorted(choices)
    out: list[ScheduleRange] = []
    for i, (level, k) in enumerate(ordered):
        start = 1 if i == 0 else ordered[i - 1][0] + 1
        end = level if i + 1 < len(ordered) else max(cap, level)
        if out and out[-1].k == k:
            out[-1] = out[-1].model_copy(update={"end": end})
        else:
            out.append(ScheduleRange(start=start, end=end, k=k))
    return out


def derive(
    drafter: str,
    drafter_trial: int,
    options: Sequence[Option],
    levels: Sequence[int],
    noise: Mapping[int, float],
    cap: int = DEFAULT_CAP,
) -> Derivation:
    """The schedule of one drafter (``options``: its k's and the baseline as k = 0), or why there is none."""
    if len(levels) < 2:
        return Derivation(note="one measured level: a schedule needs two or more")
    if not any(o.k > 0 for o in options):
        return Derivation(note=f"no completed trial of {drafter}")
    choices = []
    for level in levels:
        choice = choose_k(level, options, noise.get(level, 0.0))
        if choice is None:
            return Derivation(note=f"nothing measured at level {level}")
        choices.append(choice)
    parts = ranges([(c.level, c.k) for c in choices], cap)
    if len(parts) == 1:
        k = parts[0].k
        what = f"k={k}" if k else "no speculation (k=0)"
        note = f"constant: {what} at every level, within noise; a static configuration is the answer"
        return Derivation(drafter=drafter, levels=choices, note=note)
    schedule = Schedule(drafter=drafter, trial=drafter_trial, levels=choices, ranges=parts, cap=cap)
    return Derivation(drafter=drafter, schedule=schedule, levels=choices)


# -- validation ----------------------------------------------------------------------------------------
class StaticBest(BaseModel):
    """The best static configuration at one level: the fastest completed trial there."""

    trial: int
    label: str
    tokens_per_s: float


class LevelCheck(BaseModel):
    level: int
    tokens_per_s: float  # the validation engine's median
    speedup: float | None = None
    best_static: StaticBest
    noise: float

    @property
    def within(self) -> bool:
        return self.tokens_per_s >= self.best_static.tokens_per_s * (1.0 - self.noise)


class Verdict(BaseModel):
    exported: bool
    reason: str
    levels: list[LevelCheck]
    score: float  # the schedule's weighted score
    static_score: float
    static_trial: int
    static_label: str


def decide(
    measured: Mapping[int, float],
    speedups: Mapping[int, float | None],
    score: float,
    best_static: Mapping[int, StaticBest],
    noise: Mapping[int, float],
    static: tuple[int, str, float],
    confirmed: tuple[bool, str],
) -> Verdict:
    """The validation rule of the module docstring. ``static``: the best static trial's number, label, score;
    ``confirmed``: whether the schedule won the fresh-engine comparison (rule 1), and the sentence that says so."""
    trial, label, static_score = static
    wins, confirmation = confirmed
    checks = [
        LevelCheck(
            level=level,
            tokens_per_s=measured.get(level, 0.0),
            speedup=speedups.get(level),
            best_static=best,
            noise=noise.get(level, 0.0),
        )
        for level, best in sorted(best_static.items())
    ]
    missed = [c for c in checks if not c.within]
    if missed:
        first = missed[0]
        reason = (
            f"at level {first.level} the schedule ran {first.tokens_per_s:.1f} tok/s, more than the noise "
            f"({first.noise:.0%}) under the best static configuration there ({first.best_static.label}, "
            f"trial {first.best_static.trial}: {first.best_static.tokens_per_s:.1f} tok/s)"
        )
    elif not wins:
        reason = f"not confirmed in fresh engines: {confirmation}"
    elif score <= static_score:
        reason = (
            f"weighted score {score:.3f} is not above the best static configuration's "
            f"({label}, trial {trial}: {static_score:.3f})"
        )
    else:
        reason = (
            f"{confirmation}; within noise of the best static configuration at every level and a weighted score "
            f"of {score:.3f} over its {static_score:.3f} ({label}, trial {trial})"
        )
    exported = wins and not missed and score > static_score
    return Verdict(
        exported=exported,
        reason=reason,
        levels=checks,
        score=score,
        static_score=static_score,
        static_trial=trial,
        static_label=label,
    )
