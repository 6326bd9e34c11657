"""Search-space construction: conditional parameters, baseline, grid, and vLLM arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from tests.conftest import study_dict, write_study
from tuner.study.config import StudyConfig
from tuner.study.loader import load_study
from tuner.study.space import baseline_params, candidate_names, first_trial_params, grid, suggest
from tuner.study.spec import llm_kwargs


def _study(tmp_path: Path, **overrides: Any) -> StudyConfig:
    return load_study(write_study(tmp_path, study_dict(tmp_path, **overrides)))


class FixedTrial:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        value = self.values[name]
        assert value in choices
        return value

    def suggest_int(self, name: str, low: int, high: int) -> int:
        value = self.values[name]
        assert low <= value <= high
        return int(value)


def test_baseline_always_a_candidate(tmp_path: Path) -> None:
    study = _study(tmp_path, candidates=[{"name": "ng", "method": "ngram"}])
    assert candidate_names(study) == ["none", "ng"]
    assert baseline_params(study, True) == {"candidate": "none", "enforce_eager": True}


def test_ngram_suggestion_clips_min_to_max(tmp_path: Path) -> None:
    study = _study(tmp_path)
    spec = suggest(
        FixedTrial(
            {
                "candidate": "ngram",
                "enforce_eager": True,
                "ngram.num_speculative_tokens": 5,
                "ngram.prompt_lookup_max": 2,
                "ngram.prompt_lookup_min": 2,
            }
        ),
        study,
    )
    assert spec.speculative_config() == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 2,
        "prompt_lookup_min": 2,
    }


def test_draft_suggestion_and_llm_kwargs(tmp_path: Path) -> None:
    study = _study(tmp_path)
    spec = suggest(
        FixedTrial({"candidate": "draft-4l", "enforce_eager": True, "draft-4l.num_speculative_tokens": 2}), study
    )
    kwargs = llm_kwargs(study.target, "/models/target", spec)
    assert kwargs["speculative_config"]["method"] == "draft_model"
    assert kwargs["speculative_config"]["model"].endswith("SmolLM2-135M-Instruct-4L")
    assert kwargs["enforce_eager"] is True and kwargs["disable_log_stats"] is False
    assert kwargs["kv_cache_memory_bytes"] == 512 * 1024 * 1024
    assert kwargs["trust_remote_code"] is False


def test_baseline_has_no_speculative_config(tmp_path: Path) -> None:
    study = _study(tmp_path)
    spec = suggest(FixedTrial({"candidate": "none", "enforce_eager": True}), study)
    assert spec.is_baseline and "speculative_config" not in llm_kwargs(study.target, "/m", spec)


def test_grid_size(tmp_path: Path) -> None:
    study = _study(tmp_path)
    specs = grid(study)
    ngram = [s for s in specs if s.method == "ngram"]
    # k 1..6, max 2..4, min 1..min(2, max): (2 + 2 + 2) per k
    assert len(ngram) == 6 * 6
    assert len([s for s in specs if s.method == "draft_model"]) == 3
    assert len({s.key() for s in specs}) == len(specs)


def test_first_trials_become_optuna_params(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 2}]
    study = load_study(write_study(tmp_path, data))
    assert first_trial_params(study) == [
        {"candidate": "ngram", "enforce_eager": True, "ngram.num_speculative_tokens": 2}
    ]


def test_space_works_with_a_real_optuna_trial(tmp_path: Path) -> None:
    study = _study(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    opt = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        trial = opt.ask()
        spec = suggest(trial, study)
        seen.add(spec.method)
        opt.tell(trial, 1.0)
    assert seen == {"none", "ngram", "draft_model"}
