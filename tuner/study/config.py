"""The study file (``studies/*.yaml``): what to tune, on what, and where results go."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from tuner.study.methods import Method, check_candidate, check_extra, rules

# vLLM accepts larger values, but no deployment gains past this; a typo like 64 is caught here.
MAX_SPECULATIVE_TOKENS = 16
# Study-file sections that may change between runs of one study: they do not change what a trial measures.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNFINGERPRINTED = frozenset({"budget", "confirm", "schedule", "tracking", "storage", "description"})
# vLLM 0.32's ModelDType (vllm/config/model.py): any other string would fail only when an engine starts.
ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntRange(StrictModel):
    low: int = Field(ge=1)
    high: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high}); fix: swap them")
        return self

    @classmethod
    def coerce(cls, value: Any) -> Any:
        """Accept ``4`` (fixed), ``[1, 6]`` or ``{low: 1, high: 6}``."""
        if isinstance(value, int) and not isinstance(value, bool):
            return {"low": value, "high": value}
        if isinstance(value, list | tuple) and len(value) == 2:
            return {"low": value[0], "high": value[1]}
        return value


def _int_range_field(value: Any) -> Any:
    return IntRange.coerce(value)


class TargetConfig(StrictModel):
    model: str = Field(description="Path of a HF checkpoint, or demo:NAME for the packaged demo model.")
    dtype: ModelDType = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    trust_remote_code: bool = False
    seed: int = 0
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Passed through to vllm.LLM as keyword arguments."
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of every engine and server the study starts (trials, confirmation, "
        "grid), e.g. VLLM_ENABLE_V1_MULTIPROCESSING: 0. `vllm serve --config` cannot carry them: the export "
        "names them.",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for name, v in value.items():
            if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name; fix: use letters, digits and _")
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise ValueError(f'{name}: give the value as a quoted string; fix: {name}: "1"')
            out[name] = str(v)
        return out

    @field_validator("engine_args")
    @classmethod
    def _no_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = {"model", "speculative_config", "enforce_eager", "disable_log_stats"}
        clash = sorted(reserved & set(value))
        if clash:
            raise ValueError(
                f"{clash[0]} is set by the tuner; fix: remove it from engine_args "
                "(use target.model, candidates or search.enforce_eager)"
            )
        return value


class Candidate(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    method: Method
    model: str | None = None
    num_speculative_tokens: IntRange | None = None
    prompt_lookup_min: IntRange | None = None
    prompt_lookup_max: IntRange | None = None
    extra: dict[str, Any] = Field(
        default_factory=dict, description="More speculative_config keys, passed to vLLM as given."
    )

    _coerce_ranges = field_validator("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", mode="before")(
        classmethod(lambda cls, v: _int_range_field(v))
    )

    @field_validator("extra")
    @classmethod
    def _no_tuner_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = check_extra(value)
        if problem:
            key, message = problem
            # Raised as a ValidationError so that pydantic reports the key's own path (candidates.N.extra.KEY).
            error = InitErrorDetails(type=PydanticCustomError("tuner_key", message), loc=(key,), input=value[key])
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return value

    @model_validator(mode="after")
    def _method_rules(self) -> Candidate:
        lookup = self.prompt_lookup_min or self.prompt_lookup_max
        problem = check_candidate(self.method, self.model, bool(self.num_speculative_tokens), bool(lookup))
        if problem:
            raise ValueError(problem)
        lookup_min, lookup_max = self.prompt_lookup_min, self.prompt_lookup_max
        if lookup_min and lookup_max and lookup_min.low > lookup_max.high:
            raise ValueError(
                f"prompt_lookup_min from {lookup_min.low} is above prompt_lookup_max up to {lookup_max.high}: no n-gram "
                "window fits both; fix: lower prompt_lookup_min or raise prompt_lookup_max"
            )
        if self.num_speculative_tokens and self.num_speculative_tokens.high > MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens up to {self.num_speculative_tokens.high} is above "
                f"{MAX_SPECULATIVE_TOKENS}; fix: lower high"
            )
        return self


class FirstTrial(StrictModel):
    candidate: str
    enforce_eager: bool | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1)
    prompt_lookup_min: int | None = Field(default=None, ge=1)
    prompt_lookup_max: int | None = Field(default=None, ge=1)


class SearchConfig(StrictModel):
    num_speculative_tokens: IntRange = IntRange(low=1, high=6)
    enforce_eager: list[bool] = Field(default_factory=lambda: [True], min_length=1)
    sampler: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    startup_trials: int = Field(default=4, ge=0, description="Random trials before TPE models the space.")
    first_trials: list[FirstTrial] = Field(
        default_factory=list, description="Configurations measured right after the baseline, before the sampler."
    )

    _coerce_k = field_validator("num_speculative_tokens", mode="before")(
        classmethod(lambda cls, v: _int_range_field(v))
    )

    @field_validator("num_speculative_tokens")
    @classmethod
    def _k_limit(cls, value: IntRange) -> IntRange:
        if value.high > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"high {value.high} is above {MAX_SPECULATIVE_TOKENS}; fix: lower it")
        return value

    @field_validator("enforce_eager")
    @classmethod
    def _unique(cls, value: list[bool]) -> list[bool]:
        return sorted(set(value), reverse=True)


class SloConfig(StrictModel):
    """Latency limits a served load must keep: the p``percentile`` TTFT and TPOT of a window's requests."""

    percentile: Literal[50, 90, 99] = 90
    ttft_ms: float | None = Field(default=None, gt=0, description="Time to first token limit, milliseconds.")
    tpot_ms: float | None = Field(default=None, gt=0, description="Time per output token limit, milliseconds.")

    @model_validator(mode="after")
    def _some_limit(self) -> SloConfig:
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("no limit given; fix: set ttft_ms, tpot_ms or both")
        return self


