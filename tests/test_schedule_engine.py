"""One real CPU validation engine: the session's real study on the demo model (its measured trials reused)
derives a batch-size schedule from the baseline and the best drafter's k at batch sizes 1 and 4, runs it in a
fresh vLLM engine, and exports either the schedule or the static winner with the reason. Run it under
``flock /tmp/engine.lock``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import ROOT, RealStudy, write_study
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
    tmp_path: Path, real_study: RealStudy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's real study (baseline, n-gram k=3, draft k=2 at batch sizes 1 and 4, none pruned) resumed
    from a copy of its storage with the schedule switched on: its budget is spent, so the only engine this
    test starts is the schedule's validation engine."""
    assert real_study.result.returncode == 0, real_study.result.stderr[-3000:]
    monkeypatch.setattr(schedule_check, "derive_for", _derive_or_fixed)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(real_study.study_path.read_text())
    assert data["pruning"] == {"enabled": False}  # every k completes: they are the schedule's options
    shutil.copy(real_study.dir / "optuna.db", tmp_path / "optuna.db")
    # Sections outside the fingerprint: the copy resumes the same study, with a tracking store of its own.
    data["storage"] = f"sqlite:///{tmp_path / 'optuna.db'}"
    data["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": data["name"]}
    data["schedule"] = {"enabled": True}
    # Already confirmed in the original; its MLflow runs are not in this tracking store.
    data["confirm"] = {"enabled": False}
    export = tmp_path / "best.yaml"
    study_path = write_study(tmp_path, data)
    args = ["--workdir", str(tmp_path / "runs"), "--no-progress", "--export", str(export)]
    assert main(["optimize", "--study", str(study_path), *args]) == 0
    study = optuna.load_study(study_name="real-study", storage=data["storage"])
    assert len(study.trials) == 3  # no trial ran again

    run = schedule_check.current(study)
    assert run is not None and run.schedule is not None
    request = json.loads((tmp_path / "runs" / "real-study" / schedule_check.WORKDIR / "request.json").read_text())
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
