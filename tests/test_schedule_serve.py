"""The batch-size schedule in a serve-mode study, with the stand-in engine: the validation engine is served
and loaded like the trials (concurrency levels, and the SLO search under the goodput objective)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_schedule_flow import GAINS, _run, _stored, _study, fake_schedule  # noqa: F401

# Goodput: the validation server runs the concurrency levels and the SLO rate search, as the trials do.
SERVE = {
    "objective": "goodput",
    "slo": {"percentile": 90, "ttft_ms": 100, "tpot_ms": 30},
    "rate_search": {"start_rps": 1, "max_rps": 16, "bisect_steps": 2},
}


def test_a_served_study_validates_its_schedule_under_the_same_load(
    tmp_path: Path,
    fake_schedule: None,  # noqa: F811
) -> None:
    data = _study(tmp_path, GAINS)
    data["workload"].update({"mode": "serve", "serve": SERVE})
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "9"  # three trials; k=3, the schedule and the baseline twice each
    run = _stored(data)
    assert run.schedule is not None and run.schedule.vllm_value() == [[1, 1, 3], [2, 1024, 0]]
    request = json.loads((tmp_path / "runs" / "sched" / "confirm-r1-schedule" / "request.json").read_text())
    assert request["mode"] == "serve"
    assert run.metrics is not None and run.metrics.mode == "serve"
    assert [lv.batch_size for lv in run.metrics.levels] == [1, 4]
    assert run.metrics.slo is not None and run.metrics.objective == "goodput"
    text = (tmp_path / "best.yaml").read_text()
    assert "concurrency 1: k=3" in text, text
