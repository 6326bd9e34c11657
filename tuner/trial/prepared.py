"""A study ready to run trials: what ``StudyRunner.prepare`` opened, none of it optional any more."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from tuner.engine.hardware import Hardware
    from tuner.engine.preflight import Preflight
    from tuner.results.tracking import Tracker
    from tuner.study.config import StudyConfig
    from tuner.study.prompts import Prompt


class TrialFailed(Exception):
    """The engine failed; Optuna records the trial as FAIL and the study goes on."""


@dataclass
class PreparedStudy:
    config: StudyConfig
    study: optuna.Study
    tracker: Tracker
    preflight: Preflight
    parent_run: str
    hardware: Hardware
    prompts: list[Prompt]
    workdir: Path

    def hardware_tags(self) -> dict[str, str]:
        hw = self.hardware
        return {
            "host": hw.host,
            "worker": f"{hw.host}:{os.getpid()}",
            "accelerator": hw.accelerator,
            "gpu": hw.gpu_name,
            "driver": hw.driver,
        }
