"""How ``optimize --workers N`` divides a machine between its local workers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from tests.conftest import study_dict, write_study
from tuner.cli import STORAGE_ENV, TRACKING_ENV, _options, build_parser
from tuner.engine import hardware
from tuner.errors import UserError
from tuner.results import store
from tuner.study.loader import load_study
from tuner.trial.optimize import OptimizeOptions, StudyRunner
from tuner.trial.workers import cpu_slices, gpu_slices, worker_command, worker_env


def test_gpus_are_split_into_disjoint_groups_then_shared() -> None:
    assert gpu_slices(2, ["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert gpu_slices(3, ["0", "1"], 1) == ["0", "1", "0"]
    assert gpu_slices(2, ["0"], 1) == ["0", "0"]  # two workers share one GPU
    assert gpu_slices(2, [], 1) == [None, None]


def test_cpu_workers_get_their_own_cores() -> None:
    assert cpu_slices(2, [0, 1]) == ["0", "1"]
    assert cpu_slices(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]
    assert cpu_slices(1, [0, 1]) == [None]  # one worker: vLLM's own binding
    assert cpu_slices(3, [0, 1]) == [None, None, None]  # fewer cores than workers: leave vLLM to it


# -- the hardware class local slices and remote workers record (nvidia-smi mocked) -------------------
def _fake_gpus(monkeypatch: pytest.MonkeyPatch, names: list[str], visible: str | None) -> None:
    rows = "\n".join(f"{i}, {name}, 560.35" for i, name in enumerate(names))
    monkeypatch.setattr(hardware.shutil, "which", lambda cmd: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        hardware.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=rows + "\n", stderr="")
    )
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def _join(runner: StudyRunner) -> None:
    runner.hardware = hardware.describe()
    runner._check_hardware()


@pytest.fixture()
def runner(tmp_path: Path) -> StudyRunner:
    path = write_study(tmp_path, study_dict(tmp_path))
    runner = StudyRunner(load_study(path), path.read_text(), OptimizeOptions())
    runner.study = optuna.create_study()  # in memory: the hardware class is a study attribute
    return runner


def test_local_workers_on_their_gpu_slices_join_their_parents_study(
    runner: StudyRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    h200 = ["NVIDIA H200", "NVIDIA H200"]
    _fake_gpus(monkeypatch, h200, None)  # `optimize --workers 2` sees both GPUs
    _join(runner)
    assert runner.study is not None and runner.study.user_attrs[store.HARDWARE_CLASS] == "1x NVIDIA H200"
    for devices in gpu_slices(2, ["0", "1"], 1):  # each worker sees its own GPU
        _fake_gpus(monkeypatch, h200, devices)
        _join(runner)
    _fake_gpus(monkeypatch, ["NVIDIA H200"] * 8, None)  # a remote worker whose engines use one GPU of eight
    _join(runner)


def test_a_worker_with_another_gpu_model_is_refused(runner: StudyRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, ["NVIDIA H200", "NVIDIA H200"], None)
    _join(runner)
    _fake_gpus(monkeypatch, ["NVIDIA A100-SXM4-80GB"], None)
    with pytest.raises(UserError, match="measured on '1x NVIDIA H200' but this worker has '1x NVIDIA A100"):
        _join(runner)


def test_tensor_parallel_engines_need_as_many_gpus_of_the_same_model(
    runner: StudyRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner.config.target.engine_args["tensor_parallel_size"] = 2
    _fake_gpus(monkeypatch, ["NVIDIA H200"] * 4, None)
    _join(runner)
    assert runner.study is not None and runner.study.user_attrs[store.HARDWARE_CLASS] == "2x NVIDIA H200"
    runner.config.target.engine_args["tensor_parallel_size"] = 1  # another study's engines: one GPU each
    with pytest.raises(UserError, match="measured on '2x NVIDIA H200'"):
        _join(runner)


# -- what a local worker is started with ------------------------------------------------------------
def test_worker_urls_travel_in_the_environment_not_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_study(tmp_path, study_dict(tmp_path))
    storage = "postgresql+psycopg2://u:S3CRET@db:5432/optuna"
    tracking = "http://mlflow:S3CRET@mlflow:5000"
    runner = StudyRunner(load_study(path), path.read_text(), OptimizeOptions(storage=storage, tracking_uri=tracking))
    cmd = worker_command(runner, path)
    assert not [arg for arg in cmd if "S3CRET" in arg], cmd
    env = worker_env(runner, "1", None)
    assert env[STORAGE_ENV] == storage and env[TRACKING_ENV] == tracking and env["CUDA_VISIBLE_DEVICES"] == "1"
    args = build_parser().parse_args(cmd[3:])  # the worker reads them back
    monkeypatch.setenv(STORAGE_ENV, storage)
    monkeypatch.setenv(TRACKING_ENV, tracking)
    options = _options(args)
    assert options.storage == storage and options.tracking_uri == tracking
