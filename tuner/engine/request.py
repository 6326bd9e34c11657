"""What crosses the process boundary between the tuner and a trial's engine process."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tuner.engine.vllm_metrics import SpecStats
from tuner.study.config import StudyConfig
from tuner.study.prompts import Prompt


class TrialRequest(BaseModel):
    llm_kwargs: dict[str, Any]
    prompts: list[Prompt]
    max_tokens: int
    temperature: float
    batch_sizes: list[int]
    repeats: int
    warmup_prompts: int
    seed: int = 0

    @classmethod
    def for_study(cls, study: StudyConfig, prompts: list[Prompt], llm_kwargs: dict[str, Any]) -> TrialRequest:
        """The study's workload, measured on an engine built with ``llm_kwargs``."""
        w = study.workload
        return cls(
            llm_kwargs=llm_kwargs,
            prompts=prompts,
            max_tokens=w.max_tokens,
            temperature=w.temperature,
            batch_sizes=w.batch_sizes,
            repeats=w.repeats,
            warmup_prompts=min(w.warmup_prompts, len(prompts)),
            seed=study.target.seed,
        )


class RepeatMeasurement(BaseModel):
    batch_size: int
    repeat: int
    output_tokens: int
    elapsed_s: float
    ttft_s: list[float] = []
    tpot_s: list[float] = []
    spec: SpecStats = SpecStats()

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


class EngineResult(BaseModel):
    """Everything the engine process measured; the tuner derives scores from it."""

    engine_start_s: float
    warmup_s: float
    repeats: list[RepeatMeasurement]
    # batch size -> one list of generated token ids per prompt (first repeat), for the lossless check
    token_ids: dict[int, list[list[int]]] = Field(default_factory=dict)
    vllm_version: str = ""
    torch_version: str = ""
    device: str = ""
    peak_memory_bytes: int | None = None


class ProgressEvent(BaseModel):
    """A line of the engine's progress file, read by the tuner while the engine runs."""

    event: str  # "engine_ready" | "repeat"
    elapsed_s: float
    measurement: RepeatMeasurement | None = None
