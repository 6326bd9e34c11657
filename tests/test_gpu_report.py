"""benchmarks/gpu_report.py: the study and the grid are compared by configuration, whatever machine's model
cache their draft paths point into."""

from __future__ import annotations

from benchmarks import gpu_report
from benchmarks.gpu_report import portable_key


def test_keys_from_different_model_caches_match() -> None:
    there = "('draft_model', '/root/wide/cache/models/SmolLM2-135M-Instruct', 2, None, None, True, ())"
    here = "('draft_model', '/root/.cache/specdec-tuner/models/SmolLM2-135M-Instruct/', 2, None, None, True, ())"
    assert (
        portable_key(there)
        == portable_key(here)
        == ("('draft_model', 'SmolLM2-135M-Instruct', 2, None, None, True, ())")
    )
    other = "('draft_model', '/root/wide/cache/models/SmolLM2-135M-Instruct-8L', 2, None, None, True, ())"
    assert portable_key(other) != portable_key(there)
    assert portable_key("('ngram', None, 4, 2, 5, False, ())") == "('ngram', None, 4, 2, 5, False, ())"


def test_a_resumed_study_with_partial_timings_gets_no_negative_split() -> None:
    rows = [
        {"duplicate_of": None, "wall_s": 200.0, "engine_start_s": 100.0, "warmup_s": 10.0, "measured_s": 50.0},
        {"duplicate_of": None, "wall_s": 150.0, "engine_start_s": 80.0, "warmup_s": 10.0, "measured_s": 40.0},
    ]
    whole = gpu_report._split(rows, [{"step": "study", "wall_s": 300.0}, {"step": "study", "wall_s": 100.0}])
    assert whole["study_wall_s"] == 400.0 and whole["tuner_outside_trials_s"] == 50.0

    # Only the last call's line came back from the device: less than the trials themselves.
    part = gpu_report._split(rows, [{"step": "study", "wall_s": 100.0}])
    assert "study_wall_s" not in part and "tuner_outside_trials_s" not in part
    assert part["timings_partial_s"] == 100.0


def test_a_trial_running_in_a_database_brought_back_mid_study_is_reported_interrupted(tmp_path) -> None:
    """The H100 went back while trial 6 of studies/wide-h200-eagle3.yaml started its engine (2026-12-07): the
    database that came back holds it as RUNNING, which no trial is once the study has stopped."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    folder = root / "benchmarks/results/eagle3-wide-h100-20261207"
    import sqlite3

    db = tmp_path / "optuna.db"
    shutil.copy(folder / "optuna.db", db)  # read-only use, but Optuna's storage may write its schema version
    study = root / "studies/wide-h200-eagle3.yaml"
    # The resumed study (next session) failed trial 6 and ran it again as 7: the database as it came back
    # the first time has trial 6 RUNNING and nothing after it.
    with sqlite3.connect(db) as con:
        first = con.execute("select trial_id from trials where number = 7").fetchone()[0]
        for table in ("trial_params", "trial_values", "trial_user_attributes", "trial_system_attributes"):
            con.execute(f"delete from {table} where trial_id >= ?", (first,))
        con.execute("delete from trials where number >= 7")
        con.execute("update trials set state = 'RUNNING', datetime_complete = NULL where number = 6")
    summary = gpu_report.study_summary(study, f"sqlite:///{db}", folder / "runs", None)
    by_number = {t["number"]: t for t in summary["trials"]}
    assert by_number[6]["state"] == "RUNNING" and by_number[6]["interrupted"]
    assert not any(by_number[n]["interrupted"] for n in range(6))
    # resumed: trial 6 failed by the resume is still the interrupted one, its retry is not
    again = tmp_path / "resumed.db"
    shutil.copy(folder / "optuna.db", again)
    resumed = gpu_report.study_summary(study, f"sqlite:///{again}", folder / "runs", None)
    by_number = {t["number"]: t for t in resumed["trials"]}
    assert by_number[6]["state"] == "FAIL" and by_number[6]["interrupted"]
    assert by_number[7]["state"] == "COMPLETE" and not by_number[7]["interrupted"]