class RateSearchConfig(StrictModel):
    """The search for the highest request rate at which the SLO holds: a doubling ramp, then bisection."""

    start_rps: float = Field(default=1.0, gt=0, description="First request rate tried, requests/s.")
    max_rps: float = Field(default=64.0, gt=0, description="The ramp stops here.")
    bisect_steps: int = Field(default=3, ge=0, le=10)
    probe_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds of arrivals per probe: a probe sends rate x probe_s requests (at least `requests`), "
        "so a higher rate is held as long as a lower one.",
    )
    requests: int | None = Field(
        default=None, ge=1, description="The fewest requests per probe (default: twice the prompt count)."
    )
    burstiness: float = Field(default=1.0, gt=0, description="1.0 = Poisson arrivals; lower = burstier (gamma).")
    time_limit_s: float = Field(
        default=300.0, gt=0, description="The search stops here and keeps the best rate so far."
    )

    @model_validator(mode="after")
    def _ordered(self) -> RateSearchConfig:
        if self.start_rps > self.max_rps:
            raise ValueError(f"start_rps ({self.start_rps}) is above max_rps ({self.max_rps}); fix: lower start_rps")
        return self


class ServeConfig(StrictModel):
    """``workload.mode: serve``: each trial starts ``vllm serve`` and loads it with ``vllm bench serve``."""

    requests_per_level: int | None = Field(
        default=None,
        ge=1,
        description="Requests per measured window (default: the prompt count, at least twice the concurrency).",
    )
    objective: Literal["throughput", "goodput"] = Field(
        default="throughput",
        description="throughput: output tokens/s per concurrency level, weighted; goodput: the highest request "
        "rate at which the SLO holds (ties broken by throughput).",
    )
    slo: SloConfig | None = None
    rate_search: RateSearchConfig = RateSearchConfig()
    start_timeout_s: float = Field(default=600.0, gt=0, description="How long the server may take to answer /health.")

    @model_validator(mode="after")
    def _goodput_needs_slo(self) -> ServeConfig:
        if self.objective == "goodput" and self.slo is None:
            raise ValueError("objective goodput needs latency limits; fix: add slo: {ttft_ms: ..., tpot_ms: ...}")
        return self


class WorkloadConfig(StrictModel):
    prompts: Path = Field(description="JSONL file, relative to the study file.")
    # offline: vllm.LLM.generate over fixed batches; serve: a real `vllm serve` under `vllm bench serve` load,
    # where each batch size is a --max-concurrency level.
    mode: Literal["offline", "serve"] = "offline"
    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Sent with every request when set.")
    batch_sizes: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1], min_length=1)
    batch_weights: list[Annotated[float, Field(gt=0)]] | None = None
    # One objective: the weighted mean of each level's score over the best baseline's (tuner.results.scoring).
    combine: Literal["weighted"] = "weighted"
    repeats: int = Field(default=3, ge=1)
    warmup_prompts: int = Field(default=2, ge=0)
    max_prompts: int | None = Field(default=None, ge=1)
    serve: ServeConfig = ServeConfig()

    @field_validator("combine", mode="before")
    @classmethod
    def _no_pareto(cls, value: Any) -> Any:
        if value == "pareto":
            raise ValueError(
                "'pareto' is no longer offered: the export, the report and the confirmation all decide by the "
                "weighted score, so a per-level front changed only what the sampler proposed; fix: remove combine "
                "and weigh the levels with batch_weights"
            )
        return value

    @model_validator(mode="after")
    def _serve_settings(self) -> WorkloadConfig:
        if self.mode != "serve" and "serve" in self.model_fields_set:
            raise ValueError("serve settings are used in serve mode only; fix: add mode: serve, or remove serve")
        return self

    @model_validator(mode="after")
    def _weights_match(self) -> WorkloadConfig:
        if self.batch_weights is not None and len(self.batch_weights) != len(self.batch_sizes):
            raise ValueError(
                f"batch_weights has {len(self.batch_weights)} entries for "
                f"{len(self.batch_sizes)} batch_sizes; fix: give one weight per batch size"
            )
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("batch_sizes repeats a value; fix: list each batch size once")
        return self

    def weights(self) -> list[float]:
        raw = self.batch_weights or [1.0] * len(self.batch_sizes)
        total = sum(raw)
        return [w / total for w in raw]


