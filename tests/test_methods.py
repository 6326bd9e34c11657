"""The method registry: each method's knobs, defaults, vLLM form, validation and label."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from pydantic import ValidationError

from tests.conftest import study_dict
from tuner.study import methods
from tuner.study.config import Candidate, IntRange, StudyConfig
from tuner.study.methods import Method
from tuner.study.spec import TrialSpec


def test_registry_covers_the_method_literal() -> None:
    assert set(methods.METHODS) == set(get_args(Method))
    assert all(rule.name == name for name, rule in methods.METHODS.items())


@pytest.mark.parametrize(
    ("method", "model", "lookup", "expected"),
    [
        ("none", None, (None, None), None),
        (
            "ngram",
            None,
            (4, 2),
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
        ),
        ("draft_model", "/d", (None, None), {"method": "draft_model", "num_speculative_tokens": 3, "model": "/d"}),
        ("eagle", "/e", (None, None), {"method": "eagle", "num_speculative_tokens": 3, "model": "/e"}),
        ("eagle3", "/e3", (None, None), {"method": "eagle3", "num_speculative_tokens": 3, "model": "/e3"}),
        ("mtp", None, (None, None), {"method": "mtp", "num_speculative_tokens": 3}),
        ("mtp", "/m", (None, None), {"method": "mtp", "num_speculative_tokens": 3, "model": "/m"}),
        ("suffix", None, (None, None), {"method": "suffix", "num_speculative_tokens": 3}),
    ],
)
def test_speculative_config_per_method(
    method: Method, model: str | None, lookup: tuple[int | None, int | None], expected: dict[str, Any] | None
) -> None:
    k = None if method == "none" else 3
    built = methods.speculative_config(method, k, model, prompt_lookup_max=lookup[0], prompt_lookup_min=lookup[1])
    assert built == expected
    spec = TrialSpec(
        candidate="c",
        method=method,
        draft_model=model,
        num_speculative_tokens=k,
        prompt_lookup_max=lookup[0],
        prompt_lookup_min=lookup[1],
    )
    assert spec.speculative_config() == expected


def test_extra_keys_are_passed_last_and_cannot_override_the_tuners() -> None:
    built = methods.speculative_config("suffix", 2, extra={"suffix_decoding_max_tree_depth": 8, "enforce_eager": True})
    assert list((built or {}).items()) == [
        ("method", "suffix"),
        ("num_speculative_tokens", 2),
        ("suffix_decoding_max_tree_depth", 8),
        ("enforce_eager", True),
    ]
    # Each value differs from the tuner's: an implementation where either side silently wins fails here.
    for key, value in (("method", "ngram"), ("num_speculative_tokens", 5), ("model", "/d"), ("prompt_lookup_max", 7)):
        with pytest.raises(ValueError, match=f"extra.{key}: set by the tuner"):
            methods.speculative_config("ngram", 2, None, 1, 3, extra={key: value})
        with pytest.raises(ValidationError, match="set by the tuner; fix: remove it from extra"):
            Candidate.model_validate({"name": "c", "method": "ngram", "extra": {key: value}})
    # The schedule's validation engine passes its schedule this way (a study file may not: see above).
    schedule = {methods.SCHEDULE: [[1, 4, 2]]}
    assert methods.speculative_config("ngram", 2, extra=schedule) == {
        "method": "ngram",
        "num_speculative_tokens": 2,
        **schedule,
    }
    with pytest.raises(ValidationError, match=methods.SCHEDULE):
        Candidate.model_validate({"name": "c", "method": "ngram", "extra": schedule})


def test_knobs_per_method() -> None:
    assert methods.rules("none").knobs == ()
    assert methods.rules("ngram").knobs == ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")
    for method in ("draft_model", "eagle", "eagle3", "mtp", "suffix"):
        assert methods.rules(method).knobs == ("num_speculative_tokens",)
    assert [m for m, r in methods.METHODS.items() if r.checkable_without_model] == ["ngram", "suffix"]


def test_ngram_lookup_defaults_and_clipping() -> None:
    assert methods.clip_lookup(None, None) == (4, 2)
    assert methods.clip_lookup(6, None) == (6, 2)
    assert methods.clip_lookup(None, 3) == (4, 3)
    assert methods.clip_lookup(2, 5) == (2, 2)  # min above max is clipped, not refused
    assert methods.clip_lookup(1, None) == (1, 1)


def test_ngram_lookup_grid_and_probe() -> None:
    assert methods.lookup_grid(None, None) == [(4, 2)]
    assert methods.lookup_grid(IntRange(low=1, high=3), None) == [(1, 1), (2, 2), (3, 2)]
    assert methods.lookup_grid(IntRange(low=2, high=3), IntRange(low=2, high=3)) == [(2, 2), (3, 2), (3, 3)]
    assert methods.lookup_probe(None, None) == (4, 2)
    assert methods.lookup_probe(IntRange(low=2, high=5), IntRange(low=1, high=3)) == (5, 1)
    assert methods.lookup_probe(IntRange(low=1, high=1), None) == (1, 1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "draft_model"}, "method draft_model needs a draft model; fix: add model: PATH"),
        ({"method": "eagle"}, "method eagle needs a draft model; fix: add model: PATH"),
        ({"method": "eagle3"}, "method eagle3 needs a draft model; fix: add model: PATH"),
        ({"method": "ngram", "model": "/d"}, "method ngram takes no model; fix: remove model"),
        ({"method": "suffix", "model": "/d"}, "method suffix takes no model; fix: remove model"),
        ({"method": "none", "model": "/d"}, "method none takes no model; fix: remove model"),
        (
            {"method": "suffix", "prompt_lookup_max": 3},
            "prompt_lookup_min/max are n-gram settings; fix: remove them or use method: ngram",
        ),
        (
            {"method": "none", "num_speculative_tokens": 2},
            "method none speculates nothing; fix: remove num_speculative_tokens",
        ),
    ],
)
def test_candidate_validation_errors(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Candidate.model_validate({"name": "c", **fields})
    assert message in str(info.value)
    assert "\n" not in message


@pytest.mark.parametrize(
    "fields",
    [
        {"method": "mtp"},
        {"method": "mtp", "model": "/m"},
        {"method": "ngram", "prompt_lookup_min": 1, "num_speculative_tokens": [1, 3]},
        {"method": "suffix", "num_speculative_tokens": 4},
        {"method": "none"},
    ],
)
def test_candidate_valid_settings(fields: dict[str, Any]) -> None:
    Candidate.model_validate({"name": "c", **fields})


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("none", "no speculation eager"),
        ("ngram", "ngram k=3 lookup 2-4 eager"),
        ("draft_model", "my-draft k=3 eager"),
        ("eagle", "eagle my-draft k=3 eager"),
        ("eagle3", "eagle3 my-draft k=3 eager"),
        ("mtp", "my-draft k=3 eager"),
        ("suffix", "my-draft k=3 eager"),
    ],
)
def test_labels(method: Method, expected: str) -> None:
    lookup = {"prompt_lookup_min": 2, "prompt_lookup_max": 4} if method == "ngram" else {}
    spec = TrialSpec(candidate="my-draft", method=method, num_speculative_tokens=3, **lookup)
    assert spec.label() == expected
    assert spec.model_copy(update={"enforce_eager": False}).label().endswith(" compiled")


def test_trial_spec_keeps_method_typed() -> None:
    with pytest.raises(ValidationError, match="method"):
        TrialSpec(candidate="c", method="medusa")  # type: ignore[arg-type]


def test_preflight_probes_come_from_the_registry(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.engine import preflight, vllm_checks
    from tuner.engine.process import ENGINE_MODULE_ENV

    monkeypatch.delenv(ENGINE_MODULE_ENV, raising=False)
    seen: list[dict[str, Any]] = []

    def fake_validate(configs: list[dict[str, Any]], timeout_s: float = 0.0) -> list[str | None]:
        seen.extend(configs)
        return [None] * len(configs)

    monkeypatch.setattr(vllm_checks, "validate_in_subprocess", fake_validate)
    data = study_dict(
        tmp_path,
        candidates=[
            {"name": "ng", "method": "ngram", "num_speculative_tokens": [1, 3], "prompt_lookup_max": [2, 5]},
            {
                "name": "sx",
                "method": "suffix",
                "num_speculative_tokens": 2,
                "extra": {"suffix_decoding_max_tree_depth": 8},
            },
            {"name": "mt", "method": "mtp"},
        ],
    )
    study = StudyConfig.model_validate(data)
    assert preflight.check_with_vllm(study, ["none", "ng", "sx", "mt"]) == {}
    assert seen == [
        {"method": "ngram", "num_speculative_tokens": 1, "prompt_lookup_max": 5, "prompt_lookup_min": 2},
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2},
        {"method": "suffix", "num_speculative_tokens": 2, "suffix_decoding_max_tree_depth": 8},
    ]
