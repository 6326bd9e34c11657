"""Serve mode's pieces without a server: the rate search, the client's result, /metrics, goodput scoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tuner.engine.load import window_from_result, write_dataset
from tuner.engine.rate_search import search_rate
from tuner.engine.request import ServedWindow, SloSearch
from tuner.engine.vllm_metrics import DRAFTS, PER_POS, snapshot_from_prometheus
from tuner.results.scoring import SLO_RATE_LEVEL, LevelMetrics, TrialMetrics, apply_reference, reference_levels
from tuner.study.config import RateSearchConfig, WorkloadConfig


def _search(capacity: float, **cfg: Any) -> tuple[float, list[tuple[float, bool]], bool]:
    out = search_rate(lambda rate: rate <= capacity, RateSearchConfig(**cfg))
    return out.max_rate_rps, out.probed, out.truncated


def test_the_ramp_doubles_then_bisects() -> None:
    rate, probed, truncated = _search(5.0, start_rps=1, max_rps=64, bisect_steps=2)
    assert [r for r, _ in probed] == [1, 2, 4, 8, 6, 5]
    assert rate == 5.0 and not truncated


def test_the_ramp_stops_at_max_rps() -> None:
    rate, probed, _ = _search(100.0, start_rps=1, max_rps=6, bisect_steps=3)
    assert [r for r, _ in probed] == [1, 2, 4, 6] and rate == 6.0


def test_a_slo_missed_at_the_first_rate_bisects_below_it() -> None:
    rate, probed, _ = _search(0.3, start_rps=1, max_rps=8, bisect_steps=2)
    assert [r for r, _ in probed] == [1, 0.5, 0.25] and rate == 0.25
    assert _search(0.0, start_rps=1, bisect_steps=1)[0] == 0.0


def test_the_time_limit_keeps_the_best_rate_so_far() -> None:
    ticks = iter(range(100))
    out = search_rate(
        lambda r: True, RateSearchConfig(start_rps=1, max_rps=64, time_limit_s=1.5), clock=lambda: next(ticks)
    )
    assert out.truncated and out.max_rate_rps == 2.0 and len(out.probed) == 2


RESULT = {
    "request_rate": "inf",
    "max_concurrency": 4,
    "duration": 2.0,
    "completed": 8,
    "failed": 0,
    "total_output_tokens": 128,
    "request_throughput": 4.0,
    "output_throughput": 64.0,
    "request_goodput": 3.5,
    "mean_ttft_ms": 100.0,
    "median_ttft_ms": 90.0,
    "p50_ttft_ms": 90.0,
    "p90_ttft_ms": 150.0,
    "p99_ttft_ms": 200.0,
    "p90_tpot_ms": 40.0,
    "p99_e2el_ms": 900.0,
    "errors": ["", ""],
}


def test_the_clients_result_becomes_a_window() -> None:
    w = window_from_result(RESULT)
    assert w.request_rate is None and w.max_concurrency == 4 and w.output_tokens == 128
    assert w.latency("ttft", 90) == 150.0 and w.latency_ms["ttft_mean"] == 100.0 and w.latency("e2el", 99) == 900.0
    assert window_from_result({**RESULT, "request_rate": 2.5}).request_rate == 2.5


def test_slo_held_at_the_percentile_of_the_study() -> None:
    w = window_from_result(RESULT)
    assert SloSearch(percentile=90, ttft_ms=150, tpot_ms=40).held_at(w)
    assert not SloSearch(percentile=90, ttft_ms=149).held_at(w)
    assert not SloSearch(percentile=99, tpot_ms=40).held_at(w)  # no p99 TPOT measured: not held


def test_dataset_cycles_prompts_in_order(tmp_path: Any) -> None:
    path = tmp_path / "d.jsonl"
    write_dataset(path, ["a", "b"], 5)
    assert [line.split('"')[3] for line in path.read_text().splitlines()] == ["a", "b", "a", "b", "a"]


class _Client:
    """BenchClient's side that ServeBackend reads: one window, and the texts it returned."""

    def __init__(self, texts: list[str]) -> None:
        self.last_texts = texts

    def run(self, n_requests: int, concurrency: int | None = None, **_: Any) -> ServedWindow:
        return window_from_result({**RESULT, "max_concurrency": concurrency, "completed": n_requests})


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        assert not add_special_tokens
        return [ord(c) for c in text]


