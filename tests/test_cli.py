"""The command line: instant help, exit codes, one-line errors, nothing written on bad input."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, study_dict, write_study


def _one_line_error(stderr: str, field: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {field}"), lines[0]
    assert "fix:" in lines[0] and "Traceback" not in stderr


def test_help_is_instant_and_light() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, runpy; sys.argv=['tuner','--help']\n"
            "try:\n    runpy.run_module('tuner', run_name='__main__')\nexcept SystemExit: pass\n"
            "print(sorted(m for m in ('vllm','torch','mlflow','optuna','transformers') if m in sys.modules))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0
    assert "optimize" in proc.stdout and proc.stdout.strip().endswith("[]")
    assert time.monotonic() - started < 30  # generous: the point is no heavy import, checked above


def test_misspelt_key_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["budget"]["trails"] = 3
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, str(tmp_path))
    assert "budget.trails: unknown key" in res.stderr and "'trials'" in res.stderr
    assert not list(tmp_path.glob("*.db"))


def test_malformed_prompt_line(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    prompts = Path(data["workload"]["prompts"])
    prompts.write_text(prompts.read_text() + "{not json\n")
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "workload.prompts")
    assert "line 6" in res.stderr
    assert not list(tmp_path.glob("*.db"))


def test_empty_prompt_file(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    Path(data["workload"]["prompts"]).write_text("\n")
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "workload.prompts")


def test_storage_that_cannot_be_opened(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    path = write_study(tmp_path, data)
    res = run_cli(["optimize", "--study", str(path), "--storage", "sqlite:////nonexistent-dir/x/optuna.db"], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "storage")
    res = run_cli(["optimize", "--study", str(path), "--storage", "optuna.db"], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "storage")
    assert not (tmp_path / "mlflow.db").exists()


def test_an_absolute_sqlite_path_written_with_three_slashes_is_told_the_fourth(tmp_path: Path) -> None:
    from tuner.errors import UserError
    from tuner.results.store import check_url

    # sqlite:///tmp/... is the relative path tmp/... (no such folder under ROOT, where the tests run); /tmp/... is
    relative = str(tmp_path / "optuna.db").lstrip("/")
    with pytest.raises(UserError, match=f"fix: for the absolute path /{re.escape(relative)} write four slashes"):
        check_url(f"sqlite:///{relative}")
    with pytest.raises(UserError, match="fix: create the directory"):
        check_url("sqlite:///no-such-dir-here/optuna.db")


def test_bad_flag_values(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    path = write_study(tmp_path, data)
    res = run_cli(["optimize", "--study", str(path), "--n-trials", "0"], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "--n-trials")
    res = run_cli(["optimize", "--study", str(tmp_path / "missing.yaml")], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "--study")
    res = run_cli(["optimize"], tmp_path)
    assert res.returncode == 2 and "--study" in res.stderr


def test_export_of_unknown_study(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    res = run_cli(["export", "--study", str(write_study(tmp_path, data)), "--output", "x.yaml"], tmp_path)
    assert res.returncode == 2
    _one_line_error(res.stderr, "study 'test-study' is not in storage")
