"""A study's fingerprint covers what its trials measured, not where its files lie on one host."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from tests.conftest import study_dict, write_study
from tuner.errors import UserError
from tuner.results import store
from tuner.study.loader import load_study
from tuner.trial.optimize import OptimizeOptions, StudyRunner


def _join(study_path: Path, storage: optuna.storages.BaseStorage) -> None:
    runner = StudyRunner(load_study(study_path), study_path.read_text(), OptimizeOptions())
    runner._create_study(storage)


def test_prompts_are_fingerprinted_by_content_not_path(tmp_path: Path) -> None:
    here, there = tmp_path / "checkout-a", tmp_path / "elsewhere" / "checkout-b"
    here.mkdir()
    data = study_dict(here)
    data["workload"]["prompts"] = "prompts.jsonl"  # relative to the study file, as in studies/
    study = write_study(here, data)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'shared.db'}")
    _join(study, storage)
    shutil.copytree(here, there)  # another host's checkout of the same study
    _join(there / study.name, storage)
    with (there / "prompts.jsonl").open("a") as fh:
        fh.write('{"id": "extra", "text": "One more prompt."}\n')
    with pytest.raises(UserError, match=r"already exists .* with other settings"):
        _join(there / study.name, storage)


def test_a_study_scored_by_an_older_tuner_is_refused(tmp_path: Path) -> None:
    """Its Optuna values are tokens/s; new trials' are speedups: one sampler must not see both."""
    study = write_study(tmp_path, study_dict(tmp_path))
    config = load_study(study)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'old.db'}")
    old = optuna.create_study(study_name=config.name, storage=storage, direction="maximize")
    settings = config.fingerprinted_settings()
    old.set_user_attr("fingerprint", store.fingerprint(settings))
    with pytest.raises(UserError, match=r"scored by an older tuner .* fix: give the study a new name"):
        _join(study, storage)
