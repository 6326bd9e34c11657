"""Isolation and pruning with the real CPU vLLM: killed, timed-out, rejected and hopeless engines."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import MULTIPROCESS_ENV, one_wave, run_cli, study_dict, write_study
from tuner.engine import process_guard
from tuner.engine.process import run_engine
from tuner.engine.request import ProgressEvent, TrialRequest
from tuner.results import store
from tuner.study.prompts import Prompt
from tuner.study.spec import baseline_spec, llm_kwargs, resolve_model

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("demo_models")]


def _request(tmp_path: Path) -> TrialRequest:
    from tuner.study.loader import load_study

    study = load_study(write_study(tmp_path, study_dict(tmp_path)))
    kwargs = llm_kwargs(study.target, resolve_model(study.target.model), baseline_spec(True))
    prompts = [Prompt(id="1", text="Once upon a time")] * 4
    return TrialRequest(
        llm_kwargs=kwargs,
        prompts=prompts,
        max_tokens=16,
        temperature=0.0,
        batch_sizes=[2],
        repeats=50,
        warmup_prompts=1,
    )


def _processes_with(marker: str) -> list[int]:
    """Processes started with ``marker`` in their environment (this process's own /proc environ is
    the one it started with, so it never matches), other than this process's guard, which lives as
    long as this process (tuner.engine.process_guard)."""
    pids = []
    guard = process_guard._guard.pid if process_guard._guard is not None else None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != guard:
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in environ:
                pids.append(int(entry.name))
    return pids


def test_timed_out_engine_is_killed_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"SPECDEC_TEST_MARK={tmp_path}"
    monkeypatch.setenv("SPECDEC_TEST_MARK", str(tmp_path))
    monkeypatch.setenv(MULTIPROCESS_ENV, "1")  # the engine-core process is one of the children
    outcome = run_engine(_request(tmp_path), tmp_path / "trial", timeout_s=15)
    assert outcome.failure == "timeout" and outcome.result is None
    assert outcome.wall_s < 60
    time.sleep(1)
    assert _processes_with(marker) == []


def test_killed_engine_ends_the_trial_not_the_tuner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL with no out-of-memory record (the kernel's counter did not move): classified as killed."""
    marker = f"SPECDEC_TEST_MARK={tmp_path}"
    monkeypatch.setenv("SPECDEC_TEST_MARK", str(tmp_path))
    monkeypatch.setenv(MULTIPROCESS_ENV, "1")  # the engine-core process is one of the children

    def kill_when_measuring(event: ProgressEvent) -> None:
        if event.event == "repeat":
            for pid in _processes_with(marker):
                if pid != os.getpid() and b"tuner.engine.measure" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    threading.Thread(target=os.kill, args=(pid, signal.SIGKILL)).start()
        return None

    outcome = run_engine(_request(tmp_path), tmp_path / "trial", timeout_s=600, on_progress=kill_when_measuring)
    assert outcome.failure == "killed", outcome.message
    assert outcome.returncode == -signal.SIGKILL
    time.sleep(1)
    assert _processes_with(marker) == []


def test_rejected_and_hopeless_trials_in_a_real_study(tmp_path: Path) -> None:
    data = one_wave(study_dict(tmp_path, name="edge", budget={"trials": 3, "trial_timeout_s": 600}))
    data["candidates"] = [
        {"name": "none", "method": "none"},
        {
            "name": "draft-4l",
            "method": "draft_model",
            "model": "demo:SmolLM2-135M-Instruct-4L",
            "num_speculative_tokens": 2,
        },
        # vLLM rejects unknown speculative_config keys; pre-flight cannot check draft models cheaply.
        {
            "name": "bogus",
            "method": "draft_model",
            "model": "demo:SmolLM2-135M-Instruct-8L",
            "num_speculative_tokens": 2,
            "extra": {"not_a_vllm_key": 1},
        },
    ]
    data["workload"]["repeats"] = 3
    data["pruning"] = {"enabled": True, "min_acceptance_rate": 0.2}
    data["search"]["first_trials"] = [{"candidate": "draft-4l"}, {"candidate": "bogus"}]
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data)), "--no-progress"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    trials = optuna.load_study(study_name="edge", storage=data["storage"]).get_trials()
    assert [t.state for t in trials] == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.FAIL,
    ]
    assert "acceptance" in store.trial_record(trials[1]).pruned_reason
    assert (store.trial_record(trials[1]).pruning_saved_s or 0) > 0
    assert store.trial_record(trials[2]).failure_class == "invalid_config", trials[2].user_attrs
    assert "not_a_vllm_key" in store.trial_record(trials[2]).error
    client = MlflowClient(data["tracking"]["uri"])
    failed = client.get_run(store.trial_record(trials[2]).mlflow_run_id)
    assert failed.info.status == "FAILED" and failed.data.tags["failure_class"] == "invalid_config"
    assert "engine_log_tail.txt" in [a.path for a in client.list_artifacts(failed.info.run_id)]
