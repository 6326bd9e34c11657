"""One trial's record: everything the tuner stores about a trial, as one typed Optuna user attribute."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from tuner.results.scoring import TrialMetrics
from tuner.study.spec import TrialSpec

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial, Trial

RECORD = "record"
# Before the record, each field was a user attribute of its own, under these names (older studies).
RETRY_OF = "retry_of"  # still set on its own: Optuna's enqueue_trial writes it before the trial starts
LEGACY_KEYS = {
    "spec": "spec",
    "metrics": "metrics",
    "failure_class": "failure_class",
    "error": "error",
    "mlflow_run_id": "mlflow_run_id",
    "retry_of": RETRY_OF,
    "duplicate_of": "duplicate_of",
    "token_ids": "token_ids",
    "engine": "engine",
    "llm_kwargs": "llm_kwargs",
    "hardware": "hardware",
    "engine_wall_s": "engine_wall_s",
    "pruned_reason": "pruned_reason",
    "pruning_saved_s": "pruning_saved_s",
}
# Fields also written as loose attributes (none: every reader goes through tuner.results.store).
MIRRORED: tuple[str, ...] = ()


class TrialRecord(BaseModel):
    """Written when the trial starts (spec, MLflow run, retry and duplicate links: other workers and
    a resumed study need them while it runs) and rewritten, complete, when it ends."""

    spec: TrialSpec | None = None
    mlflow_run_id: str | None = None
    retry_of: int | None = None
    duplicate_of: int | None = None
    hardware: dict[str, Any] | None = None
    llm_kwargs: dict[str, Any] | None = None
    env: dict[str, str] | None = None  # target.env: the engine's environment variables, when the study set any
    metrics: TrialMetrics | None = None
    failure_class: str | None = None
    error: str | None = None
    pruned_reason: str | None = None
    pruning_saved_s: float | None = None
    engine: dict[str, str] | None = None
    engine_wall_s: float | None = None
    # What the measured engine resolved where the arguments left it to vLLM (max_num_seqs, ...): the export pins it.
    resolved_args: dict[str, int] | None = None
    token_ids: dict[int, list[list[int]]] | None = None  # the baseline's outputs, for the lossless check


def raw_record(trial: FrozenTrial | Trial) -> dict[str, Any]:
    """The stored fields as stored, from the record or, for older studies, the loose attributes."""
    attrs = trial.user_attrs
    raw = {field: attrs[key] for field, key in LEGACY_KEYS.items() if key in attrs}
    raw.update(attrs.get(RECORD) or {})
    return raw


def read(trial: FrozenTrial | Trial) -> TrialRecord:
    raw = raw_record(trial)
    if isinstance(raw.get("token_ids"), str):  # older studies stored them as a JSON string
        raw["token_ids"] = json.loads(raw["token_ids"])
    return TrialRecord.model_validate(raw)


def write(trial: Trial, record: TrialRecord) -> None:
    data = record.model_dump(mode="json", exclude_none=True)
    trial.set_user_attr(RECORD, data)
    for field in MIRRORED:
        if field in data:
            trial.set_user_attr(LEGACY_KEYS[field], data[field])
