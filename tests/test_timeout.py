"""``--timeout``: the study stops before a trial it expects to overrun the limit, exits 75, and resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState, create_trial

from tests.conftest import study_dict, write_study
from tuner.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_RESUMABLE, main
from tuner.engine import preflight, vllm_checks
from tuner.results import store
from tuner.study.loader import load_study
from tuner.trial.deadline import Deadline, expected_engine_s
from tuner.trial.optimize import OptimizeOptions, StudyRunner
from tuner.trial.workers import worker_command

REPEAT_S = 4.0  # each stand-in trial: 2 repeats of this, plus about 0.6 s of engine start
# Room for one trial (1.2 x ~8.6 s = ~10.3 s) while the command's start-up takes under ~7.7 s (a busy CI
# host), never for two (8.6 s + 10.3 s > 18 s whatever the start-up).
TIMEOUT_S = 18.0


def _trial(wall_s: float | None, pruned: bool = False) -> optuna.trial.FrozenTrial:
    record = {"engine_wall_s": wall_s} if wall_s is not None else {}
    if pruned:
        return create_trial(state=TrialState.PRUNED, user_attrs={"record": record})
    return create_trial(value=1.0, user_attrs={"record": record})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_deadline_estimates_from_the_median_engine_time(capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock()
    deadline = Deadline(100.0, started=0.0, clock=clock)
    assert deadline.allows([])  # nothing measured: no estimate, start while time is left
    trials = [_trial(10.0), _trial(30.0), _trial(20.0), _trial(None)]
    assert expected_engine_s(trials) == pytest.approx(24.0)  # 1.2 x median 20
    # Pruned trials stopped early: they do not shorten the estimate, unless nothing completed yet.
    assert expected_engine_s([*trials, _trial(2.0, pruned=True), _trial(3.0, pruned=True)]) == pytest.approx(24.0)
    assert expected_engine_s([_trial(2.0, pruned=True), _trial(4.0, pruned=True)]) == pytest.approx(3.6)
    clock.now = 76.0
    assert deadline.allows(trials)  # 76 + 24 = 100: fits exactly
    assert not deadline.stopped
    clock.now = 77.0
    assert not deadline.allows(trials, "a confirmation engine")
    assert deadline.stopped
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "note: --timeout: 23 s left, a confirmation engine takes about 24 s here; stopping. "
        "Run the same command again to resume."
    ]
    clock.now = 100.0
    fresh = Deadline(100.0, started=0.0, clock=clock)
    assert not fresh.allows([])  # never start anything once the time is spent
    assert fresh.expired() and fresh.stopped
    assert Deadline(None).allows(trials) and not Deadline(None).expired()


def test_workers_get_what_is_left_of_the_limit(tmp_path: Path) -> None:
    path = write_study(tmp_path, study_dict(tmp_path))
    runner = StudyRunner(load_study(path), path.read_text(), OptimizeOptions(timeout_s=500.0))
    cmd = worker_command(runner, path)
    assert "--timeout" in cmd and 0 < float(cmd[cmd.index("--timeout") + 1]) <= 500.0
    plain = StudyRunner(load_study(path), path.read_text(), OptimizeOptions())
    assert "--timeout" not in worker_command(plain, path)


def _valid(configs: list[dict[str, Any]], timeout_s: float = 0.0) -> list[str | None]:
    return [None] * len(configs)


def test_timeout_stops_between_trials_and_the_same_command_resumes(
    tmp_path: Path, fake_engine: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # vLLM's own check of the n-gram settings (a subprocess of ~15 s here) is not what this test is about.
    monkeypatch.setattr(vllm_checks, "validate_in_subprocess", _valid)
    monkeypatch.setattr(preflight, "_VERDICTS", {})
    data = study_dict(tmp_path, budget={"trials": 3, "trial_timeout_s": 60})
    data["target"]["engine_args"]["fake_repeat_s"] = REPEAT_S
    data["candidates"] = data["candidates"][:2]  # no draft model: a shorter pre-flight
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
        for k in (2, 3)
    ]
    path = write_study(tmp_path, data)
    export = tmp_path / "best.yaml"
    base = ["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs")]
    # The first run's pre-flight (seconds, uncached) would eat an unknown share of the limit: measure the
    # baseline without one, so the timed runs start at once and have an estimate from the first check.
    assert main([*base, "--n-trials", "1"]) == EXIT_OK
    capsys.readouterr()
    command = [*base, "--export", str(export), "--timeout", str(TIMEOUT_S)]

    assert main(command) == EXIT_RESUMABLE
    err = capsys.readouterr().err
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    assert store.budget_used(study) == 2  # one trial fitted; the next would not
    notes = [line for line in err.splitlines() if line.startswith("note: --timeout:")]
    assert len(notes) == 1 and "a trial takes about" in notes[0] and "Run the same command again" in notes[0]
    assert not export.exists()  # unfinished: no winner declared
    parent = MlflowClient(data["tracking"]["uri"]).get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["study.state"].startswith("unfinished: stopped by --timeout")

    assert main(command) == EXIT_OK
    assert "--timeout" not in capsys.readouterr().err
    assert store.budget_used(study) == 3
    assert "speculative-config" in export.read_text()
    parent = MlflowClient(data["tracking"]["uri"]).get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["study.state"] == "trials done"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_bad_timeout_is_one_line_naming_the_flag(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(tmp_path, study_dict(tmp_path))
    for command in ("optimize", "worker"):
        assert main([command, "--study", str(path), "--timeout", value]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --timeout:") and "fix:" in err[0]
