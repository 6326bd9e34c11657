"""Arithmetic: statistics, speedup, spec-decode counters, lossless comparison."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import study_dict, write_study
from tuner.measurement import EngineResult, RepeatMeasurement
from tuner.scoring import compare_tokens, score_result
from tuner.spec_metrics import SpecStats, diff, snapshot
from tuner.stats import coefficient_of_variation, conservative_score, mad, median, percentile, speedup
from tuner.study_loader import load_study


def test_robust_statistics() -> None:
    values = [10.0, 12.0, 11.0, 50.0]
    assert median(values) == 11.5
    assert mad(values) == 1.0
    assert conservative_score(values, 2.0) == 9.5
    assert percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    assert coefficient_of_variation([1.0]) == 0.0
    assert speedup(150, 100) == 1.5 and speedup(1, 0) is None


class _Counter:
    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value


class _Vector:
    def __init__(self, name: str, values: list[int]) -> None:
        self.name, self.values = name, values


def _metrics(drafts: int, tokens: int, accepted: int, per_pos: list[int]) -> list[object]:
    return [
        _Counter("vllm:spec_decode_num_drafts", drafts),
        _Counter("vllm:spec_decode_num_draft_tokens", tokens),
        _Counter("vllm:spec_decode_num_accepted_tokens", accepted),
        _Vector("vllm:spec_decode_num_accepted_tokens_per_pos", per_pos),
        _Counter("vllm:generation_tokens", 999),
    ]


def test_spec_counters_are_diffed_over_the_window() -> None:
    before = snapshot(_metrics(10, 30, 12, [6, 4, 2]))
    after = snapshot(_metrics(110, 330, 162, [86, 54, 22]))
    stats = diff(before, after)
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (100, 300, 150)
    assert stats.accepted_per_pos == [80, 50, 20]
    assert stats.acceptance_rate == 0.5
    assert stats.mean_acceptance_length == 2.5
    assert stats.per_position_rate == [0.8, 0.5, 0.2]


def test_counters_missing_before_first_draft() -> None:
    stats = diff({}, snapshot(_metrics(4, 8, 2, [2, 0])))
    assert stats.drafts == 4 and stats.accepted_per_pos == [2, 0]
    assert SpecStats().acceptance_rate is None and SpecStats().mean_acceptance_length is None


def test_compare_tokens() -> None:
    rate, first = compare_tokens([[1, 2, 3], [4, 5], [6]], [[1, 2, 3], [4, 9], [6, 7]])
    assert rate == pytest.approx(1 / 3)
    assert first == [None, 1, 1]


def _repeat(bs: int, r: int, tokens: int, seconds: float) -> RepeatMeasurement:
    return RepeatMeasurement(
        batch_size=bs, repeat=r, output_tokens=tokens, elapsed_s=seconds, ttft_s=[0.1, 0.3], tpot_s=[0.01, 0.02]
    )


def test_score_result_weights_levels_and_speedup(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["workload"].update({"batch_sizes": [1, 8], "batch_weights": [3, 1], "repeats": 3})
    study = load_study(write_study(tmp_path, data))
    base = EngineResult(
        engine_start_s=1,
        warmup_s=0,
        repeats=[*(_repeat(1, r, 100, 1.0) for r in range(3)), *(_repeat(8, r, 400, 1.0) for r in range(3))],
    )
    fast = EngineResult(
        engine_start_s=1,
        warmup_s=0,
        repeats=[*(_repeat(1, r, 200, 1.0) for r in range(3)), *(_repeat(8, r, 400, 1.0) for r in range(3))],
        token_ids={1: [[1, 2]], 8: [[1, 3]]},
    )
    base_m = score_result(base, study)
    m = score_result(fast, study, base_m, {1: [[1, 2]], 8: [[1, 2]]})
    assert base_m.tokens_per_s == pytest.approx(0.75 * 100 + 0.25 * 400)
    assert m.level(1).speedup == pytest.approx(2.0) and m.level(8).speedup == pytest.approx(1.0)
    assert m.speedup == pytest.approx((0.75 * 200 + 0.25 * 400) / 175)
    assert m.level(1).lossless_match_rate == 1.0 and m.level(8).lossless_match_rate == 0.0
    assert m.level(1).ttft_median_s == pytest.approx(0.2)
    flat = m.flat()
    assert {"tokens_per_s_bs1", "speedup_bs8", "ttft_p90_s_bs1", "tpot_median_s_bs8"} <= set(flat)


def test_secret_names_are_recognised(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.redaction import is_secret_key, redact

    assert all(is_secret_key(k) for k in ("hf_token", "HF_TOKEN", "api-key", "AWS_SECRET_ACCESS_KEY", "db_password"))
    assert not any(is_secret_key(k) for k in ("max_tokens", "num_speculative_tokens", "max_num_batched_tokens"))
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefghijklmnop")
    assert redact({"hf_token": "x", "log": "token hf_abcdefghijklmnop used", "k": [1]}) == {
        "hf_token": "***",
        "log": "token *** used",
        "k": [1],
    }


def test_yaml_text_secrets_are_masked() -> None:
    from tuner.redaction import redact

    text = "target:\n  engine_args:\n    hf_token: hf_abc\n    max_num_batched_tokens: 512\n"
    assert redact(text) == "target:\n  engine_args:\n    hf_token: ***\n    max_num_batched_tokens: 512\n"
