"""What the user sees while a study runs: a live rich display on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


def format_left(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(seconds, 0.0):.0f} s"


class ProgressView:
    """``after_trials``: the expected seconds of what the command runs after the last trial (the confirmation's
    fresh engines; None while unknown), asked again after each trial: "left" is the whole command's."""

    def __init__(
        self,
        study_name: str,
        budget: int,
        done: int,
        enabled: bool = True,
        after_trials: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, log_path=False)
        self.live = enabled and self.console.is_terminal
        self.plain = enabled and not self.live
        self.budget = budget
        self.done = done
        self.clock = clock
        self.started = clock()
        self.finished_here = 0
        self.after_trials = after_trials
        self.after_s: float | None = 0.0
        self.best: str = "-"
        self.current: str = ""
        self._progress: Any = None
        self._task: Any = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[bold]{task.fields[study]}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("left ~{task.fields[left]}"),
                TextColumn("best: {task.fields[best]}"),
                TextColumn("{task.fields[current]}"),
                console=self.console,
            )
            self._task = self._progress.add_task(
                "study", total=budget, completed=done, study=study_name, left="?", best="-", current=""
            )
            self._progress.start()

    def _time_left(self) -> str:
        if not self.finished_here or self.after_s is None:
            return "?"
        per_trial = (self.clock() - self.started) / self.finished_here
        seconds = max(0.0, per_trial * (self.budget - self.done)) + self.after_s
        after = ", confirmation included" if self.after_s else ""
        return format_left(seconds) + after

    def _refresh(self) -> None:
        if self._progress is not None:
            self._progress.update(
                self._task, completed=self.done, left=self._time_left(), best=self.best, current=self.current
            )

    def trial_started(self, number: int, label: str) -> None:
        self.current = f"trial {number}: {label}"
        if self.plain:
            print(f"[{self.done}/{self.budget}] trial {number} started: {label}", file=sys.stderr, flush=True)
        self._refresh()

    def note(self, text: str) -> None:
        self.current = text
        if self.plain:
            print(f"  {text}", file=sys.stderr, flush=True)
        self._refresh()

    def trial_finished(self, number: int, outcome: str, best: str | None, counted: bool = True) -> None:
        if counted:
            self.done += 1
            self.finished_here += 1
        if self.after_trials is not None:
            self.after_s = self.after_trials()
        if best:
            self.best = best
        self.current = ""
        if self.plain:
            print(
                f"[{self.done}/{self.budget}] trial {number} {outcome}; best: {self.best}; left ~{self._time_left()}",
                file=sys.stderr,
                flush=True,
            )
        elif self.live:
            self.console.log(f"trial {number} {outcome}")
        self._refresh()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
