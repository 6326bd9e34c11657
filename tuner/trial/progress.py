"""What the user sees while a study runs: a live rich display on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


class ProgressView:
    def __init__(self, study_name: str, budget: int, done: int, enabled: bool = True) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, log_path=False)
        self.live = enabled and self.console.is_terminal
        self.plain = enabled and not self.live
        self.budget = budget
        self.done = done
        self.started = time.monotonic()
        self.finished_here = 0
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
        if not self.finished_here:
            return "?"
        per_trial = (time.monotonic() - self.started) / self.finished_here
        seconds = max(0.0, per_trial * (self.budget - self.done))
        return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"

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
