"""One real CPU engine runs a batch-size schedule exactly as the tuner builds it for the schedule's fresh engines
(tuner.results.schedule_run.schedule_spec -> tuner.study.spec.llm_kwargs): vLLM drafts at the batch sizes whose
range says k > 0 and not at those whose range says k = 0. The derivation, the validation rule and the export are
tested on stand-in engines (tests/test_schedule_flow.py, tests/test_schedule.py); this is the part only vLLM can
answer. Run it under ``flock /tmp/engine.lock``."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.conftest import RealStudy
from tuner.engine.process import run_engine
from tuner.engine.request import TrialRequest
from tuner.results import store
from tuner.results.schedule import LevelChoice, Schedule, ranges
from tuner.results.schedule_run import schedule_spec
from tuner.study.loader import load_study
from tuner.study.prompts import load_prompts
from tuner.study.spec import llm_kwargs, resolve_model

pytestmark = pytest.mark.engine

# No speculation at batch size 1, k=3 from 2 on: the opposite of what the drafter alone would pick.
LEVELS = [(1, 0), (4, 3)]


def test_a_real_engine_drafts_where_the_schedule_says(tmp_path: Path, real_study: RealStudy) -> None:
    assert real_study.result.returncode == 0, real_study.result.stderr[-3000:]
    config = load_study(real_study.study_path)
    study = optuna.load_study(study_name=config.name, storage=real_study.storage)
    ngram = next(t for t in store.completed(study) if (s := store.trial_spec(t)) and s.method == "ngram")
    choices = [
        LevelChoice(
            level=lv, k=k, trial=ngram.number, tokens_per_s=1.0, fastest_k=k, fastest_tokens_per_s=1.0, noise=0.03
        )
        for lv, k in LEVELS
    ]
    schedule = Schedule(drafter="ngram", trial=ngram.number, levels=choices, ranges=ranges(LEVELS, 1024), cap=1024)
    spec = schedule_spec(study, schedule)
    kwargs = llm_kwargs(config.target, resolve_model(config.target.model), spec)
    assert kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 0], [2, 1024, 3]]
    request = TrialRequest.for_study(config, load_prompts(config.workload.prompts), kwargs).model_copy(
        update={"repeats": 1}
    )
    outcome = run_engine(request, tmp_path / "schedule-engine", config.budget.trial_timeout_s)
    assert outcome.result is not None, outcome.message
    drafted = {bs: sum(r.spec.draft_tokens for r in outcome.result.repeats if r.batch_size == bs) for bs in (1, 4)}
    # Every batch at level 1 runs at batch size 1 (k=0: no draft); level 4's batches run at 2-4 (k=3) until
    # their last request.
    assert drafted[1] == 0 and drafted[4] > 0, drafted
