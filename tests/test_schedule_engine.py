"""One real CPU validation engine: a small study on the demo model derives a batch-size schedule from two
n-gram k's and the baseline at batch sizes 1 and 4, runs it in a fresh vLLM engine, and exports either the
schedule or the static winner with the reason. Run it under ``flock /tmp/engine.lock``."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_cli, study_dict, write_study
from tests.test_schedule import parse_with_vllm
from tuner.trial import schedule_check

pytestmark = pytest.mark.engine


def test_a_real_engine_validates_the_derived_schedule(tmp_path: Path, demo_models: None) -> None:
    data = study_dict(tmp_path, name="real-schedule", budget={"trials": 3, "trial_timeout_s": 600})
    data["candidates"] = data["candidates"][:2]  # none, ngram
    data["workload"].update({"batch_sizes": [1, 4], "repeats": 1})
    data["pruning"] = {"enabled": False}  # both k's must complete: they are the schedule's options
    data["schedule"] = {"enabled": True}
    lookup = {"prompt_lookup_max": 3, "prompt_lookup_min": 1}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 3, **lookup},
        {"candidate": "ngram", "num_speculative_tokens": 1, **lookup},
    ]
    export = tmp_path / "best.yaml"
    result = run_cli(["optimize", "--study", str(write_study(tmp_path, data)), "--export", str(export)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    run = schedule_check.current(optuna.load_study(study_name="real-schedule", storage=data["storage"]))
    assert run is not None
    measured = [(c.level, c.k, round(c.tokens_per_s, 1)) for c in run.derivation.levels]
    assert run.schedule is not None, f"no schedule: {run.derivation.note} {measured}"
    workdir = tmp_path / "tuner-runs" / "real-schedule" / schedule_check.WORKDIR
    request = json.loads((workdir / "request.json").read_text())
    spec = request["llm_kwargs"]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == run.schedule.vllm_value()
    assert spec["num_speculative_tokens"] == run.schedule.max_k
    assert run.failure is None, run.failure
    assert run.metrics is not None and [lv.batch_size for lv in run.metrics.levels] == [1, 4]
    assert run.verdict is not None
    # Every batch of level 1 runs at batch size 1: vLLM drafts there exactly when the schedule says so.
    level1 = run.metrics.levels[0].spec
    assert (level1.draft_tokens > 0) == (run.schedule.levels[0].k > 0), level1

    text = export.read_text()
    if run.exported:
        assert "the schedule is exported" in text
        parsed = parse_with_vllm(export)
        assert [list(r) for r in parsed.num_speculative_tokens_per_batch_size] == run.schedule.vllm_value()
    else:
        assert "num_speculative_tokens_per_batch_size" not in text
        assert f"NOT exported: {run.verdict.reason}" in text
    print(f"\nschedule {run.schedule.text()} from {measured}: {run.outcome()}")
