"""A database password never reaches the output, the logs, MLflow, the stored study or a worker's argv."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FAKE_ENGINE, run_cli, study_dict, write_study
from tuner.redaction import mask_url, redact

SECRET = "S3CRET"
URL = f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db"  # nothing listens on port 1: the connection fails


def _files_without_secret(root: Path, allowed: set[Path]) -> None:
    for path in root.rglob("*"):
        if path.is_file() and path not in allowed:
            assert SECRET.encode() not in path.read_bytes(), path


def test_mask_url() -> None:
    assert mask_url(URL) == "postgresql+psycopg2://u:***@127.0.0.1:1/db"
    assert mask_url("postgresql://u:p@ss@db/x?password=q&sslmode=require") == (
        "postgresql://u:***@db/x?password=***&sslmode=require"
    )
    for plain in ("sqlite:///optuna.db", "http://mlflow:5000", "postgresql://u@db/x"):
        assert mask_url(plain) == plain
    assert redact(f"storage: {URL}  # shared\n") == "storage: postgresql+psycopg2://u:***@127.0.0.1:1/db  # shared\n"


def test_storage_password_on_the_command_line_is_never_printed(tmp_path: Path) -> None:
    path = write_study(tmp_path, study_dict(tmp_path))
    res = run_cli(
        ["optimize", "--study", str(path), "--storage", URL], tmp_path, env={"SPECDEC_TUNER_ENGINE_MODULE": FAKE_ENGINE}
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "storage: cannot open 'postgresql+psycopg2://u:***@127.0.0.1:1/db'" in res.stderr
    assert SECRET not in res.stdout + res.stderr
    _files_without_secret(tmp_path, set())


def test_storage_password_in_the_study_file_is_never_printed(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["storage"] = URL
    path = write_study(tmp_path, data)
    res = run_cli(["optimize", "--study", str(path)], tmp_path, env={"SPECDEC_TUNER_ENGINE_MODULE": FAKE_ENGINE})
    assert res.returncode == 2, res.stderr[-2000:]
    assert SECRET not in res.stdout + res.stderr
    _files_without_secret(tmp_path, {path})


def test_storage_password_in_the_study_file_is_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study file is stored in Optuna and MLflow (study.yaml): with its password masked."""
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["storage"] = URL  # the shared database; this run uses a local one instead
    path = write_study(tmp_path, data)
    local = f"sqlite:///{tmp_path / 'local.db'}"
    res = run_cli(
        ["optimize", "--study", str(path), "--storage", local, "--workdir", str(tmp_path / "runs")],
        tmp_path,
        env={"SPECDEC_TUNER_ENGINE_MODULE": FAKE_ENGINE},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert SECRET not in res.stdout + res.stderr
    assert list(tmp_path.rglob("study.yaml")), "the study file is an MLflow artifact"
    import optuna

    stored = optuna.load_study(study_name=data["name"], storage=local).user_attrs["study_file"]
    assert "storage: postgresql+psycopg2://u:***@127.0.0.1:1/db" in stored
    _files_without_secret(tmp_path, {path})  # local.db, mlflow.db, mlruns/, runs/ (engine and worker logs)
