"""A configuration the sampler proposes again: wait for or reuse its measured outcome."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.results import record, store
from tuner.results.record import TrialRecord
from tuner.trial.prepared import PreparedStudy, TrialFailed

if TYPE_CHECKING:
    from tuner.study.spec import TrialSpec
    from tuner.trial.progress import ProgressView

# What a repeat takes over from the trial it repeats.
REUSED = ("metrics", "failure_class", "error", "pruned_reason", "engine", "llm_kwargs", "resolved_args")


def find_duplicate(ps: PreparedStudy, view: ProgressView | None, spec: TrialSpec, number: int) -> FrozenTrial | None:
    """A finished trial of the same configuration; if another worker is measuring it right now,
    wait for that result rather than measure it twice.

    Only an earlier trial is waited for: two workers given the same configuration at once (seeded
    samplers propose alike) would otherwise each wait for the other until the deadline. A dead
    worker's trial is failed once its heartbeat is stale, so the wait for it ends then, not at the
    deadline (the other workers may all be waiting here, none in the loop that reconciles)."""
    deadline = time.monotonic() + ps.config.budget.trial_timeout_s + 60
    while True:
        running = False
        for t in ps.study.get_trials(deepcopy=False):
            other = store.trial_spec(t)
            if t.number == number or other is None or other.key() != spec.key():
                continue
            if spec.is_baseline and t.state in (TrialState.FAIL, TrialState.PRUNED):
                continue  # a failed baseline is measured again (StudyRunner._retry_baselines), never reused
            if store.is_counted(t) and (t.state != TrialState.COMPLETE or store.has_metrics(t)):
                return t
            running = running or (t.state == TrialState.RUNNING and t.number < number)
        if not running or time.monotonic() > deadline:
            return None
        if view is not None:
            view.note(f"trial {number}: same configuration is being measured by another worker; waiting")
        time.sleep(store.HEARTBEAT_S)
        optuna.storages.fail_stale_trials(ps.study)


def reuse(
    ps: PreparedStudy, view: ProgressView, trial: Trial, spec: TrialSpec, rec: TrialRecord, source: FrozenTrial
) -> float:
    """The sampler proposed a configuration already measured: reuse its outcome, spend no engine time."""
    measured = store.trial_record(source)
    rec.duplicate_of = source.number
    rec.hardware = ps.hardware.model_dump()
    for field in REUSED:
        setattr(rec, field, getattr(measured, field))
    record.write(trial, rec)
    run_id = ps.tracker.start_trial(
        ps.parent_run,
        ps.config.name,
        trial.number,
        spec.label() + f" (repeat of trial {source.number})",
        {
            "method": spec.method,
            "candidate": spec.candidate,
            "duplicate_of": str(source.number),
            **ps.hardware_tags(),
        },
    )
    rec.mlflow_run_id = run_id
    record.write(trial, rec)
    ps.tracker.log_params(run_id, spec.mlflow_params())
    ps.tracker.set_tags(run_id, {"state": "REPEAT"})  # no engine ran: its figures are on trial duplicate_of's run
    ps.tracker.end_trial(run_id, "FINISHED" if source.state == TrialState.COMPLETE else "FAILED")
    view.trial_finished(
        trial.number, f"same configuration as trial {source.number}; reused its result (no budget)", None, counted=False
    )
    if source.state == TrialState.PRUNED:
        raise optuna.TrialPruned(f"same configuration as trial {source.number}, which was pruned")
    if source.state == TrialState.FAIL:
        raise TrialFailed(f"same configuration as trial {source.number}, which failed")
    assert source.values is not None  # a COMPLETE trial has its values
    return float(source.values[0])
