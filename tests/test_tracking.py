"""MLflow experiment set-up when several workers start at the same moment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

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
