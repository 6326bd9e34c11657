"""The one boundary between the tuner's measuring code and an engine: a measurement backend.

A backend builds an engine from the trial's engine arguments, is handed the workload, measures one
workload level at a time (a batch size, ``repeats`` times) and reads the engine's cumulative
speculative-decoding counters. ``tuner.engine.measure`` drives one through this interface inside a
trial's engine process; its first implementation is the offline ``vllm.LLM`` engine
(:class:`tuner.engine.offline.OfflineBackend`); the second talks to a ``vllm serve`` process under
``vllm bench serve`` load (:class:`tuner.engine.served.ServeBackend`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tuner.engine.request import RepeatMeasurement
from tuner.engine.vllm_metrics import Snapshot
from tuner.study.prompts import Prompt

# Called with each repeat as soon as it is measured (the engine process writes a progress event).
RepeatHook = Callable[[RepeatMeasurement], None]


@dataclass(frozen=True)
class Workload:
    """What is measured: the prompts and the sampling settings of every generation."""

    prompts: list[Prompt]
    max_tokens: int
    temperature: float
    seed: int = 0
    top_p: float | None = None


@dataclass
class LevelResult:
    """One workload level: its repeats, and the token ids of the first repeat (one list per prompt;
    None when no repeat ran)."""

    repeats: list[RepeatMeasurement] = field(default_factory=list)
    token_ids: list[list[int]] | None = None


@dataclass(frozen=True)
class BackendInfo:
    """What the engine ran on, for the result's provenance."""

    vllm_version: str = ""
    torch_version: str = ""
    device: str = ""
    peak_memory_bytes: int | None = None
    resolved_args: dict[str, int] = field(default_factory=dict)  # EngineResult.resolved_args
    runner: dict[str, str] = field(default_factory=dict)  # EngineResult.runner


@runtime_checkable
class MeasurementBackend(Protocol):
    def start(self, llm_kwargs: Mapping[str, Any]) -> None:
        """Build the engine from the trial's engine arguments; returns once it can generate."""
        ...

    def prepare(self, workload: Workload) -> None:
        """Take the workload (render its prompts); not part of the engine's start time."""
        ...

    def warmup(self, n_prompts: int) -> None:
        """Generate once for the first ``n_prompts`` prompts; never measured."""
        ...

    def measure(self, batch_size: int, repeats: int, on_repeat: RepeatHook | None = None) -> LevelResult:
        """Run the level ``repeats`` times, each repeat's speculative statistics diffed from the counters."""
        ...

    def spec_counters(self) -> Snapshot:
        """The engine's cumulative speculative-decoding counters now."""
        ...

    def info(self) -> BackendInfo:
        """Versions, device, memory in use and the engine's resolved defaults, read while the engine is up."""
        ...

    def stop(self) -> None:
        """Release the engine (the tuner also kills the engine process's whole group)."""
        ...
