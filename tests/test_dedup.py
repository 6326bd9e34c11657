"""tuner/trial/dedup.py: a configuration proposed twice is measured once, and no two workers wait for
each other."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tuner.results import record, store
from tuner.results.record import TrialRecord
from tuner.study.spec import TrialSpec
from tuner.trial import dedup

SPEC = TrialSpec(candidate="ngram", method="ngram", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1)


def _running(study: optuna.Study) -> optuna.Trial:
    trial = study.ask()
    record.write(trial, TrialRecord(spec=SPEC))
    return trial


def _prepared(study: optuna.Study, timeout_s: int = 600) -> Any:
    return SimpleNamespace(study=study, config=SimpleNamespace(budget=SimpleNamespace(trial_timeout_s=timeout_s)))


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "HEARTBEAT_S", 0.2)


def test_the_earlier_of_two_running_trials_does_not_wait(fast_heartbeat: None) -> None:
    study = optuna.create_study()
    first, second = _running(study), _running(study)
    started = time.monotonic()
    assert dedup.find_duplicate(_prepared(study, timeout_s=0), None, SPEC, first.number) is None
    assert time.monotonic() - started < 5  # at once: the later trial waits for it, not both for each other

    found: list[Any] = []
    waiter = threading.Thread(
        target=lambda: found.append(dedup.find_duplicate(_prepared(study), None, SPEC, second.number))
    )
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive()  # the later one waits for the earlier one's outcome
    study.tell(first, state=TrialState.PRUNED)
    waiter.join(timeout=10)
    assert [t.number for t in found] == [first.number]


def test_a_dead_workers_trial_is_waited_for_only_until_its_heartbeat_is_stale(
    tmp_path: Any, fast_heartbeat: None
) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage)
    dead = _running(study)
    storage.record_heartbeat(dead._trial_id)  # then nothing more: its worker was killed
    waiting = _running(study)
    started = time.monotonic()
    assert dedup.find_duplicate(_prepared(study), None, SPEC, waiting.number) is None
    assert time.monotonic() - started < 60  # not the 660 s deadline
    assert study.get_trials()[dead.number].state == TrialState.FAIL