def test_served_levels_carry_each_prompts_first_output_for_the_lossless_check(tmp_path: Any) -> None:
    """The first repeat's texts of the first request of each prompt (the dataset cycles the prompts in
    order), encoded without special tokens; later requests and repeats are not compared."""
    from tuner.engine.served import ServeBackend
    from tuner.results.scoring import compare_tokens
    from tuner.study.config import ServeConfig

    backend = ServeBackend(ServeConfig(), tmp_path)
    backend.client = _Client(["ab", "cd", "ab-again"])  # type: ignore[assignment]
    backend._tokenizer, backend._n_prompts = _Tokenizer(), 2
    backend.spec_counters = lambda: snapshot_from_prometheus("")  # type: ignore[method-assign]
    level = backend.measure(4, repeats=2)
    assert level.token_ids == [[97, 98], [99, 100]] and len(level.repeats) == 2
    assert compare_tokens(level.token_ids, [[97, 98], [99, 101]]) == (0.5, [None, 1])
    backend.client = _Client(["ab"])  # type: ignore[assignment]
    assert backend.measure(1, repeats=1).token_ids is None  # fewer outputs than prompts: nothing to compare


def test_the_client_keeps_the_windows_output_texts(tmp_path: Path) -> None:
    """`--save-detailed` makes `vllm bench serve` return each request's text (0.26 and 0.32 alike)."""
    from tuner.engine.load import BenchClient

    client = BenchClient("127.0.0.1", 1, "k", "m", tmp_path, ["p"], 8, 0.0, 1.0)
    assert "--save-detailed" in client.argv(Path("d.jsonl"), 1, 1, None, 1.0)
    client._bench = lambda argv: {**RESULT, "generated_texts": ["x", "y"]}  # type: ignore[method-assign]
    client.run(2, concurrency=2)
    assert client.last_texts == ["x", "y"]


METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 37.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
"""


def test_prometheus_counters_match_get_metrics_names() -> None:
    snap = snapshot_from_prometheus(METRICS)
    assert snap[DRAFTS] == 40  # engines summed, _created ignored
    assert snap[PER_POS] == [9, 4]
    assert "vllm:generation_tokens" not in snap


def _goodput(rate: float, tokens_per_s: float) -> TrialMetrics:
    level = LevelMetrics(
        batch_size=1,
        tokens_per_s=tokens_per_s,
        tokens_per_s_mad=0.0,
        tokens_per_s_cv=0.0,
        score=tokens_per_s,
        repeats=[],
    )
    return TrialMetrics(
        levels=[level],
        score=0.0,
        tokens_per_s=tokens_per_s,
        objective="goodput",
        slo=SloSearch(percentile=90, ttft_ms=100, max_rate_rps=rate),
    )


def test_goodput_ranks_by_rate_then_throughput() -> None:
    reference = reference_levels([_goodput(2.0, 100.0)])
    assert reference == {1: 100.0, SLO_RATE_LEVEL: 2.0}
    faster_rate = apply_reference(_goodput(3.0, 90.0), reference)
    same_rate_faster = apply_reference(_goodput(2.0, 120.0), reference)
    same_rate_slower = apply_reference(_goodput(2.0, 80.0), reference)
    assert faster_rate.slo_rate_speedup == 1.5 and same_rate_faster.slo_rate_speedup == 1.0
    # the rate decides, even against 30% more throughput; at one rate, throughput breaks the tie
    assert faster_rate.score > same_rate_faster.score > same_rate_slower.score


def test_a_goodput_trial_scored_before_any_baseline_is_rescored_in_the_baselines_units() -> None:
    early = apply_reference(_goodput(3.0, 90.0), {})  # no baseline yet: its value is a raw rate
    reference = reference_levels([_goodput(2.0, 100.0)])
    late = apply_reference(early, reference)  # what store.scored_metrics and the sampler see once it exists
    assert early.slo_rate_speedup is None and late.slo_rate_speedup == 1.5
    assert late.score == apply_reference(_goodput(3.0, 90.0), reference).score != early.score


def test_serve_settings_need_serve_mode() -> None:
    with pytest.raises(ValidationError, match="serve mode only"):
        WorkloadConfig(prompts="p.jsonl", serve={"objective": "throughput"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="goodput needs latency limits"):
        WorkloadConfig(prompts="p.jsonl", mode="serve", serve={"objective": "goodput"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="no longer offered"):
        WorkloadConfig(prompts="p.jsonl", combine="pareto")  # type: ignore[arg-type]


def test_served_window_round_trips() -> None:
    w = window_from_result(RESULT)
    assert ServedWindow.model_validate_json(w.model_dump_json()) == w
