"""Turn an engine's raw repeats into per-level figures, a speedup, and the value Optuna sees."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tuner.measurement import EngineResult, RepeatMeasurement
from tuner.spec_metrics import SpecStats
from tuner.stats import coefficient_of_variation, conservative_score, mad, median, percentile, speedup
from tuner.study_config import StudyConfig


class LevelMetrics(BaseModel):
    batch_size: int
    tokens_per_s: float  # median over repeats
    tokens_per_s_mad: float
    tokens_per_s_cv: float
    score: float  # median - penalty * MAD
    repeats: list[float]
    ttft_median_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_median_s: float | None = None
    tpot_p90_s: float | None = None
    speedup: float | None = None
    lossless_match_rate: float | None = None
    first_divergence: list[int | None] | None = None
    weight: float = 1.0  # share of this batch size in the trial's score (workload.batch_weights)


class TrialMetrics(BaseModel):
    levels: list[LevelMetrics]
    score: float  # weighted over levels: the value Optuna maximises (single objective)
    tokens_per_s: float  # weighted median throughput
    speedup: float | None = None
    spec: SpecStats = SpecStats()
    engine_start_s: float = 0.0
    measured_s: float = 0.0
    warmup_s: float = 0.0
    gpu_memory_bytes: int | None = None

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
        return out


def _opt(values: list[float], fn: Any) -> float | None:
    return fn(values) if values else None


def level_metrics(batch_size: int, repeats: list[RepeatMeasurement], mad_penalty: float) -> LevelMetrics:
    tps = [r.tokens_per_s for r in repeats]
    ttft = [x for r in repeats for x in r.ttft_s]
    tpot = [x for r in repeats for x in r.tpot_s]
    return LevelMetrics(
        batch_size=batch_size,
        tokens_per_s=median(tps),
        tokens_per_s_mad=mad(tps),
        tokens_per_s_cv=coefficient_of_variation(tps),
        score=conservative_score(tps, mad_penalty),
        repeats=tps,
        ttft_median_s=_opt(ttft, median),
        ttft_p90_s=_opt(ttft, lambda v: percentile(v, 90)),
        tpot_median_s=_opt(tpot, median),
        tpot_p90_s=_opt(tpot, lambda v: percentile(v, 90)),
    )


def score_result(
    result: EngineResult,
    study: StudyConfig,
    baseline: TrialMetrics | None = None,
    baseline_tokens: dict[int, list[list[int]]] | None = None,
) -> TrialMetrics:
    levels = []
    spec = SpecStats()
    for batch_size in study.workload.batch_sizes:
        reps = [r for r in result.repeats if r.batch_size == batch_size]
        if not reps:
            continue
        lv = level_metrics(batch_size, reps, study.scoring.mad_penalty)
        for r in reps:
            spec = spec + r.spec
        if baseline is not None:
            base = baseline.level(batch_size)
            lv.speedup = speedup(lv.tokens_per_s, base.tokens_per_s) if base else None
        if baseline_tokens and batch_size in baseline_tokens and batch_size in result.token_ids:
            lv.lossless_match_rate, lv.first_divergence = compare_tokens(
                baseline_tokens[batch_size], result.token_ids[batch_size]
            )
        levels.append(lv)
    weights = dict(zip(study.workload.batch_sizes, study.workload.weights(), strict=True))
    total_w = sum(weights[lv.batch_size] for lv in levels) or 1.0
    for lv in levels:
        lv.weight = weights[lv.batch_size] / total_w
    score = sum(weights[lv.batch_size] * lv.score for lv in levels) / total_w
    tps = sum(weights[lv.batch_size] * lv.tokens_per_s for lv in levels) / total_w
    metrics = TrialMetrics(
        levels=levels,
        score=score,
        tokens_per_s=tps,
        spec=spec,
        engine_start_s=result.engine_start_s,
        measured_s=sum(r.elapsed_s for r in result.repeats),
        warmup_s=result.warmup_s,
        gpu_memory_bytes=result.peak_memory_bytes,
    )
    if baseline is not None:
        metrics.speedup = speedup(metrics.tokens_per_s, baseline.tokens_per_s)
    return metrics


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
