"""The report's "Batch-size schedule" section: the study outcome's ScheduleRun (tuner.results.schedule_run) as
the export's header states it. Every figure and sentence comes from the run and the export's own helpers
(tuner.outputs.export_schedule), so the report and best.yaml cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.results.outcome import StudyOutcome
    from tuner.results.schedule_run import ScheduleRun
    from tuner.study.config import StudyConfig


@dataclass
class ScheduleSection:
    outcome: str  # the export's outcome line: the schedule, exported or not, and why
    run: ScheduleRun | None = None  # None: the stored run is stale (the section is the outcome line alone)
    ranges: list[str] = field(default_factory=list)  # "1-3: k=3"
    rules: str = ""
    caveats: list[str] = field(default_factory=list)
    static_answer: list[str] = field(default_factory=list)  # no schedule: per level, k=0 against the drafter's best

    @property
    def exported(self) -> bool:
        return self.run is not None and self.run.exported


def schedule_section(out: StudyOutcome, config: StudyConfig | None) -> ScheduleSection | None:
    """None when the study asks for no schedule or none was derived yet; else what became of it."""
    from tuner.outputs import export_schedule
    from tuner.results.schedule import RULE, VALIDATION_RULE

    if config is not None and not config.schedule.enabled:
        return None
    run = out.schedule
    if run is None:
        return None
    section = ScheduleSection(outcome=run.outcome(), run=run)
    schedule = run.schedule
    if schedule is not None:
        section.ranges = [r.text() for r in schedule.ranges]
        section.rules = f"{RULE}; the last range runs to {schedule.cap}; {VALIDATION_RULE}"
        section.caveats = [line.removeprefix("# note: ") for line in export_schedule.caveat_lines(run)]
    section.static_answer = [line.strip() for line in export_schedule.static_answer_lines(run, out.mode)]
    return section


def schedule_table(section: ScheduleSection, noun: str) -> tuple[list[str], list[list[str]]]:
    """Per level: the chosen k (and the trial measurement that chose it), the best static configuration
    there, the validation engine's figure and whether it kept within noise; the export's wording."""
    from tuner.outputs.export_schedule import choice_source, k_text, static_text, validation_text, within_text

    header = [noun, "k", "chosen from (trial: tok/s, speedup)", "best static (tok/s)", "validation engine", "verdict"]
    run = section.run
    if run is None or run.schedule is None:
        return header, []
    checks = {c.level: c for c in run.verdict.levels} if run.verdict is not None else {}
    body = []
    for choice in run.schedule.levels:
        check = checks.get(choice.level)
        body.append(
            [
                str(choice.level),
                k_text(choice.k),
                choice_source(choice),
                static_text(check.best_static) if check else "–",
                validation_text(check) if check else ("failed" if run.failure else "–"),
                within_text(check) if check else "–",
            ]
        )
    return header, body
