"""Many workers, one study: PostgreSQL storage, an MLflow server, worker processes on this machine."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, one_wave, run_cli, study_dict, write_study
from tests.services import mlflow_server, postgres_server
from tuner.results import store

pytestmark = pytest.mark.services
FAKE = {"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"}


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def tracking(postgres: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    artifacts = tmp_path_factory.mktemp("mlflow") / "artifacts"
    artifacts.mkdir()
    with mlflow_server(postgres.rsplit("/", 1)[0] + "/mlflow", artifacts) as url:
        yield url


def _worker(study: Path, cwd: Path, storage: str, tracking_uri: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **FAKE)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuner",
            "worker",
            "--study",
            str(study),
            "--storage",
            storage,
            "--tracking-uri",
            tracking_uri,
            "--no-progress",
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _study(tmp_path: Path, name: str, storage: str, tracking_uri: str, trials: int) -> tuple[dict, Path]:
    data = study_dict(tmp_path, name=name, budget={"trials": trials, "trial_timeout_s": 120})
    data["storage"] = storage
    data["tracking"] = {"uri": tracking_uri, "experiment": name}
    data["target"]["engine_args"]["fake_repeat_s"] = 0.4
    return data, write_study(tmp_path, data)


def _children(tracking_uri: str, name: str) -> tuple[list, list]:
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if store.PARENT_TAG_KEY not in r.data.tags]
    return parents, [r for r in runs if store.PARENT_TAG_KEY in r.data.tags]


def test_three_workers_share_one_study(tmp_path: Path, postgres: str, tracking: str) -> None:
    data, path = _study(tmp_path, "three-workers", postgres, tracking, trials=9)
    workers = [_worker(path, tmp_path, postgres, tracking) for _ in range(3)]
    errors = [w.communicate(timeout=600)[1].decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], errors
    study = optuna.load_study(study_name=data["name"], storage=postgres)
    trials = study.get_trials()
    assert store.budget_used(study) == 9, [t.state for t in trials]  # the sampler's repeats spend no budget
    measured_baselines = [
        t for t in trials if (s := store.trial_spec(t)) and s.is_baseline and store.trial_record(t).duplicate_of is None
    ]
    assert len(measured_baselines) == 1
    measured = [store.trial_spec(t).key() for t in trials if store.trial_record(t).duplicate_of is None]  # type: ignore[union-attr]
    assert len(measured) == len(set(measured)), "a configuration was measured twice"
    parents, children = _children(tracking, data["name"])
    assert len(parents) == 1 and len(children) == len(trials)
    assert {r.data.tags[store.PARENT_TAG_KEY] for r in children} == {parents[0].info.run_id}
    assert all(r.data.tags.get("host") and r.data.tags.get("accelerator") for r in children)
    hosts = collections.Counter(store.trial_record(t).hardware["host"] for t in trials)
    assert sum(hosts.values()) == len(trials)


def test_a_killed_worker_has_its_trial_retried(tmp_path: Path, postgres: str, tracking: str) -> None:
    data, path = _study(tmp_path, "killed-worker", postgres, tracking, trials=4)
    data["target"]["engine_args"]["fake_repeat_s"] = 3.0
    path = write_study(tmp_path, data)
    first = _worker(path, tmp_path, postgres, tracking)
    trial_dir = tmp_path / "tuner-runs" / data["name"] / "trial-001"
    deadline = time.monotonic() + 300
    while not (trial_dir / "progress.jsonl").exists():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.5)
    first.send_signal(signal.SIGKILL)  # a lost host: no chance to clean up
    first.wait()
    others = [_worker(path, tmp_path, postgres, tracking) for _ in range(2)]
    errors = [w.communicate(timeout=600)[1].decode() for w in others]
    assert [w.returncode for w in others] == [0, 0], errors
    study = optuna.load_study(study_name=data["name"], storage=postgres)
    trials = study.get_trials()
    stale = next(t for t in trials if t.number == 1)
    assert stale.state == optuna.trial.TrialState.FAIL
    retry = [t for t in trials if store.trial_record(t).retry_of == 1]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.COMPLETE
    assert store.budget_used(study) == 4
    parents, children = _children(tracking, data["name"])
    assert len(parents) == 1
    assert not [r for r in children if r.info.status == "RUNNING"]


def test_mixed_hardware_is_refused(tmp_path: Path, postgres: str, tracking: str) -> None:
    data, path = _study(tmp_path, "mixed-hw", postgres, tracking, trials=1)
    assert run_cli(["worker", "--study", str(path), "--no-progress"], tmp_path, env=FAKE).returncode == 0
    study = optuna.load_study(study_name=data["name"], storage=postgres)
    study.set_user_attr(store.HARDWARE_CLASS, "8x NVIDIA H200")
    res = run_cli(["worker", "--study", str(path), "--n-trials", "2", "--no-progress"], tmp_path, env=FAKE)
    assert res.returncode == 2
    assert "measured on '8x NVIDIA H200'" in res.stderr and "fix:" in res.stderr


@pytest.mark.engine
def test_workers_shortcut_with_real_engines(tmp_path: Path, postgres: str, tracking: str, demo_models: None) -> None:
    data = one_wave(study_dict(tmp_path, name="real-workers", budget={"trials": 2, "trial_timeout_s": 900}))
    data["storage"] = postgres
    data["tracking"] = {"uri": tracking, "experiment": "real-workers"}
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 2}]
    path = write_study(tmp_path, data)
    res = run_cli(
        ["optimize", "--study", str(path), "--workers", "2", "--no-progress", "--export", str(tmp_path / "best.yaml")],
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    study = optuna.load_study(study_name="real-workers", storage=postgres)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE] * 2
    engines = {store.trial_record(t).engine["vllm"] for t in study.get_trials()}
    assert engines and "fake" not in engines
    parents, children = _children(tracking, "real-workers")
    assert len(parents) == 1 and len(children) == 2
    assert (tmp_path / "best.yaml").exists()
