"""The schedule step of ``optimize`` end to end with a stand-in engine (tests.fake_schedule): derive, confirm in
fresh engines interleaved with the baseline's and the best static finalist's, store, export, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, study_dict, write_study
from tests.test_schedule import parse_with_vllm
from tuner.cli import main
from tuner.results import confirmation, outcome, schedule_run

# Baseline 1.0 everywhere; n-gram k=3 pays at batch 1 and loses at batch 4, k=1 in between.
GAINS = {"3@1": 1.4, "1@1": 1.2, "3@4": 0.85, "1@4": 0.95, "0@4": 1.0}


@pytest.fixture()
def fake_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEC_TUNER_ENGINE_MODULE", "tests.fake_schedule")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))


def _study(tmp_path: Path, gains: dict[str, float]) -> dict[str, Any]:
    data = study_dict(tmp_path, name="sched", budget={"trials": 3, "trial_timeout_s": 60})
    data["workload"]["batch_sizes"] = [1, 4]
    data["pruning"] = {"enabled": False}
    data["schedule"] = {"enabled": True}
    data["confirm"] = {"enabled": True, "rounds": 2, "repeats": 1}
    lookup = {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 3, **lookup},
        {"candidate": "ngram", "num_speculative_tokens": 1, **lookup},
    ]
    data["target"]["engine_args"].update(
        {"fake_gain": gains, "fake_launch_file": str(tmp_path / "launches"), "fake_engine_factors": [1.0]}
    )
    return data


def _run(tmp_path: Path, data: dict[str, Any]) -> int:
    path = write_study(tmp_path, data)
    args = ["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs")]
    return main([*args, "--export", str(tmp_path / "best.yaml")])


def _load(data: dict[str, Any]) -> optuna.Study:
    return optuna.load_study(study_name=data["name"], storage=data["storage"])


def _stored(data: dict[str, Any]) -> schedule_run.ScheduleRun:
    run = outcome.read(_load(data)).schedule
    assert run is not None
    return run


def test_a_validated_schedule_is_exported_and_read_back_by_vllm(tmp_path: Path, fake_schedule: None) -> None:
    data = _study(tmp_path, GAINS)
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "9"  # three trials; k=3, the schedule, the baseline twice each
    run = _stored(data)
    assert run.schedule is not None and run.schedule.vllm_value() == [[1, 1, 3], [2, 1024, 0]]
    assert run.exported and run.verdict is not None and all(c.within for c in run.verdict.levels)
    assert outcome.read(_load(data)).verdict == "schedule"
    request = json.loads((tmp_path / "runs" / "sched" / "confirm-r2-schedule" / "request.json").read_text())
    spec = request["llm_kwargs"]["speculative_config"]
    assert spec["num_speculative_tokens"] == 3 and spec["num_speculative_tokens_per_batch_size"] == [
        [1, 1, 3],
        [2, 1024, 0],
    ]
    text = (tmp_path / "best.yaml").read_text()
    assert "a batch-size schedule of k" in text and "  - [1, 1, 3]\n  - [2, 1024, 0]\n" in text
    assert "#   batch 1: k=3 (trial 1: " in text and "#   batch 4: k=0 (no speculation) (trial 0: " in text
    assert "the schedule is exported" in text
    # The file as vLLM reads it (the stand-in engine's fake-* keys are not vLLM's: left out).
    served = {k: v for k, v in yaml.safe_load(text).items() if not k.startswith("fake-")}
    clean = tmp_path / "clean.yaml"
    clean.write_text(yaml.safe_dump(served))
    assert [list(r) for r in parse_with_vllm(clean).num_speculative_tokens_per_batch_size] == [[1, 1, 3], [2, 1024, 0]]

    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`specdec.role` = 'schedule_validation'")
    assert len(runs) == 2 and run.mlflow_run_id in {r.info.run_id for r in runs}
    assert all("tokens_per_s_bs4" in r.data.metrics for r in runs)
    served = [r for r in client.search_runs([exp.experiment_id], filter_string="tags.best = 'true'")]
    assert [r.info.run_id for r in served] == [run.mlflow_run_id]  # the schedule's engine, not a static trial
    parent = client.get_run(_load(data).user_attrs["mlflow_parent_run_id"])
    assert parent.data.tags["schedule.verdict"] == "exported" and parent.data.tags["confirm.winner"] == "schedule"
    assert parent.data.tags["best_config"].startswith("ngram lookup 1-3 eager, num_speculative_tokens by level")

    # Resumed: the stored engines are reused, not measured again.
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "9"
    assert _stored(data).mlflow_run_id == run.mlflow_run_id

    # Switched off: the static choice is confirmed and served; the schedule's engines stay on record, and the
    # k=3 and baseline engines, measured interleaved with each other, answer the smaller confirmation.
    data["schedule"] = {"enabled": False}
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "9"
    assert "num_speculative_tokens_per_batch_size" not in (tmp_path / "best.yaml").read_text()
    current = confirmation.load(_load(data))
    assert current is not None and current.complete and not any(f.schedule for f in current.finalists)
    assert len(current.engines) == 4
    study = _load(data)
    assert schedule_run.load(study) is not None
    kept = [e for c in confirmation.history(study) for e in c.engines if e.schedule]
    assert len(kept) == 2 and kept[0].mlflow_run_id in {r.info.run_id for r in runs}


def test_a_schedule_that_only_one_lucky_engine_favours_is_not_exported(tmp_path: Path, fake_schedule: None) -> None:
    """Within noise of the best static configuration at every level in one engine, but its fresh engines do not
    all beat the baseline's: the same rule as a static winner's keeps it out (it was exported before)."""
    data = _study(tmp_path, GAINS)
    # launches: 3 trials, then round 1 (k=3, schedule, baseline) and round 2 (k=3, schedule, baseline)
    data["target"]["engine_args"]["fake_engine_factors"] = [1.0, 1.0, 1.0, 0.9, 1.0, 1.3, 0.9, 1.0, 0.7]
    assert _run(tmp_path, data) == 0
    text = (tmp_path / "best.yaml").read_text()
    assert "num_speculative_tokens_per_batch_size" not in text and "speculative-config" not in text
    assert "this file serves WITHOUT speculation" in text
    run = _stored(data)
    assert run.verdict is not None and not run.exported
    assert run.verdict.reason.startswith("not confirmed in fresh engines: its engines")


def test_a_schedule_slower_than_a_static_configuration_is_not_exported(tmp_path: Path, fake_schedule: None) -> None:
    data = _study(tmp_path, {**GAINS, "schedule": 0.9})  # the schedule's engine runs 10% slow
    assert _run(tmp_path, data) == 0
    run = _stored(data)
    assert run.schedule is not None and run.verdict is not None and not run.exported
    assert run.verdict.reason.startswith("at level 1 the schedule ran")
    text = (tmp_path / "best.yaml").read_text()
    assert "num_speculative_tokens_per_batch_size" not in text and "speculative-config" in text
    assert (
        "# batch-size schedule of ngram lookup 1-3 eager (1: k=3; 2-1024: k=0; k=0: no speculation) NOT exported: at level 1"
        in text
    )


def test_a_constant_schedule_is_not_validated(tmp_path: Path, fake_schedule: None) -> None:
    data = _study(tmp_path, {"3@1": 1.4, "1@1": 1.2, "3@4": 1.3, "1@4": 1.1})
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "7"  # no schedule engine: k=3 and the baseline twice each
    run = _stored(data)
    assert run.schedule is None and "constant: k=3" in run.derivation.note
    assert "# no batch-size schedule: constant: k=3 at every level" in (tmp_path / "best.yaml").read_text()


def test_a_confirmation_of_other_schedule_ranges_is_not_resumed_as_this_schedules(
    tmp_path: Path, fake_schedule: None
) -> None:
    """The H100 head study (2026-12-07): its confirmation was planned with the ranges of the old boundary rule,
    resumed after the rule changed, and its second schedule engine ran the new ranges under the old label."""
    data = _study(tmp_path, GAINS)
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "9"
    study = _load(data)
    stored = confirmation.load(study)
    assert stored is not None
    derived = _stored(data).schedule
    assert derived is not None
    for f in stored.finalists:
        if f.schedule:  # as if planned under another rule: other ranges in the label
            f.label = f.label.replace(derived.text(), "1-3: k=3; 4-1024: k=0")
    study.set_user_attr(confirmation.CONFIRMATION, stored.model_dump(mode="json"))

    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "15"  # a new confirmation: k=3, the schedule, the baseline
    study = _load(data)
    assert [c.finalists for c in confirmation.history(study)] == [stored.finalists]
    current = confirmation.load(study)
    assert current is not None and current.complete
    runs = [e for e in current.engines if e.schedule]
    assert len(runs) == 2 and all(e.ranges == derived.vllm_value() for e in runs)
