"""Optuna storage and the study's recorded trials: open, count, find baseline and best."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import UserError
from tuner.redaction import mask_url
from tuner.results import record as trial_records
from tuner.results.record import TrialRecord
from tuner.results.scoring import TrialMetrics, apply_reference, reference_levels
from tuner.study.spec import TrialSpec

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from tuner.study.config import StudyConfig

# Attribute names stored on Optuna studies, and the trial attributes of studies written before the
# trial record (tuner.results.record) held them all.
SPEC = "spec"
METRICS = "metrics"
FAILURE = "failure_class"
ERROR = "error"
MLFLOW_RUN = "mlflow_run_id"
RETRY_OF = "retry_of"
DUPLICATE_OF = "duplicate_of"
TOKENS = "token_ids"
ENGINE = "engine"
LLM_KWARGS = "llm_kwargs"
HARDWARE = "hardware"
ENGINE_WALL = "engine_wall_s"
HARDWARE_CLASS = "hardware_class"
PRUNED_REASON = "pruned_reason"
PARENT_RUN = "mlflow_parent_run_id"
PARENT_TAG_KEY = "mlflow.parentRunId"
FINGERPRINT = "fingerprint"
# Bumped when the value Optuna sees changes meaning (2: weighted per-level speedups, no longer tokens/s).
SCORE_VERSION = 2
STUDY_FILE = "study_file"
# A FAIL with one of these classes is a real result; other FAILs (interrupted, killed worker) are retried.
COUNTED_FAILURES = ("timeout", "oom", "killed", "engine_error", "invalid_config")

HEARTBEAT_S = 5
GRACE_S = 20


def check_url(url: str) -> None:
    """The refusals that need no database driver, so a bad URL is reported before pre-flight's minutes."""
    if "://" not in url:
        raise UserError(f"storage: '{url}' is not a database URL; fix: use e.g. sqlite:///optuna.db")
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").split("?", 1)[0]
        if path and path != ":memory:" and not Path(path).parent.is_dir():
            fix = "create the directory or point the URL at an existing one"
            if not path.startswith("/") and Path("/" + path).parent.is_dir():
                # sqlite:///tmp/x.db is the relative path tmp/x.db: an absolute one takes a fourth slash.
                fix = f"for the absolute path /{path} write four slashes: sqlite:////{path}"
            raise UserError(
                f"storage: cannot open '{mask_url(url)}' (directory {Path(path).parent} does not exist); fix: {fix}"
            )


def open_storage(url: str, heartbeat: bool = True) -> Any:
    import optuna

    check_url(url)
    kwargs: dict[str, Any] = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S}
    try:
        with _schema_lock(url):
            return optuna.storages.RDBStorage(url, **kwargs)
    except Exception as exc:  # any driver error means the URL is unusable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"storage: cannot open '{mask_url(url)}' ({mask_url(first[:200])}); "
            "fix: check the URL and that the database is reachable"
        ) from None


@contextlib.contextmanager
def _schema_lock(url: str) -> Iterator[None]:
    """Workers starting together on a fresh PostgreSQL database would race to create Optuna's tables."""
    if not url.startswith("postgresql"):
        yield
        return
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(712001)"))
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(712001)"))
                conn.commit()
    finally:
        engine.dispose()


def load_existing(url: str, name: str) -> optuna.Study:
    import optuna

    storage = open_storage(url, heartbeat=False)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise UserError(
            f"study '{name}' is not in storage {mask_url(url)}; fix: run `python -m tuner optimize` first or pass --storage"
        ) from None


def fingerprint(config_dump: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config_dump, sort_keys=True, default=str).encode()).hexdigest()[:16]


def trial_record(trial: FrozenTrial) -> TrialRecord:
    """Everything stored about a trial (the loose attributes of older studies too)."""
    return trial_records.read(trial)


def trial_spec(trial: FrozenTrial) -> TrialSpec | None:
    raw = record_value(trial, "spec")
    return TrialSpec.model_validate(raw) if raw else None


def trial_metrics(trial: FrozenTrial) -> TrialMetrics | None:
    raw = record_value(trial, "metrics")
    return TrialMetrics.model_validate(raw) if raw else None


def record_value(trial: FrozenTrial, field: str) -> Any:
    """One field of the trial record as stored (JSON), without validating the rest."""
    return trial_records.raw_record(trial).get(field)


def has_metrics(trial: FrozenTrial) -> bool:
    return bool(record_value(trial, "metrics"))


def failure_class(trial: FrozenTrial) -> str | None:
    return record_value(trial, "failure_class")


def is_counted(trial: FrozenTrial) -> bool:
    from optuna.trial import TrialState

    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and failure_class(trial) in COUNTED_FAILURES


def is_repeat(trial: FrozenTrial) -> bool:
    """The sampler proposed an already measured configuration: its result was reused, no engine ran."""
    return record_value(trial, "duplicate_of") is not None


def spends_budget(trial: FrozenTrial) -> bool:
    """``budget.trials`` counts measured configurations: a repeat costs no engine time and no budget."""
    return is_counted(trial) and not is_repeat(trial)


def budget_used(study: optuna.Study) -> int:
    return sum(1 for t in study.get_trials(deepcopy=False) if spends_budget(t))


def completed(study: optuna.Study) -> list[FrozenTrial]:
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if has_metrics(t)]


def baselines(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in completed(study) if (s := trial_spec(t)) is not None and s.is_baseline]


def reference(study: optuna.Study) -> dict[int, float]:
    """Per batch size, the fastest completed baseline's median tokens/s."""
    return reference_levels(m for t in baselines(study) if (m := trial_metrics(t)) is not None)


def scored_metrics(study: optuna.Study, trial: FrozenTrial) -> TrialMetrics | None:
    """A trial's metrics with score and speedups against the study's current reference.

    The score stored when a trial finished used the baselines known then; a baseline measured later
    (eager, then compiled) can move the reference, so every comparison rescores against the current one.
    """
    metrics = trial_metrics(trial)
    return apply_reference(metrics, reference(study)) if metrics is not None else None


def baseline_modes(study: optuna.Study) -> set[bool]:
    """The enforce_eager values that have a completed baseline: a speculative trial's speedup is stated only
    against a baseline of its own mode (a compiled draft against an eager baseline credits CUDA graphs to
    speculation)."""
    return {s.enforce_eager for t in baselines(study) if (s := trial_spec(t)) is not None}


def config_from_study(study: optuna.Study) -> StudyConfig | None:
    """The study file stored with the study (its prompts path may not resolve here: settings only)."""
    import yaml
    from pydantic import ValidationError

    from tuner.study.config import StudyConfig

    text = study.user_attrs.get(STUDY_FILE)
    if not text:
        return None
    try:
        return StudyConfig.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValidationError, TypeError):
        return None


def best_baseline(study: optuna.Study) -> FrozenTrial | None:
    return _best_of(study, baselines(study))


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    return _best_of(study, completed(study))


def _best_of(study: optuna.Study, trials: list[FrozenTrial]) -> FrozenTrial | None:
    ref = reference(study)

    def score(trial: FrozenTrial) -> float:
        metrics = trial_metrics(trial)
        return apply_reference(metrics, ref).score if metrics else float("-inf")

    return max(trials, key=score, default=None)


def baseline_tokens(trial: FrozenTrial | None) -> dict[int, list[list[int]]] | None:
    if trial is None:
        return None
    return trial_record(trial).token_ids
