"""MLflow logging: one parent run per study, one child run per trial.

Uses ``MlflowClient`` with explicit run ids (no global active run), so several workers, a resumed
study and the engine subprocesses never fight over "the current run".
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from tuner.redaction import redact
from tuner.results.mlflow_ui import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND, TRIALS_VIEW_TAG, trials_view_value

# MLflow configures its loggers at import (INFO); its table-creation chatter hides the progress display.
logging.getLogger("mlflow").setLevel(logging.WARNING)

PARENT_TAG = "mlflow.parentRunId"
STUDY_TAG = "specdec.study"
ROLE_TAG = "specdec.role"


def _ui_tags(created_ms: int) -> dict[str, str]:
    return {EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND, TRIALS_VIEW_TAG: trials_view_value(created_ms)}


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment_id = self._get_or_create_experiment(experiment)

    def _get_or_create_experiment(self, name: str) -> str:
        # Several workers start at once: the one that loses the creation race reads the winner's.
        for attempt in range(5):
            found = self.client.get_experiment_by_name(name)
            if found is not None:
                if found.lifecycle_stage == "deleted":
                    self.client.restore_experiment(found.experiment_id)
                self._tag_for_ui(str(found.experiment_id), found.tags, found.creation_time)
                return str(found.experiment_id)
            try:
                return str(self.client.create_experiment(name, tags=_ui_tags(int(time.time() * 1000))))
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def _tag_for_ui(self, experiment_id: str, tags: dict[str, str], created_ms: int | None) -> None:
        """For experiments made before the tuner set these tags, or by something else. The kind is
        overwritten (the experiment holds tuner runs); a trials view that exists is left as it is, in
        case someone edited it."""
        for key, value in _ui_tags(created_ms or 0).items():
            if key not in tags or (key == EXPERIMENT_KIND_TAG and tags[key] != value):
                self.client.set_experiment_tag(experiment_id, key, value)

    # -- parent run --------------------------------------------------------------------------
    def open_parent(self, run_id: str | None, study_name: str, tags: dict[str, str]) -> str:
        if run_id:
            try:
                run = self.client.get_run(run_id)
                if run.info.experiment_id == self.experiment_id:
                    self.client.update_run(run_id, status="RUNNING")
                    return run_id
            except Exception:
                pass
        run = self.client.create_run(
            self.experiment_id,
            run_name=study_name,
            tags={STUDY_TAG: study_name, ROLE_TAG: "study", **tags},
        )
        return str(run.info.run_id)

    def close_parent(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    # -- child runs --------------------------------------------------------------------------
    def start_trial(self, parent_id: str, study_name: str, number: int, label: str, tags: dict[str, str]) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial-{number:03d} {label}",
            tags={
                PARENT_TAG: parent_id,
                STUDY_TAG: study_name,
                ROLE_TAG: "trial",
                "optuna.trial_number": str(number),
                **tags,
            },
        )
        return str(run.info.run_id)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        items = [Param(k, str(redact(v))[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_stepped(self, run_id: str, key: str, values: list[float]) -> None:
        ts = int(time.time() * 1000)
        items = [Metric(key, float(v), ts, step) for step, v in enumerate(values)]
        if items:
            self.client.log_batch(run_id, metrics=items)

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        items = [RunTag(k, str(redact(v))[:5000]) for k, v in tags.items()]
        if items:
            self.client.log_batch(run_id, tags=items)

    def log_dict(self, run_id: str, data: dict[str, Any], name: str) -> None:
        self.client.log_text(run_id, json.dumps(redact(data), indent=2, default=str), name)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, redact(text), name)

    def log_file(self, run_id: str, path: Path, artifact_dir: str | None = None) -> None:
        if path.exists():
            self.client.log_artifact(run_id, str(path), artifact_dir)

    def end_trial(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

    def status(self, run_id: str) -> str | None:
        try:
            return str(self.client.get_run(run_id).info.status)
        except Exception:
            return None
