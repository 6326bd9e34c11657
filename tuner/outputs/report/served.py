"""How a study was measured (offline batches or a served load, and the sampling), and in serve mode the
finalists' latency per concurrency level and each trial's highest request rate keeping the SLO."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.outputs.report.model import ServedLevelRow, SloSummary, SloTrialRow, rows_mode

if TYPE_CHECKING:
    from tuner.outputs.report.model import TrialRow
    from tuner.study.config import StudyConfig, WorkloadConfig


def workload_mode(config: StudyConfig | None, rows: Sequence[TrialRow]) -> str:
    return config.workload.mode if config is not None else rows_mode(rows)


def measurement_lines(config: StudyConfig | None, mode: str, slo: SloSummary | None) -> list[str]:
    """Plain sentences: what ran each trial, the levels, the sampling, and the SLO and its search."""
    if config is None:
        what = (
            "served load (vllm serve + vllm bench serve)" if mode == "serve" else "offline batches (vllm.LLM.generate)"
        )
        return [f"Measured as {what}; the study file is not stored with the study, so the sampling is not known here."]
    w = config.workload
    levels = ", ".join(str(b) for b in w.batch_sizes)
    if mode == "serve":
        per = (
            f"{w.serve.requests_per_level} requests"
            if w.serve.requests_per_level
            else "as many requests as prompts, and at least twice the concurrency,"
        )
        lines = [
            "Served load: each trial starts a real `vllm serve` (from the same config file `tuner export` writes) "
            f"and loads it with `vllm bench serve`, all requests at once but at most --max-concurrency in flight; "
            f"levels are max concurrency {levels}, each measured {w.repeats}× ({per} per window)."
        ]
    else:
        lines = [
            f"Offline batches: each trial builds a `vllm.LLM` and times `LLM.generate` on batches of {levels} "
            f"prompts (levels are batch sizes), each measured {w.repeats}×."
        ]
    lines.append(f"Sampling: {sampling(w)}.")
    if slo is not None:
        lines.append(slo_sentence(config, slo))
    return lines


def sampling(w: WorkloadConfig) -> str:
    """``temperature 0.0, top_p vLLM default 1.0 (not sent), max_tokens 24``."""
    if w.top_p is not None:
        top_p = f"top_p {w.top_p:g}"
    elif w.mode == "serve":
        # Not sent: the server applies the model's generation_config.json if it sets top_p.
        top_p = "top_p vLLM default 1.0 (not sent; a top_p in the model's generation_config.json would apply)"
    else:
        top_p = "top_p vLLM default 1.0"
    greedy = " (greedy)" if w.temperature == 0 else ""
    return f"temperature {w.temperature:g}{greedy}, {top_p}, max_tokens {w.max_tokens} output tokens per request"


def slo_sentence(config: StudyConfig | None, slo: SloSummary) -> str:
    text = f"SLO: {slo.limits()} over each window's requests; objective {slo.objective}: "
    if slo.objective == "goodput":
        text += "the highest request rate keeping the SLO, over the best baseline's (throughput only breaks ties)"
    else:
        text += "output tokens/s per concurrency level, weighted (the SLO rate is reported, not optimised)"
    if config is not None:
        r = config.workload.serve.rate_search
        arrivals = "Poisson" if r.burstiness == 1.0 else f"gamma (burstiness {r.burstiness:g})"
        text += (
            f". Rate search: {arrivals} arrivals from {r.start_rps:g} requests/s, doubling up to {r.max_rps:g}, "
            f"then {r.bisect_steps} bisection steps, at most {r.time_limit_s:g} s per trial"
        )
    return text + "."


def slo_summary(rows: Sequence[TrialRow], config: StudyConfig | None) -> SloSummary | None:
    """Every completed trial's rate search, or None when no SLO was set (and none ran)."""
    done = [r for r in rows if r.metrics is not None and r.metrics.slo is not None]
    serve = config.workload.serve if config is not None and config.workload.mode == "serve" else None
    limits = serve.slo if serve is not None else None
    first = done[0].metrics.slo if done and done[0].metrics else None
    if limits is None and first is None:
        return None
    trials = []
    for r in done:
        assert r.metrics is not None and r.metrics.slo is not None
        s = r.metrics.slo
        trials.append(
            SloTrialRow(
                row=r,
                max_rate_rps=s.max_rate_rps,
                rate_speedup=r.metrics.slo_rate_speedup,
                probes=[(p.rate_rps, p.held) for p in s.probes],
                truncated=s.truncated,
                elapsed_s=s.elapsed_s,
            )
        )
    base_rates = [t.max_rate_rps for t in trials if t.row.spec is not None and t.row.spec.is_baseline]
    source = limits or first
    assert source is not None
    objective = serve.objective if serve is not None else next(r.metrics.objective for r in done if r.metrics)
    return SloSummary(
        percentile=source.percentile,
        ttft_ms=source.ttft_ms,
        tpot_ms=source.tpot_ms,
        objective=objective,
        baseline_rate_rps=max(base_rates) if base_rates else None,
        trials=trials,
    )


def served_levels(finalists: Sequence[tuple[str, TrialRow]]) -> list[ServedLevelRow]:
    """Per level, each finalist's served latencies, throughput and acceptance (serve mode only)."""
    out = []
    levels = sorted({lv.batch_size for _, r in finalists if r.metrics for lv in r.metrics.levels})
    for level in levels:
        for role, r in finalists:
            lv = r.metrics.level(level) if r.metrics is not None else None
            if lv is None or not lv.latency_ms:
                continue
            out.append(
                ServedLevelRow(
                    level=level,
                    role=role,
                    row=r,
                    latency_ms=lv.latency_ms,
                    request_throughput=lv.request_throughput,
                    tokens_per_s=lv.tokens_per_s,
                    acceptance_rate=lv.spec.acceptance_rate,
                    mean_acceptance_length=lv.spec.mean_acceptance_length,
                    slo_held=lv.slo_held,
                )
            )
    return out
