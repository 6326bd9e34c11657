"""MLflow experiment set-up: several workers starting at the same moment, and the tags the UI reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tests.conftest import study_dict, write_study
from tuner.cli import main
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
    # A pruned or failed trial is a FINISHED/FAILED run with empty metrics: its state tag says which.
    assert "tags.`state`" in state["selectedColumns"]


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


QUERY = "workflowType=machine_learning&viewStateShareKey=specdec-trials"


def test_trials_url_on_a_server_is_without_credentials() -> None:
    assert mlflow_ui.trials_url("http://127.0.0.1:5000/", "3") == f"http://127.0.0.1:5000/#/experiments/3/runs?{QUERY}"
    assert (
        mlflow_ui.trials_url("https://me:secret@mlflow.example:8443/base", "3")
        == f"https://mlflow.example:8443/base/#/experiments/3/runs?{QUERY}"
    )
    assert mlflow_ui.ui_command("http://127.0.0.1:5000/") is None


def test_a_local_store_gets_the_link_of_mlflow_ui_and_the_command(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    local = f"http://127.0.0.1:5000/#/experiments/3/runs?{QUERY}"
    mlflow = Path(sys.executable).with_name("mlflow")
    for uri, served in [
        ("sqlite:///mlflow.db", f"sqlite:///{tmp_path}/mlflow.db"),  # relative to the folder it ran in
        ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),
        ("mlruns", str(tmp_path / "mlruns")),
        ("file:///tmp/mlruns", "file:///tmp/mlruns"),
        ("postgresql+psycopg2://me:secret@db/mlflow", "'postgresql+psycopg2://me:***@db/mlflow'"),
    ]:
        assert mlflow_ui.trials_url(uri, "3") == local, uri
        assert mlflow_ui.ui_command(uri) == f"{mlflow} ui --backend-store-uri {served}", uri
    for uri in ("databricks", "sqlite://", "sqlite:///:memory:", "mystery://x"):
        assert mlflow_ui.trials_url(uri, "3") is None and mlflow_ui.ui_command(uri) is None, uri


def test_optimize_prints_the_trials_link_and_every_trial_run_has_its_state(
    tmp_path: Path, fake_engine: str, capsys: Any
) -> None:
    data = study_dict(tmp_path, budget={"trials": 3, "trial_timeout_s": 60})
    data["target"]["engine_args"].update({"fake_crash_k": 1, "fake_repeat_s": 0.3})
    data["workload"]["repeats"] = 4
    data["pruning"] = {"enabled": True, "min_acceptance_rate": 0.05}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 1},
        {"candidate": "draft-4l", "num_speculative_tokens": 2},
    ]
    path = write_study(tmp_path, data)
    assert main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs")]) == 0
    client = MlflowClient(data["tracking"]["uri"])
    experiment = client.get_experiment_by_name(data["name"])
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`specdec.role` = 'trial'")
    assert sorted(r.data.tags.get("state", "") for r in runs) == ["COMPLETE", "FAIL", "PRUNED"]
    url = mlflow_ui.trials_url(data["tracking"]["uri"], experiment.experiment_id)
    command = f"ui --backend-store-uri {data['tracking']['uri']}"  # already absolute: as given
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trials in MLflow: ")]
    assert lines == [f"trials in MLflow: {url} (served by: {Path(sys.executable).with_name('mlflow')} {command})"]