class ScoringConfig(StrictModel):
    # Each level scores (median - mad_penalty * MAD) / best baseline median, so that one lucky repeat cannot win.
    mad_penalty: float = Field(default=1.0, ge=0.0)


class PruningConfig(StrictModel):
    enabled: bool = True
    min_acceptance_rate: float = Field(
        default=0.02, ge=0.0, le=1.0, description="Stop a speculative trial whose drafts are almost never accepted."
    )
    percentile: float = Field(
        default=25.0,
        gt=0,
        lt=100,
        description="Prune a trial whose interim tokens/s is below this percentile of completed trials' values at "
        "the same batch size and repeat, unless it is within the study's noise of the best (tuner.trial.pruning).",
    )
    startup_trials: int = Field(
        default=3, ge=0, description="Completed trials with a value at a step before pruning compares against them."
    )


class ConfirmConfig(StrictModel):
    """After the trials, the finalists are measured again in fresh engines, interleaved, before export."""

    enabled: bool = True
    rounds: int = Field(
        default=2, ge=1, description="Fresh engines per finalist (A, B, A, B, ...); 2 or more measure the spread."
    )
    speculative: int = Field(default=1, ge=1, description="How many of the best speculative configurations to confirm.")
    repeats: int | None = Field(
        default=None, ge=1, description="Repeats per batch size in each engine (default: workload.repeats)."
    )
    skip_when_behind: bool = Field(
        default=True,
        description="Measure no fresh engine when the best speculative trial is more than the study's noise "
        "(pruning's rule: the median repeat-to-repeat CV, at least 3%) below no speculation: the baseline is "
        "served either way, and only noise could make fresh engines say otherwise.",
    )


class ScheduleConfig(StrictModel):
    """After confirmation: one k per measured batch size, exported only when a fresh engine validates it
    (tuner.results.schedule states the rules)."""

    enabled: bool = False
    drafter: str | None = Field(
        default=None,
        description="Candidate whose k varies by batch size (default: the best speculative trial's). Naming one "
        "forces the schedule: a setting under which vLLM rejects or ignores it is then an error, not a note.",
    )


class BudgetConfig(StrictModel):
    trials: int = Field(default=8, ge=1)
    trial_timeout_s: float = Field(default=900.0, gt=0)


class TrackingConfig(StrictModel):
    uri: str = "sqlite:///mlflow.db"
    experiment: str | None = None


class StudyConfig(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    target: TargetConfig
    candidates: list[Candidate] = Field(min_length=1)
    search: SearchConfig = SearchConfig()
    workload: WorkloadConfig
    scoring: ScoringConfig = ScoringConfig()
    pruning: PruningConfig = PruningConfig()
    confirm: ConfirmConfig = ConfirmConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    budget: BudgetConfig = BudgetConfig()
    storage: str = "sqlite:///optuna.db"
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _candidates_unique(self) -> StudyConfig:
        names = [c.name for c in self.candidates]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"candidate name {dupes[0]} is used twice; fix: give each candidate its own name")
        for first in self.search.first_trials:
            if first.candidate not in names and first.candidate != "none":
                raise ValueError(
                    f"search.first_trials names candidate '{first.candidate}'; fix: use one of {', '.join(names)}"
                )
        return self._schedule_drafter(names)

    def _schedule_drafter(self, names: list[str]) -> StudyConfig:
        drafter = self.schedule.drafter
        if drafter is None:
            return self._schedule_confirmed()
        if not self.schedule.enabled:
            raise ValueError("schedule.drafter is set but schedule.enabled is false; fix: set enabled: true")
        candidate = next((c for c in self.candidates if c.name == drafter), None)
        if candidate is None:
            raise ValueError(f"schedule.drafter names candidate '{drafter}'; fix: use one of {', '.join(names)}")
        if not rules(candidate.method).batch_schedule:
            raise ValueError(
                f"schedule.drafter: method {candidate.method} takes no batch-size schedule; "
                "fix: name a speculative candidate"
            )
        return self._schedule_confirmed()

    def _schedule_confirmed(self) -> StudyConfig:
        if self.schedule.enabled and not self.confirm.enabled:
            raise ValueError(
                "schedule.enabled: a batch-size schedule is validated among the confirmation's fresh engines, "
                "against the baseline's, and confirm.enabled is false; fix: set confirm.enabled: true "
                "(or schedule.enabled: false)"
            )
        return self

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    def fingerprinted_settings(self) -> dict[str, Any]:
        """What a study's fingerprint hashes: the settings that change what a trial measures."""
        settings = self.model_dump(mode="json", exclude=set(UNFINGERPRINTED))
        if not self.target.env:  # studies made before target.env keep their fingerprint
            del settings["target"]["env"]
        return settings

    def speculative_candidates(self) -> list[Candidate]:
        return [c for c in self.candidates if rules(c.method).speculates]

    def k_range(self, candidate: Candidate) -> IntRange:
        return candidate.num_speculative_tokens or self.search.num_speculative_tokens
