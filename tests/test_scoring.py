"""Arithmetic: statistics, speedup, spec-decode counters, lossless comparison."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.conftest import study_dict, write_study
from tuner.engine.request import EngineResult, RepeatMeasurement
from tuner.engine.vllm_metrics import SpecStats, diff, snapshot
from tuner.results.scoring import TrialMetrics, apply_reference, compare_tokens, reference_levels, score_result
from tuner.results.stats import coefficient_of_variation, conservative_score, mad, median, percentile, speedup
from tuner.study.config import StudyConfig
from tuner.study.loader import load_study


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
    assert m.speedup == pytest.approx(0.75 * 2.0 + 0.25 * 1.0)  # weights apply to each level's speedup
    assert m.level(1).lossless_match_rate == 1.0 and m.level(8).lossless_match_rate == 0.0
    assert m.level(1).ttft_median_s == pytest.approx(0.2)
    flat = m.flat()
    assert {"tokens_per_s_bs1", "speedup_bs8", "ttft_p90_s_bs1", "tpot_median_s_bs8"} <= set(flat)


def _result(tokens_per_s: dict[int, list[float]]) -> EngineResult:
    repeats = [
        _repeat(bs, r, int(tps * 10), 10.0) for bs, values in tokens_per_s.items() for r, tps in enumerate(values)
    ]
    return EngineResult(engine_start_s=1, warmup_s=0, repeats=repeats)


def _weighted_study(tmp_path: Path, penalty: float = 1.0) -> StudyConfig:
    data = study_dict(tmp_path)
    data["workload"].update({"batch_sizes": [1, 8], "batch_weights": [3, 1], "repeats": 3})
    data["scoring"] = {"mad_penalty": penalty}
    return load_study(write_study(tmp_path, data))


def test_batch_weights_apply_to_each_levels_speedup(tmp_path: Path) -> None:
    study = _weighted_study(tmp_path)
    base = score_result(_result({1: [100, 100, 100], 8: [400, 400, 400]}), study)
    m = score_result(_result({1: [200, 200, 200], 8: [200, 200, 200]}), study, base)
    # 2x at batch 1 and 0.5x at batch 8, weighted 3:1; raw tokens/s would give batch 8 half the score
    assert m.score == pytest.approx(0.75 * 2.0 + 0.25 * 0.5)
    assert m.speedup == pytest.approx(0.75 * 2.0 + 0.25 * 0.5)
    assert apply_reference(base, reference_levels([base])).score == pytest.approx(1.0)


def test_mad_penalty_is_kept_per_level(tmp_path: Path) -> None:
    study = _weighted_study(tmp_path)
    reference = {1: 100.0, 8: 400.0}
    m = score_result(_result({1: [90, 100, 110], 8: [400, 400, 400]}), study, reference=reference)
    assert m.level(1).score == pytest.approx(90.0)  # median 100 - 1 x MAD 10
    assert m.score == pytest.approx(0.75 * 0.9 + 0.25 * 1.0)
    assert m.speedup == pytest.approx(1.0)


def test_two_baselines_the_best_one_per_level_is_the_reference(tmp_path: Path) -> None:
    study = _weighted_study(tmp_path)
    eager = score_result(_result({1: [100, 100, 100], 8: [500, 500, 500]}), study)
    compiled = score_result(_result({1: [125, 125, 125], 8: [400, 400, 400]}), study)
    reference = reference_levels([eager, compiled])
    assert reference == {1: 125.0, 8: 500.0}
    spec = score_result(_result({1: [250, 250, 250], 8: [250, 250, 250]}), study, reference=reference)
    assert spec.level(1).speedup == pytest.approx(2.0) and spec.level(8).speedup == pytest.approx(0.5)
    assert apply_reference(compiled, reference).score == pytest.approx(0.75 * 1.0 + 0.25 * 0.8)
    assert apply_reference(eager, reference).score == pytest.approx(0.75 * 0.8 + 0.25 * 1.0)


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


def _stored(study: StudyConfig, spec: dict, metrics: object) -> optuna.trial.FrozenTrial:
    from optuna.distributions import IntDistribution

    from tuner.results import store

    assert isinstance(metrics, TrialMetrics)
    return optuna.trial.create_trial(
        params={"x": 1},
        distributions={"x": IntDistribution(1, 2)},
        value=metrics.score,
        user_attrs={store.SPEC: spec, store.METRICS: metrics.model_dump(mode="json"), store.LLM_KWARGS: {"model": "m"}},
    )


def test_selection_rescores_against_the_final_reference(tmp_path: Path) -> None:
    """A baseline scored before a faster one was measured keeps a stale stored score; selection must not use it."""
    from tuner.results import outcome, store

    study = _weighted_study(tmp_path)
    eager = score_result(_result({1: [100, 100, 100], 8: [400, 400, 400]}), study)  # first: its own reference
    compiled = score_result(_result({1: [120, 120, 120], 8: [440, 440, 440]}), study, reference={1: 120, 8: 440})
    ngram = score_result(_result({1: [114, 114, 114], 8: [330, 330, 330]}), study, reference={1: 120, 8: 440})
    assert eager.score == pytest.approx(1.0) and compiled.score == pytest.approx(1.0)  # as stored at the time
    none = {"candidate": "none", "method": "none"}
    optuna_study = optuna.create_study(direction="maximize")
    optuna_study.add_trial(_stored(study, {**none, "enforce_eager": True}, eager))
    optuna_study.add_trial(_stored(study, {**none, "enforce_eager": False}, compiled))
    optuna_study.add_trial(
        _stored(study, {"candidate": "ngram", "method": "ngram", "num_speculative_tokens": 3}, ngram)
    )
    assert store.reference(optuna_study) == {1: 120.0, 8: 440.0}
    best_base = store.best_baseline(optuna_study)
    assert best_base is not None and best_base.number == 1
    rescored = store.scored_metrics(optuna_study, optuna_study.trials[0])
    assert rescored is not None and rescored.score == pytest.approx(0.75 * 100 / 120 + 0.25 * 400 / 440)
    out = outcome.decide(optuna_study)
    assert (out.chosen, out.baseline, out.paid) == (1, 1, False)  # 0.75*0.95+0.25*0.75 < 1


def test_a_trial_record_reads_the_same_as_the_loose_attributes_of_an_older_study(tmp_path: Path) -> None:
    import json

    from optuna.distributions import IntDistribution

    from tuner.results import record, store
    from tuner.results.record import TrialRecord

    metrics = score_result(_result({1: [100, 100, 100], 8: [400, 400, 400]}), _weighted_study(tmp_path))
    spec = {"candidate": "none", "method": "none", "enforce_eager": True}
    tokens = {1: [[1, 2, 3]]}
    new = TrialRecord.model_validate(
        {"spec": spec, "metrics": metrics, "mlflow_run_id": "r1", "engine": {"vllm": "0.32"}, "token_ids": tokens}
    )
    older = {
        store.SPEC: spec,
        store.METRICS: metrics.model_dump(mode="json"),
        store.MLFLOW_RUN: "r1",
        store.ENGINE: {"vllm": "0.32"},
        store.TOKENS: json.dumps({str(k): v for k, v in tokens.items()}),
    }
    dist = {"x": IntDistribution(1, 2)}
    trials = [
        optuna.trial.create_trial(params={"x": 1}, distributions=dist, value=1.0, user_attrs=attrs)
        for attrs in ({record.RECORD: new.model_dump(mode="json", exclude_none=True)}, older)
    ]
    assert store.trial_record(trials[0]) == store.trial_record(trials[1]) == new
    for t in trials:
        assert store.trial_spec(t) == new.spec and store.trial_metrics(t) == metrics
        assert store.baseline_tokens(t) == tokens and store.is_counted(t)


def test_report_and_export_agree_on_the_weighted_speedup_and_say_what_acceptance_length_is(tmp_path: Path) -> None:
    from tuner.outputs.export import render_export
    from tuner.outputs.report import build_report

    study = _weighted_study(tmp_path)
    base = score_result(_result({1: [100, 100, 100], 8: [400, 400, 400]}), study)
    fast = _result({1: [200, 200, 200], 8: [200, 200, 200]})
    for r in fast.repeats:
        r.spec = SpecStats(drafts=10, draft_tokens=30, accepted_tokens=15, accepted_per_pos=[8, 5, 2])
    ngram = score_result(fast, study, base)
    optuna_study = optuna.create_study(direction="maximize")
    optuna_study.add_trial(_stored(study, {"candidate": "none", "method": "none"}, base))
    ngram_spec = {"candidate": "ngram", "method": "ngram", "num_speculative_tokens": 3}
    optuna_study.add_trial(_stored(study, ngram_spec, ngram))
    report = build_report(optuna_study, study)
    assert report.paid and report.chosen is not None and report.chosen.number == 1
    assert report.chosen.speedup == pytest.approx(0.75 * 2.0 + 0.25 * 0.5)
    assert [(lv.baseline_tokens_per_s, lv.speedup) for lv in report.levels] == [(100.0, 2.0), (400.0, 0.5)]
    why = " ".join(report.why)
    assert "verification step that had a draft" in why and "forward pass" not in why
    text = render_export(optuna_study)
    assert "speedup over no speculation: 1.62x" in text and "tokens per drafted verification step" in text
