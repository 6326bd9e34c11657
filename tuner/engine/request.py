"""What crosses the process boundary between the tuner and a trial's engine process."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from tuner.engine.runner_log import ENGINE_LOG
from tuner.engine.vllm_metrics import SpecStats
from tuner.study.config import ServeConfig, StudyConfig
from tuner.study.prompts import Prompt

# The files an engine process and its parent (tuner.engine.process) exchange in the engine's directory.
REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.jsonl"
LOG_FILE = ENGINE_LOG
SECRET_ARGS_ENV = "SPECDEC_TUNER_SECRET_ARGS"  # credentials for vllm.LLM, passed outside the request file


class TrialRequest(BaseModel):
    llm_kwargs: dict[str, Any]
    prompts: list[Prompt]
    max_tokens: int
    temperature: float
    top_p: float | None = None
    batch_sizes: list[int]  # serve mode: --max-concurrency levels
    repeats: int
    warmup_prompts: int
    seed: int = 0
    mode: Literal["offline", "serve"] = "offline"
    serve: ServeConfig | None = None
    env: dict[str, str] = {}  # target.env: the engine process's environment (a served engine's server inherits it)

    @classmethod
    def for_study(cls, study: StudyConfig, prompts: list[Prompt], llm_kwargs: dict[str, Any]) -> TrialRequest:
        """The study's workload, measured on an engine built with ``llm_kwargs``."""
        w = study.workload
        return cls(
            llm_kwargs=llm_kwargs,
            prompts=prompts,
            max_tokens=w.max_tokens,
            temperature=w.temperature,
            top_p=w.top_p,
            batch_sizes=w.batch_sizes,
            repeats=w.repeats,
            warmup_prompts=min(w.warmup_prompts, len(prompts)),
            seed=study.target.seed,
            mode=w.mode,
            serve=w.serve if w.mode == "serve" else None,
            env=dict(study.target.env),
        )


LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
LATENCY_PERCENTILES = (50, 90, 99)


class ServedWindow(BaseModel):
    """One measured window of a served load (one ``vllm bench serve`` run), as its result file states it."""

    max_concurrency: int | None = None
    request_rate: float | None = None  # requests/s of the open-loop arrivals; None: all requests at once
    completed: int
    failed: int = 0
    duration_s: float
    output_tokens: int
    request_throughput: float
    output_throughput: float
    goodput_rps: float | None = None  # requests/s that met every SLO limit (vLLM's --goodput)
    latency_ms: dict[str, float] = {}  # "ttft_p90", "tpot_p50", "e2el_mean", ...

    def latency(self, metric: str, percentile: int) -> float | None:
        return self.latency_ms.get(f"{metric}_p{percentile}")

    def keeps(self, percentile: int, ttft_ms: float | None, tpot_ms: float | None) -> bool:
        """Whether this window's p``percentile`` TTFT and TPOT are within the limits (None: no limit);
        a limited metric the window did not measure counts as missed."""
        for metric, limit in (("ttft", ttft_ms), ("tpot", tpot_ms)):
            if limit is None:
                continue
            value = self.latency(metric, percentile)
            if value is None or value > limit:
                return False
        return True


class RepeatMeasurement(BaseModel):
    batch_size: int
    repeat: int
    output_tokens: int
    elapsed_s: float
    ttft_s: list[float] = []
    tpot_s: list[float] = []
    spec: SpecStats = SpecStats()
    served: ServedWindow | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


class SloProbe(BaseModel):
    """One request rate tried by the SLO search, and whether the latency limits held at it."""

    rate_rps: float
    held: bool
    window: ServedWindow
    spec: SpecStats = SpecStats()


class SloSearch(BaseModel):
    """The highest request rate at which the SLO held (0.0: not even the lowest rate tried)."""

    percentile: int
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    probes: list[SloProbe] = []
    max_rate_rps: float = 0.0
    truncated: bool = False  # the search's time limit ended it early
    elapsed_s: float = 0.0

    def held_at(self, window: ServedWindow) -> bool:
        """Whether ``window``'s latencies keep every limit at this search's percentile."""
        return window.keeps(self.percentile, self.ttft_ms, self.tpot_ms)


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
    mode: Literal["offline", "serve"] = "offline"
    slo: SloSearch | None = None
    # What the measured engine resolved for the arguments it was not given (tuner.engine.serve_file.RESOLVED_ARGS);
    # empty when this vLLM does not say, and in serve mode, whose server already starts from the exported file.
    resolved_args: dict[str, int] = {}
    # The model runner and CUDA-graph mode the engine ran with, as its log says (tuner.engine.runner_log:
    # model_runner "V1"/"V2", cudagraph_mode "NONE", "FULL_AND_PIECEWISE", ...); a key vLLM did not state is absent.
    runner: dict[str, str] = {}


class ProgressEvent(BaseModel):
    """A line of the engine's progress file, read by the tuner while the engine runs."""

    event: str  # "engine_ready" | "repeat" | "slo_probe"
    elapsed_s: float
    measurement: RepeatMeasurement | None = None
    probe: SloProbe | None = None
