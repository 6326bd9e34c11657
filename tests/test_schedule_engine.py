"""One real CPU validation engine: a small study on the demo model derives a batch-size schedule from two
n-gram k's and the baseline at batch sizes 1 and 4, runs it in a fresh vLLM engine, and exports either the
schedule or the static winner with the reason. Run it under ``flock /tmp/engine.lock``."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.conftest import ROOT, study_dict, write_study
from tests.test_schedule import parse_with_vllm
from tuner.cli import main
from tuner.results import store
from tuner.results.schedule import Derivation, LevelChoice, Schedule, ranges
from tuner.study.config import StudyConfig
from tuner.trial import schedule_check

pytestmark = pytest.mark.engine

FIXED = [(1, 3), (4, 0)]  # (level, k) when this machine's measurements chose one k everywhere
DERIVE = schedule_check.derive_for


def _derive_or_fixed(study: optuna.Study, config: StudyConfig) -> Derivation:
    """The real derivation; if it is constant (on a busy 2-core machine short runs often are), a fixed
    schedule over the measured k=3 trial, so that the engine part is tested whatever the load."""
    derived = DERIVE(study, config)
    if derived.schedule is not None:
        return derived
    by_k = {(s.num_speculative_tokens or 0): t for t in store.completed(study) if (s := store.trial_spec(t))}
    levels = []
    for level, k in FIXED:
        lv = store.trial_metrics(by_k[k]).level(level)  # type: ignore[union-attr]
        assert lv is not None
        levels.append(
            LevelChoice(
                level=level,
                k=k,
                trial=by_k[k].number,
                tokens_per_s=lv.tokens_per_s,
                fastest_k=k,
                fastest_tokens_per_s=lv.tokens_per_s,
                noise=0.03,
            )
        )
    spec = store.trial_spec(by_k[3])
    assert spec is not None
    schedule = Schedule(
        drafter=schedule_check.drafter_label(spec),
        trial=by_k[3].number,
        levels=levels,
        ranges=ranges(FIXED, 1024),
        cap=1024,
    )
    return Derivation(schedule=schedule, levels=levels, note=f"fixed by the test ({derived.note})")


def test_a_real_engine_validates_the_derived_schedule(
    tmp_path: Path, demo_models: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_check, "derive_for", _derive_or_fixed)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
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
    study_path = write_study(tmp_path, data)
    args = ["--workdir", str(tmp_path / "runs"), "--no-progress", "--export", str(export)]
    assert main(["optimize", "--study", str(study_path), *args]) == 0

    run = schedule_check.current(optuna.load_study(study_name="real-schedule", storage=data["storage"]))
    assert run is not None and run.schedule is not None
    request = json.loads((tmp_path / "runs" / "real-schedule" / schedule_check.WORKDIR / "request.json").read_text())
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
    measured = [(c.level, c.k, round(c.tokens_per_s, 1)) for c in run.derivation.levels]
    print(f"\n{run.derivation.note or 'derived'}: {run.schedule.text()} from {measured}: {run.outcome()}")
