"""Study-file validation: every bad input is one line naming the field and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import study_dict, write_study
from tuner.errors import UserError
from tuner.study.loader import load_study
from tuner.study.prompts import load_prompts


def _error(tmp_path: Path, **overrides: object) -> str:
    data = study_dict(tmp_path, **overrides)
    with pytest.raises(UserError) as info:
        load_study(write_study(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message
    assert "fix:" in message
    return message


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parent.parent / "studies").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_study_file_loads_with_its_prompts(path: Path) -> None:
    study = load_study(path)
    assert load_prompts(study.workload.prompts)


def test_demo_study_file_is_valid() -> None:
    study = load_study(Path(__file__).parent.parent / "studies" / "smollm2-cpu.yaml")
    assert study.workload.prompts.is_file()
    prompts = load_prompts(study.workload.prompts)[: study.workload.max_prompts]
    tags = {t for p in prompts for t in p.tags}
    assert {"copy-heavy", "open-ended"} <= tags
    assert [c.method for c in study.candidates][:1] == ["none"]


def test_misspelt_key_suggests_the_right_one(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["workload"]["max_tokenz"] = 3
    with pytest.raises(UserError, match=r"workload\.max_tokenz: unknown key.*did you mean 'max_tokens'"):
        load_study(write_study(tmp_path, data))


def test_unknown_candidate_key(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["candidates"][2]["modle"] = "x"
    with pytest.raises(UserError, match=r"candidates\.2\.modle: unknown key.*'model'"):
        load_study(write_study(tmp_path, data))


def test_wrong_type(tmp_path: Path) -> None:
    msg = _error(tmp_path, budget={"trials": "many"})
    assert msg.split(": ")[1].startswith("budget.trials")


@pytest.mark.parametrize("k", [0, 17])
def test_k_out_of_range(tmp_path: Path, k: int) -> None:
    msg = _error(tmp_path, search={"num_speculative_tokens": {"low": 1, "high": k}})
    assert "search.num_speculative_tokens" in msg


def test_draft_without_model(tmp_path: Path) -> None:
    msg = _error(tmp_path, candidates=[{"name": "d", "method": "draft_model", "num_speculative_tokens": 2}])
    assert "candidates.0" in msg and "model" in msg


def test_missing_required_section(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    del data["workload"]
    with pytest.raises(UserError, match=r"workload: required; fix: add it"):
        load_study(write_study(tmp_path, data))


def test_reserved_engine_arg(tmp_path: Path) -> None:
    msg = _error(tmp_path, target={"model": "x", "engine_args": {"speculative_config": {}}})
    assert "target.engine_args" in msg


def test_target_env_takes_strings_and_numbers(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["target"]["env"] = {"VLLM_ENABLE_V1_MULTIPROCESSING": 0, "OMP_NUM_THREADS": "2"}
    assert load_study(write_study(tmp_path, data)).target.env == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "2",
    }


@pytest.mark.parametrize(("env", "field"), [({"VLLM X": "1"}, "VLLM X"), ({"FLAG": True}, "FLAG"), ({"A": [1]}, "A")])
def test_bad_target_env_names_the_variable(tmp_path: Path, env: dict[str, object], field: str) -> None:
    data = study_dict(tmp_path)
    msg = _error(tmp_path, target={**data["target"], "env": env})
    assert "target.env" in msg and field in msg


def test_a_dtype_vllm_does_not_know_is_refused_at_load(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    msg = _error(tmp_path, target={**data["target"], "dtype": "bf16"})
    assert msg.startswith(str(tmp_path / "test-study.yaml") + ": target.dtype:") and "'bfloat16'" in msg, msg


def test_an_ngram_whose_lookup_min_is_above_every_max_is_refused(tmp_path: Path) -> None:
    ngram = {"name": "ng", "method": "ngram", "prompt_lookup_max": [2, 4], "prompt_lookup_min": [5, 6]}
    msg = _error(tmp_path, candidates=[{"name": "none", "method": "none"}, ngram])
    assert "candidates.1: prompt_lookup_min from 5 is above prompt_lookup_max up to 4" in msg, msg
    ngram["prompt_lookup_min"] = [4, 6]  # (4, 4) fits both: allowed
    data = study_dict(tmp_path, candidates=[{"name": "none", "method": "none"}, ngram])
    assert load_study(write_study(tmp_path, data)).candidates[1].prompt_lookup_min is not None


def test_batch_weights_must_match(tmp_path: Path) -> None:
    msg = _error(tmp_path, workload={"prompts": "p.jsonl", "batch_sizes": [1, 8], "batch_weights": [1.0]})
    assert "workload" in msg and "batch_weights" in msg


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_study(path)


def test_missing_study_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--study"):
        load_study(tmp_path / "nope.yaml")


def test_prompt_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello"}) + "\n" + "{broken\n")
    with pytest.raises(UserError, match=r"line 2: not valid JSON"):
        load_prompts(path)
    path.write_text("")
    with pytest.raises(UserError, match="has no prompts"):
        load_prompts(path)
    with pytest.raises(UserError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(UserError, match=f"{tmp_path} is a folder; fix: point it at a JSONL prompt file"):
        load_prompts(tmp_path)
    path.write_text(json.dumps({"messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(UserError, match=r"line 1: 'messages' must be"):
        load_prompts(path)


def test_prompt_formats(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"prompt": "raw text"})
        + "\n\n"
        + json.dumps({"id": "chat", "messages": [{"role": "user", "content": "hi"}]})
        + "\n"
        + json.dumps("plain string")
        + "\n"
    )
    prompts = load_prompts(path)
    assert [p.id for p in prompts] == ["1", "chat", "4"]
    assert prompts[0].text == "raw text" and prompts[1].messages is not None


def test_gpu_study_file_is_valid() -> None:
    from tuner.study.space import grid

    study = load_study(Path(__file__).parent.parent / "studies" / "smollm2-h200.yaml")
    assert study.workload.batch_sizes == [1, 64]
    assert study.search.enforce_eager == [True, False]
    assert {c.method for c in study.candidates} == {"none", "ngram", "draft_model"}
    assert len(load_prompts(study.workload.prompts)) >= 8
    assert len(grid(study)) > 20
