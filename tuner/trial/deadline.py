"""``--timeout``: stop before an engine that would not finish in time, instead of being killed in it.

A command killed mid-engine (``timeout -s TERM``) wastes that engine's time; with ``--timeout`` the tuner
does not start a trial, confirmation engine or schedule-validation engine that it expects to overrun,
and the command ends resumable (exit 75): everything measured stays in storage.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig

# An engine's wall time varies (compile caches, model loading): leave room above the median.
MARGIN = 1.2
RESUME_HINT = "Run the same command again to resume."


@dataclass
class Deadline:
    """The command's time limit; ``started`` is the command's start (``time.monotonic``)."""

    timeout_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    clock: Callable[[], float] = time.monotonic
    stopped: bool = False  # it refused to start something: the study is unfinished

    def left(self) -> float:
        return (self.timeout_s or 0.0) - (self.clock() - self.started)

    def allows(self, trials: Iterable[FrozenTrial], what: str = "a trial") -> bool:
        """May an engine start now? ``trials`` are the study's, whose engine wall times give the estimate;
        without any, an engine starts while time is left (no estimate is possible)."""
        if self.timeout_s is None:
            return True
        left = self.left()
        expected = expected_engine_s(trials)
        if left > 0 and (expected is None or expected <= left):
            return True
        if expected is None:
            self.stop(f"the {self.timeout_s:g} s are spent")
        else:
            self.stop(f"{max(left, 0.0):.0f} s left, {what} takes about {expected:.0f} s here")
        return False

    def expired(self) -> bool:
        """Waiting (for other workers' trials) ends too once no time is left."""
        if self.timeout_s is None or self.left() > 0:
            return False
        self.stop(f"the {self.timeout_s:g} s are spent")
        return True

    def stop(self, reason: str) -> None:
        if not self.stopped:
            print(f"note: --timeout: {reason}; stopping. {RESUME_HINT}", file=sys.stderr, flush=True)
        self.stopped = True


def expected_engine_s(trials: Iterable[FrozenTrial]) -> float | None:
    """MARGIN x the median engine wall time of the study's completed trials so far (of all its trials while
    none completed; None before any engine ran). A pruned trial's engine stopped early: counting it would
    promise time that the next trial, which may well run to the end, does not have."""
    from optuna.trial import TrialState

    from tuner.results import store

    measured = [(t.state, float(w)) for t in trials if (w := store.record_value(t, "engine_wall_s")) is not None]
    complete = [w for state, w in measured if state == TrialState.COMPLETE]
    walls = complete or [w for _, w in measured]
    return MARGIN * statistics.median(walls) if walls else None


def confirmation_engines(config: StudyConfig) -> int:
    """The fresh engines the confirmation runs after the trials: each round, the speculative finalists, the best
    baseline and a derived schedule (at most: fewer when fewer trials qualify, none when confirm.skip_when_behind
    skips it)."""
    if not config.confirm.enabled:
        return 0
    return config.confirm.rounds * (config.confirm.speculative + 1 + int(config.schedule.enabled))


def confirmation_engine_s(trials: Iterable[FrozenTrial], config: StudyConfig) -> float | None:
    """One confirmation engine: a completed trial's engine start plus its measurement scaled from the trials'
    repeats to confirm.repeats (the median over completed trials; a trial's estimate before any completed)."""
    from optuna.trial import TrialState

    from tuner.results import store

    trials = list(trials)
    share = (config.confirm.repeats or config.workload.repeats) / config.workload.repeats
    estimates = []
    for t in trials:
        wall, metrics = store.record_value(t, "engine_wall_s"), store.trial_metrics(t)
        if t.state == TrialState.COMPLETE and wall is not None and metrics is not None:
            start = min(metrics.engine_start_s, float(wall))
            estimates.append(start + (float(wall) - start) * share)
    if estimates:
        return statistics.median(estimates)
    expected = expected_engine_s(trials)
    return None if expected is None else expected / MARGIN


def confirmation_s(trials: Iterable[FrozenTrial], config: StudyConfig) -> float | None:
    """The confirmation's expected seconds after the trials (0 without one; None before any engine ran)."""
    engines = confirmation_engines(config)
    if not engines:
        return 0.0
    each = confirmation_engine_s(trials, config)
    return None if each is None else engines * each
