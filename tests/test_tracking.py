"""MLflow experiment set-up: several workers starting at the same moment, and the tags the UI reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tuner.results import mlflow_ui
from tuner.results.tracking import Tracker


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


def test_new_experiment_is_tagged_model_training_with_the_trials_view(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    Tracker(uri, "fresh")
    tags = _tags(uri, "fresh")
    assert tags[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
    view = json.loads(tags["mlflow.sharedViewState.specdec-trials"])
    assert view["name"] == "specdec trials" and isinstance(view["createdAt"], int)
    state = json.loads(view["state"])
    assert state["searchFilter"] == "tags.`specdec.role` = 'trial'"
    assert state["orderByKey"] == "metrics.`score`" and state["orderByAsc"] is False
    assert {"metrics.`score`", "metrics.`speedup`", "metrics.`tokens_per_s`"} <= set(state["selectedColumns"])


def test_reopened_experiment_made_without_the_tags_gets_them(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old_id = MlflowClient(uri).create_experiment("older")  # as tuner versions before the tag made it
    assert mlflow_ui.EXPERIMENT_KIND_TAG not in _tags(uri, "older")
    assert Tracker(uri, "older").experiment_id == old_id
    tags = _tags(uri, "older")
    assert tags[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert json.loads(tags[mlflow_ui.TRIALS_VIEW_TAG])["name"] == "specdec trials"


def test_reopen_overwrites_another_kind_and_keeps_an_edited_view(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    edited = json.dumps({"name": "mine", "createdAt": 1, "state": "{}"})
    MlflowClient(uri).create_experiment(
        "genai", tags={mlflow_ui.EXPERIMENT_KIND_TAG: "genai_development", mlflow_ui.TRIALS_VIEW_TAG: edited}
    )
    Tracker(uri, "genai")
    tags = _tags(uri, "genai")
    assert tags[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert tags[mlflow_ui.TRIALS_VIEW_TAG] == edited


def test_trials_url_only_for_a_server_and_without_credentials() -> None:
    query = "workflowType=machine_learning&viewStateShareKey=specdec-trials"
    assert mlflow_ui.trials_url("http://127.0.0.1:5000/", "3") == f"http://127.0.0.1:5000/#/experiments/3/runs?{query}"
    assert (
        mlflow_ui.trials_url("https://me:secret@mlflow.example:8443/base", "3")
        == f"https://mlflow.example:8443/base/#/experiments/3/runs?{query}"
    )
    assert mlflow_ui.trials_url("sqlite:///mlflow.db", "3") is None
    assert mlflow_ui.trials_url("file:///tmp/mlruns", "3") is None
