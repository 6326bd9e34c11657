"""Ctrl-C, SIGTERM and kill -9 in the middle of a trial; the same command resumes the study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_cli, study_dict, write_study
from tuner import study_store as store


def _start(study_path: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), SPECDEC_TEST_TAG=str(cwd), **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "optimize", "--study", str(study_path), "--no-progress"],
        cwd=cwd,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.5)


def _engines_of(tag: Path, tuner: subprocess.Popen[str]) -> list[int]:
    """Processes other than the tuner started for this test: engine workers and their vLLM children."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"SPECDEC_TEST_TAG={tag}\0" in environ and int(entry.name) != tuner.pid:
            pids.append(int(entry.name))
    return pids


def _check_resumed(data: dict, interrupted_kind: str) -> None:
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1, states
    failed = next(t for t in trials if t.state == optuna.trial.TrialState.FAIL)
    retry = [t for t in trials if t.user_attrs.get(store.RETRY_OF) == failed.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.COMPLETE
    assert retry[0].params == failed.params
    baselines = [t for t in trials if (s := store.trial_spec(t)) and s.is_baseline]
    assert len(baselines) == 1 and baselines[0].state == optuna.trial.TrialState.COMPLETE
    assert store.budget_used(study) == data["budget"]["trials"]
    client = MlflowClient(data["tracking"]["uri"])
    run = client.get_run(failed.user_attrs[store.MLFLOW_RUN])
    assert run.info.status in ("KILLED", "FAILED"), run.info.status
    if interrupted_kind == "signal":
        assert failed.user_attrs[store.FAILURE] == "interrupted"
    exp = client.get_experiment_by_name(data["name"])
    assert not [r for r in client.search_runs([exp.experiment_id]) if r.info.status == "RUNNING"]


@pytest.mark.engine
def test_ctrl_c_during_a_real_trial_then_resume(tmp_path: Path, demo_models: None) -> None:
    data = study_dict(tmp_path, name="interrupt-real", budget={"trials": 2, "trial_timeout_s": 600})
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 2}]
    path = write_study(tmp_path, data)
    workdir = tmp_path / "tuner-runs" / data["name"]
    proc = _start(path, tmp_path)
    _wait_for(workdir / "trial-001" / "progress.jsonl", 600)  # the n-gram engine is up and measuring
    assert _engines_of(tmp_path, proc), "engine should be running"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "run the same command again to resume" in err
    time.sleep(1)
    assert _engines_of(tmp_path, proc) == []
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "signal")


FAKE = {"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"}


def _start_hanging_study(tmp_path: Path, name: str) -> tuple[dict, Path, Path, subprocess.Popen[str]]:
    """A fake-engine study whose first speculative trial hangs while ``hang`` exists; returns once it runs."""
    data = study_dict(tmp_path, name=name, budget={"trials": 3, "trial_timeout_s": 600})
    hang = tmp_path / "hang"
    hang.touch()
    data["target"]["engine_args"]["fake_hang_file"] = str(hang)
    path = write_study(tmp_path, data)
    proc = _start(path, tmp_path, FAKE)
    _wait_for(tmp_path / "tuner-runs" / name / "trial-001" / "request.json", 120)
    time.sleep(2)
    return data, path, hang, proc


def test_sigterm_kills_the_engine_and_resume_retries(tmp_path: Path) -> None:
    data, path, hang, proc = _start_hanging_study(tmp_path, "sigterm")
    assert _engines_of(tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    time.sleep(1)
    assert _engines_of(tmp_path, proc) == []
    hang.unlink()
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path, env=FAKE)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "signal")


def test_kill_9_leaves_a_stale_trial_that_is_retried(tmp_path: Path) -> None:
    data, path, hang, proc = _start_hanging_study(tmp_path, "kill9")
    proc.kill()
    proc.communicate(timeout=60)
    time.sleep(2)
    assert _engines_of(tmp_path, proc) == []  # the engine dies with its parent (PR_SET_PDEATHSIG)
    hang.unlink()
    time.sleep(store.GRACE_S + store.HEARTBEAT_S)  # let the dead trial's heartbeat go stale
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path, env=FAKE)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "kill")
