"""The progress lines' "left ~": the whole command's time, the confirmation's fresh engines included (no engine)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from tests.conftest import study_dict, write_study
from tuner.study.loader import load_study
from tuner.trial.deadline import confirmation_engine_s, confirmation_engines, confirmation_s
from tuner.trial.progress import ProgressView


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _trial(wall_s: float, start_s: float | None = None, pruned: bool = False) -> optuna.trial.FrozenTrial:
    record: dict[str, object] = {"engine_wall_s": wall_s}
    if start_s is not None:
        record["metrics"] = {"levels": [], "score": 1.0, "tokens_per_s": 50.0, "engine_start_s": start_s}
    if pruned:
        return create_trial(state=TrialState.PRUNED, user_attrs={"record": record})
    return create_trial(value=1.0, user_attrs={"record": record})


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_time_left_counts_the_confirmation_after_the_trials(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    view = ProgressView("demo", budget=4, done=0, after_trials=lambda: 300.0, clock=clock)
    assert view.plain  # captured stderr is no terminal: plain lines
    view.trial_started(0, "no speculation eager")
    clock.now = 100.0
    view.trial_finished(0, "50.0 tok/s", "no speculation eager (score 1.000)")
    # Three trials at 100 s each, then the confirmation's 300 s: 600 s, not the trials' 300 s.
    assert _lines(capsys)[-1].endswith("left ~10 min, confirmation included")
    for n in (1, 2, 3):
        clock.now = 100.0 * (n + 1)
        view.trial_finished(n, "50.0 tok/s", None)
    # The last trial is done; the confirmation is still to come.
    assert (
        _lines(capsys)[-1]
        == "[4/4] trial 3 50.0 tok/s; best: no speculation eager (score 1.000); left ~5 min, confirmation included"
    )


def test_time_left_without_confirmation_or_before_an_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    view = ProgressView("demo", budget=2, done=0, after_trials=lambda: 0.0, clock=clock)
    clock.now = 40.0
    view.trial_finished(0, "50.0 tok/s", None)
    assert _lines(capsys)[-1].endswith("left ~40 s")
    unknown = ProgressView("demo", budget=2, done=0, after_trials=lambda: None, clock=clock)
    unknown.trial_finished(0, "50.0 tok/s", None)
    assert _lines(capsys)[-1].endswith("left ~?")


def test_confirmation_estimate_scales_the_measurement_to_confirm_repeats(tmp_path: Path) -> None:
    data = study_dict(tmp_path, confirm={"enabled": True, "rounds": 2, "speculative": 2, "repeats": 1})
    data["workload"]["repeats"] = 3
    config = load_study(write_study(tmp_path, data))
    assert confirmation_engines(config) == 6  # 2 rounds x (2 speculative + the baseline)
    # Start 25 s, measurement 75 s for 3 repeats: a 1-repeat engine is 25 + 25 = 50 s (the median over trials);
    # a pruned trial stopped early and says nothing about a full measurement.
    trials = [_trial(100.0, 25.0), _trial(130.0, 31.0), _trial(70.0, 22.0), _trial(40.0, pruned=True)]
    assert confirmation_engine_s(trials, config) == pytest.approx(50.0)
    assert confirmation_s(trials, config) == pytest.approx(300.0)
    assert confirmation_s([], config) is None  # no engine ran yet: no estimate
    off = load_study(write_study(tmp_path, study_dict(tmp_path)))  # confirm.enabled false
    assert confirmation_s(trials, off) == 0.0
