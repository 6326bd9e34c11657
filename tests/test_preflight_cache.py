"""Pre-flight's verdict is reused on resume only while the study settings, vLLM and the model files that
decided it are unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import study_dict
from tuner.engine import preflight_cache
from tuner.engine.preflight import Preflight
from tuner.study.config import StudyConfig


def _checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "tokenizer.json").write_text("{}")
    return path


@pytest.fixture()
def calls(monkeypatch: pytest.MonkeyPatch) -> list[StudyConfig]:
    seen: list[StudyConfig] = []

    def fake(config: StudyConfig) -> Preflight:
        seen.append(config)
        return Preflight(target_path=config.target.model, allowed=["none", "ngram"], rejected={"draft-4l": "why"})

    monkeypatch.setattr(preflight_cache, "run_preflight", fake)
    return seen


def _config(tmp: Path, draft: str = "", **overrides: object) -> StudyConfig:
    data = study_dict(tmp)
    data["target"]["model"] = str(tmp / "target")
    data["candidates"][2]["model"] = draft or str(tmp / "draft")
    data.update(overrides)
    return StudyConfig.model_validate(data)


def test_the_verdict_is_reused_until_something_it_depends_on_changes(tmp_path: Path, calls: list) -> None:
    _checkpoint(tmp_path / "target")
    draft = _checkpoint(tmp_path / "draft")
    work = tmp_path / "runs"
    first, reused = preflight_cache.cached_preflight(_config(tmp_path), work)
    assert not reused and len(calls) == 1 and (work / preflight_cache.CACHE_FILE).is_file()
    again, reused = preflight_cache.cached_preflight(_config(tmp_path), work)
    assert reused and again == first and len(calls) == 1
    # Outside what pre-flight reads: the budget, storage and tracking of a resumed study.
    _, reused = preflight_cache.cached_preflight(_config(tmp_path, budget={"trials": 9}), work)
    assert reused
    # A draft's files changed (a rebuilt checkpoint): checked again.
    (draft / "tokenizer.json").write_text('{"changed": true}')
    os.utime(draft / "tokenizer.json", ns=(1, 1))
    _, reused = preflight_cache.cached_preflight(_config(tmp_path), work)
    assert not reused and len(calls) == 2
    # A setting pre-flight reads (the schedule asks vLLM for one more probe): checked again.
    _, reused = preflight_cache.cached_preflight(
        _config(tmp_path, schedule={"enabled": True}, confirm={"enabled": True}), work
    )
    assert not reused and len(calls) == 3


def test_a_hub_model_or_a_damaged_file_is_never_trusted(tmp_path: Path, calls: list) -> None:
    _checkpoint(tmp_path / "target")
    work = tmp_path / "runs"
    config = _config(tmp_path, draft="someone/draft-on-the-hub")
    preflight_cache.cached_preflight(config, work)
    preflight_cache.cached_preflight(config, work)
    assert len(calls) == 2 and not (work / preflight_cache.CACHE_FILE).exists()
    _checkpoint(tmp_path / "draft")
    preflight_cache.cached_preflight(_config(tmp_path), work)
    (work / preflight_cache.CACHE_FILE).write_text("{not json")
    _, reused = preflight_cache.cached_preflight(_config(tmp_path), work)
    assert not reused and len(calls) == 4
