"""Turn an engine's raw repeats into per-level figures, a speedup, and the value Optuna sees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from tuner.engine.request import EngineResult, RepeatMeasurement, SloSearch
from tuner.engine.vllm_metrics import SpecStats
from tuner.results.stats import coefficient_of_variation, conservative_score, mad, median, percentile, speedup
from tuner.study.config import SloConfig, StudyConfig

# The reference of the SLO rate search (the best baseline's highest rate), kept among the per-level
# references under a key no batch size or concurrency can take.
SLO_RATE_LEVEL = 0
# Goodput objective: the rate ratio decides; throughput only breaks ties between equal rates (the
# rate search probes the same rates for the same outcomes, so equal rates are exactly equal).
TIE_BREAK = 1e-4


def level_name(mode: str) -> str:
    """What a workload level is called: a batch size offline, a --max-concurrency level served."""
    return "concurrency" if mode == "serve" else "batch"


class LevelMetrics(BaseModel):
    batch_size: int
    tokens_per_s: float  # median over repeats
    tokens_per_s_mad: float
    tokens_per_s_cv: float
    score: float  # median - penalty * MAD, in output tokens/s
    repeats: list[float]
    repeat_s: list[float] = []  # elapsed seconds of each repeat (estimates the time pruning saves)
    ttft_median_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_median_s: float | None = None
    tpot_p90_s: float | None = None
    speedup: float | None = None  # median over the reference median at this batch size
    lossless_match_rate: float | None = None
    first_divergence: list[int | None] | None = None
    weight: float = 1.0  # share of this batch size in the trial's score (workload.batch_weights)
    # serve mode: each latency key ("ttft_p90", "tpot_p50", ...) in ms and request throughput, median over repeats
    latency_ms: dict[str, float] = {}
    request_throughput: float | None = None
    slo_held: bool | None = None  # every repeat kept the study's SLO at this concurrency (None: no SLO)
    spec: SpecStats = SpecStats()  # this level's speculative counters, summed over its repeats


class TrialMetrics(BaseModel):
    levels: list[LevelMetrics]
    # The value Optuna maximises (single objective): sum over levels of
    # weight * (median - penalty * MAD) / reference median at that level; see ``apply_reference``.
    score: float
    tokens_per_s: float  # weighted median throughput (a figure to read, not what is optimised)
    speedup: float | None = None  # weighted mean of the levels' speedups
    spec: SpecStats = SpecStats()
    engine_start_s: float = 0.0
    measured_s: float = 0.0
    warmup_s: float = 0.0
    gpu_memory_bytes: int | None = None
    mode: str = "offline"  # offline batches, or served ("serve": levels are --max-concurrency)
    objective: str = "throughput"  # "goodput": the score is the SLO rate over the baseline's (see apply_reference)
    throughput_score: float | None = None  # the weighted throughput score (the score itself unless goodput)
    slo: SloSearch | None = None
    slo_rate_speedup: float | None = None  # highest rate keeping the SLO over the best baseline's
    # What every request was sent with: temperature, top_p (None: vLLM's default, 1.0), max_tokens.
    sampling: dict[str, float | int | None] = {}

    def level(self, batch_size: int) -> LevelMetrics | None:
        return next((lv for lv in self.levels if lv.batch_size == batch_size), None)

    def flat(self) -> dict[str, float]:
        """Scalar metrics for MLflow; per-level figures get a ``_bs{N}`` suffix."""
        out: dict[str, float] = {
            "tokens_per_s": self.tokens_per_s,
            "score": self.score,
            "engine_start_s": self.engine_start_s,
            "measured_s": self.measured_s,
            "warmup_s": self.warmup_s,
        }
        if self.gpu_memory_bytes is not None:
            out["gpu_memory_gib"] = self.gpu_memory_bytes / 2**30
        if self.speedup is not None:
            out["speedup"] = self.speedup
        if self.slo is not None:
            out["slo_max_rate_rps"] = self.slo.max_rate_rps
            out["slo_search_s"] = self.slo.elapsed_s
        if self.slo_rate_speedup is not None:
            out["slo_rate_speedup"] = self.slo_rate_speedup
        for name, value in (
            ("acceptance_rate", self.spec.acceptance_rate),
            ("mean_acceptance_length", self.spec.mean_acceptance_length),
        ):
            if value is not None:
                out[name] = value
        if self.spec.drafts:
            out["num_drafts"] = self.spec.drafts
            out["num_draft_tokens"] = self.spec.draft_tokens
            out["num_accepted_tokens"] = self.spec.accepted_tokens
        for lv in self.levels:
            sfx = f"_bs{lv.batch_size}"
            for key in (
                "tokens_per_s",
                "tokens_per_s_mad",
                "tokens_per_s_cv",
                "ttft_median_s",
                "ttft_p90_s",
                "tpot_median_s",
                "tpot_p90_s",
                "speedup",
                "lossless_match_rate",
            ):
                value = getattr(lv, key)
                if value is not None:
                    out[key + sfx] = float(value)
            if lv.request_throughput is not None:
                out["request_throughput" + sfx] = lv.request_throughput
            if lv.slo_held is not None:
                out["slo_held" + sfx] = float(lv.slo_held)
            if lv.spec.acceptance_rate is not None:
                out["acceptance_rate" + sfx] = lv.spec.acceptance_rate
                out["mean_acceptance_length" + sfx] = lv.spec.mean_acceptance_length or 0.0
            for name, value in lv.latency_ms.items():
                out[f"{name}_ms{sfx}"] = value
        return out


def _opt(values: list[float], fn: Any) -> float | None:
    return fn(values) if values else None


def level_metrics(
    batch_size: int, repeats: list[RepeatMeasurement], mad_penalty: float, slo: SloConfig | None = None
) -> LevelMetrics:
    tps = [r.tokens_per_s for r in repeats]
    ttft = [x for r in repeats for x in r.ttft_s]
    tpot = [x for r in repeats for x in r.tpot_s]
    windows = [r.served for r in repeats if r.served is not None]
    latency: dict[str, float] = {}
    for key in sorted({k for w in windows for k in w.latency_ms}):
        latency[key] = median([w.latency_ms[key] for w in windows if key in w.latency_ms])
    spec = SpecStats()
    for r in repeats:
        spec = spec + r.spec
    held = None
    if slo is not None and windows:
        held = all(w.keeps(slo.percentile, slo.ttft_ms, slo.tpot_ms) for w in windows)
    return LevelMetrics(
        batch_size=batch_size,
        tokens_per_s=median(tps),
        tokens_per_s_mad=mad(tps),
        tokens_per_s_cv=coefficient_of_variation(tps),
        score=conservative_score(tps, mad_penalty),
        repeats=tps,
        repeat_s=[r.elapsed_s for r in repeats],
        ttft_median_s=_opt(ttft, median),
        ttft_p90_s=_opt(ttft, lambda v: percentile(v, 90)),
        tpot_median_s=_opt(tpot, median),
        tpot_p90_s=_opt(tpot, lambda v: percentile(v, 90)),
        latency_ms=latency,
        spec=spec,
        request_throughput=median([w.request_throughput for w in windows]) if windows else None,
        slo_held=held,
    )


def reference_levels(baselines: Iterable[TrialMetrics]) -> dict[int, float]:
    """Per batch size, the fastest no-speculation median: the reference every speedup is against.

    With several baselines (eager and compiled) each level takes the best one at that level; the
    highest SLO rate of any baseline is kept under ``SLO_RATE_LEVEL``.
    """
    reference: dict[int, float] = {}
    for metrics in baselines:
        for lv in metrics.levels:
            if lv.tokens_per_s > reference.get(lv.batch_size, 0.0):
                reference[lv.batch_size] = lv.tokens_per_s
        if metrics.slo is not None and metrics.slo.max_rate_rps >= reference.get(SLO_RATE_LEVEL, 0.0):
            reference[SLO_RATE_LEVEL] = metrics.slo.max_rate_rps
    return reference


def apply_reference(metrics: TrialMetrics, reference: Mapping[int, float]) -> TrialMetrics:
    """Score a trial against per-level reference medians; returns a copy.

    score = sum over levels of weight * (median - penalty * MAD) / reference median,
    speedup = sum over levels of weight * median / reference median.
    Each level counts by its speedup, so ``batch_weights`` weigh what the study file says, not raw
    tokens/s (where the largest batch would dominate). A level with no reference yet (no baseline
    measured it) is scored against its own median and has no speedup.
    """
    out = metrics.model_copy(deep=True)
    score = 0.0
    speed = 0.0
    known = True
    for lv in out.levels:
        ref = reference.get(lv.batch_size, 0.0)
        lv.speedup = speedup(lv.tokens_per_s, ref) if ref > 0 else None
        if lv.speedup is None:
            known = False
            ref = lv.tokens_per_s
        score += lv.weight * (lv.score / ref if ref > 0 else 0.0)
        speed += lv.weight * (lv.speedup or 0.0)
    out.score = out.throughput_score = score
    out.speedup = speed if known and out.levels else None
    if out.slo is not None:
        ref_rate = reference.get(SLO_RATE_LEVEL)
        rate = out.slo.max_rate_rps
        out.slo_rate_speedup = rate / ref_rate if ref_rate else None
        if out.objective == "goodput":
            # No baseline rate yet, or the baseline kept the SLO at no rate tried: the rate itself ranks.
            primary = out.slo_rate_speedup if out.slo_rate_speedup is not None else rate
            out.score = primary + TIE_BREAK * score
    return out


def score_result(
    result: EngineResult,
    study: StudyConfig,
    baseline: TrialMetrics | None = None,
    baseline_tokens: dict[int, list[list[int]]] | None = None,
    reference: Mapping[int, float] | None = None,
) -> TrialMetrics:
    """Per-level figures and the trial's score against ``reference`` (or ``baseline``'s levels).

    With neither, each level is its own reference: the score then only says how steady the trial was.
    """
    levels = []
    spec = SpecStats()
    serve = study.workload.serve if study.workload.mode == "serve" else None
    for batch_size in study.workload.batch_sizes:
        reps = [r for r in result.repeats if r.batch_size == batch_size]
        if not reps:
            continue
        lv = level_metrics(batch_size, reps, study.scoring.mad_penalty, serve.slo if serve else None)
        for r in reps:
            spec = spec + r.spec
        if baseline_tokens and batch_size in baseline_tokens and batch_size in result.token_ids:
            lv.lossless_match_rate, lv.first_divergence = compare_tokens(
                baseline_tokens[batch_size], result.token_ids[batch_size]
            )
        levels.append(lv)
    weights = dict(zip(study.workload.batch_sizes, study.workload.weights(), strict=True))
    total_w = sum(weights[lv.batch_size] for lv in levels) or 1.0
    for lv in levels:
        lv.weight = weights[lv.batch_size] / total_w
    metrics = TrialMetrics(
        levels=levels,
        score=0.0,
        tokens_per_s=sum(lv.weight * lv.tokens_per_s for lv in levels),
        spec=spec,
        engine_start_s=result.engine_start_s,
        measured_s=sum(r.elapsed_s for r in result.repeats),
        warmup_s=result.warmup_s,
        gpu_memory_bytes=result.peak_memory_bytes,
        mode=result.mode,
        objective=serve.objective if serve else "throughput",
        sampling={
            "temperature": study.workload.temperature,
            "top_p": study.workload.top_p,
            "max_tokens": study.workload.max_tokens,
        },
        slo=result.slo,
    )
    if reference is None:
        reference = reference_levels([baseline]) if baseline is not None else {}
    return apply_reference(metrics, reference)


def compare_tokens(reference: list[list[int]], candidate: list[list[int]]) -> tuple[float, list[int | None]]:
    """Share of prompts whose tokens match exactly, and each prompt's first differing position."""
    divergence: list[int | None] = []
    for ref, cand in zip(reference, candidate, strict=False):
        pos = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), None)
        if pos is None and len(ref) != len(cand):
            pos = min(len(ref), len(cand))
        divergence.append(pos)
    matches = sum(1 for d in divergence if d is None)
    return (matches / len(divergence) if divergence else 1.0), divergence
