"""MLflow experiment set-up: several workers starting at the same moment, and the tags the UI reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tuner.outputs import mlflow_ui
from tuner.outputs.tracking import Tracker


def test_worker_that_loses_the_experiment_creation_race_uses_the_winners(tmp_path: Path, monkeypatch: Any) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    winner = Tracker(uri, "raced")
    real_get = MlflowClient.get_experiment_by_name
    calls = {"n": 0}

    def stale_first_lookup(self: MlflowClient, name: str) -> Any:
        # The loser looked before the winner committed: its first lookup sees nothing.
        calls["n"] += 1
        return None if calls["n"] == 1 else real_get(self, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", stale_first_lookup)
    loser = Tracker(uri, "raced")
    assert loser.experiment_id == winner.experiment_id
    assert calls["n"] == 2


def _tags(uri: str, name: str) -> dict[str, str]:
    experiment = MlflowClient(uri).get_experiment_by_name(name)
    assert experiment is not None
    return dict(experiment.tags)


def test_new_experiment_is_tagged_model_training(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    Tracker(uri, "fresh")
    assert _tags(uri, "fresh")[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_reopened_experiment_made_without_the_tag_gets_it(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old_id = MlflowClient(uri).create_experiment("older")  # as tuner versions before the tag made it
    assert mlflow_ui.EXPERIMENT_KIND_TAG not in _tags(uri, "older")
    assert Tracker(uri, "older").experiment_id == old_id
    assert _tags(uri, "older")[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_reopen_overwrites_another_kind(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("genai", tags={mlflow_ui.EXPERIMENT_KIND_TAG: "genai_development"})
    Tracker(uri, "genai")
    assert _tags(uri, "genai")[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
