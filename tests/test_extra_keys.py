"""``candidates[].extra``: any JSON value runs through a study; keys the tuner sets are refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_cli, study_dict, write_study
from tuner.cli import main
from tuner.errors import UserError
from tuner.results import store
from tuner.study.loader import load_study

LIST_AND_DICT = {"synthetic_acceptance_rates": [0.6, 0.3], "draft_load_config": {"load_format": "auto"}}


def test_list_and_dict_values_run_through_a_study(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 8, "trial_timeout_s": 60})
    data["candidates"] = [
        {"name": "none", "method": "none"},
        {
            "name": "draft-4l",
            "method": "draft_model",
            "model": "demo:SmolLM2-135M-Instruct-4L",
            "num_speculative_tokens": [1, 2],
            "extra": LIST_AND_DICT,
        },
    ]
    data["confirm"] = {"enabled": True, "rounds": 1, "skip_when_behind": False}
    path = write_study(tmp_path, data)
    runs = tmp_path / "runs"
    args = ["optimize", "--study", str(path), "--no-progress", "--workdir", str(runs)]
    assert main([*args, "--export", str(tmp_path / "best.yaml")]) == 0

    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    measured = [t for t in study.get_trials() if store.spends_budget(t)]
    specs = [s for t in measured if (s := store.trial_spec(t)) is not None]
    # The space holds three configurations: the sampler's repeats were recognised by their keys.
    assert len(specs) == len({s.key() for s in specs}) == 3
    drafts = [s for s in specs if not s.is_baseline]
    assert drafts and all(s.extra == LIST_AND_DICT for s in drafts)
    sent = [json.loads(p.read_text()) for p in runs.rglob("request.json")]
    configs = [c for r in sent if (c := r["llm_kwargs"].get("speculative_config"))]
    assert configs and all({k: c[k] for k in LIST_AND_DICT} == LIST_AND_DICT for c in configs)


def test_an_override_exits_2_in_one_line(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["candidates"][2]["extra"] = {"draft_tensor_parallel_size": 1, "num_speculative_tokens": 9}
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1, res.stderr
    assert (
        "candidates.2.extra.num_speculative_tokens: set by the tuner; fix: remove it from extra and set the "
        "candidate's num_speculative_tokens (or search.num_speculative_tokens)"
    ) in res.stderr
    assert not list(tmp_path.glob("*.db"))


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        ("method", "ngram", "the candidate's method"),
        ("model", "/elsewhere", "the candidate's model"),
        ("prompt_lookup_max", 5, "the candidate's prompt_lookup_max"),
        ("prompt_lookup_min", 1, "the candidate's prompt_lookup_min"),
        ("num_speculative_tokens_per_batch_size", [[1, 4, 2]], "schedule: {enabled: true}"),
    ],
)
def test_every_key_the_tuner_sets_is_refused(tmp_path: Path, key: str, value: object, fix: str) -> None:
    data = study_dict(tmp_path)
    data["candidates"][1]["extra"] = {key: value}
    with pytest.raises(UserError) as info:
        load_study(write_study(tmp_path, data))
    assert f"candidates.1.extra.{key}: set by the tuner; fix: remove it from extra and set {fix}" in str(info.value)
