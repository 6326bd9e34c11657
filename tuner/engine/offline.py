"""The offline engine: one ``vllm.LLM`` in the trial's engine process (:class:`OfflineBackend`), measured over
fixed batches with ``LLM.generate``; the entry point that drives it is :mod:`tuner.engine.measure`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.engine.backend import BackendInfo, LevelResult, RepeatHook, Workload
from tuner.engine.request import RepeatMeasurement
from tuner.engine.runner_log import parse_runner_log, runner_from_config
from tuner.engine.serve_file import RESOLVED_ARGS
from tuner.engine.vllm_metrics import Snapshot, diff, snapshot
from tuner.study.prompts import Prompt


def render_prompts(tokenizer: Any, prompts: list[Prompt]) -> list[str]:
    rendered = []
    for prompt in prompts:
        if prompt.messages is not None:
            rendered.append(tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False))
        else:
            rendered.append(prompt.text or "")
    return rendered


def _latencies(outputs: list[Any]) -> tuple[list[float], list[float]]:
    ttft: list[float] = []
    tpot: list[float] = []
    for out in outputs:
        stats = getattr(out, "metrics", None)
        if stats is None:
            continue
        first = getattr(stats, "first_token_latency", 0.0) or 0.0
        if first > 0:
            ttft.append(float(first))
        n = getattr(stats, "num_generation_tokens", 0) or 0
        first_ts = getattr(stats, "first_token_ts", 0.0) or 0.0
        last_ts = getattr(stats, "last_token_ts", 0.0) or 0.0
        if n > 1 and last_ts > first_ts > 0:
            tpot.append((last_ts - first_ts) / (n - 1))
    return ttft, tpot


def fill_batch(prompts: list[str], batch_size: int) -> list[str]:
    """A batch size above the prompt count cycles the prompts, so the engine really runs that many at once."""
    if len(prompts) >= batch_size:
        return prompts
    return [prompts[i % len(prompts)] for i in range(batch_size)]


class OfflineBackend:
    """The offline ``vllm.LLM`` engine, in this process (its engine core in processes of its own).
    ``log_path``: where this process's output goes (the engine process's ``engine.log``), read for the
    model runner and CUDA-graph mode."""

    def __init__(self, log_path: Path | None = None) -> None:
        self._log_path = log_path
        self._llm: Any = None
        self._prompts: list[str] = []
        self._params: Any = None

    def start(self, llm_kwargs: Mapping[str, Any]) -> None:
        from vllm import LLM

        self._llm = LLM(**llm_kwargs)

    def prepare(self, workload: Workload) -> None:
        from vllm import SamplingParams

        self._prompts = render_prompts(self._llm.get_tokenizer(), workload.prompts)
        self._params = SamplingParams(
            max_tokens=workload.max_tokens,
            temperature=workload.temperature,
            seed=workload.seed,
            top_p=1.0 if workload.top_p is None else workload.top_p,  # 1.0: vLLM's default
        )

    def warmup(self, n_prompts: int) -> None:
        if n_prompts:
            self._llm.generate(self._prompts[:n_prompts], self._params, use_tqdm=False)

    def measure(self, batch_size: int, repeats: int, on_repeat: RepeatHook | None = None) -> LevelResult:
        llm = self._llm
        level = LevelResult()
        level_prompts = fill_batch(self._prompts, batch_size)
        for repeat in range(repeats):
            before = self.spec_counters()
            outputs: list[Any] = []
            start = time.perf_counter()
            for i in range(0, len(level_prompts), batch_size):
                outputs += llm.generate(level_prompts[i : i + batch_size], self._params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            spec = diff(before, self.spec_counters())
            ttft, tpot = _latencies(outputs)
            measurement = RepeatMeasurement(
                batch_size=batch_size,
                repeat=repeat,
                output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
                elapsed_s=elapsed,
                ttft_s=ttft,
                tpot_s=tpot,
                spec=spec,
            )
            if repeat == 0:
                level.token_ids = [list(o.outputs[0].token_ids) for o in outputs[: len(self._prompts)]]
            level.repeats.append(measurement)
            if on_repeat is not None:
                on_repeat(measurement)
        return level

    def spec_counters(self) -> Snapshot:
        return snapshot(self._llm.get_metrics())

    def info(self) -> BackendInfo:
        runner = engine_runner(self._llm, self._log_path)
        return dataclasses.replace(device_info(), resolved_args=resolved_args(self._llm), runner=runner)

    def stop(self) -> None:
        """Nothing to do: once the result is written the tuner kills this process's whole group,
        which is faster than vLLM's own shutdown."""


def resolved_args(llm: Any) -> dict[str, int]:
    """The values of ``RESOLVED_ARGS`` that ``llm`` runs with (vLLM 0.32: ``llm.llm_engine.vllm_config.
    scheduler_config``); those this vLLM does not expose there are left out."""
    engine_config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    scheduler = getattr(engine_config, "scheduler_config", None)
    values = {name: getattr(scheduler, name, None) for name in RESOLVED_ARGS}
    return {name: v for name, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}


def engine_runner(llm: Any, log_path: Path | None) -> dict[str, str]:
    """The model runner and CUDA-graph mode of ``llm`` (EngineResult.runner): what the log at ``log_path`` says
    (this process's output, vLLM's engine core's included); what it does not, from the engine's config (an
    engine whose output is not in ``log_path``, e.g. one run inside a test's own process)."""
    logged: dict[str, str] = {}
    if log_path is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        logged = parse_runner_log(log_path)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return {**runner_from_config(config), **logged}


def _device_name(torch: Any) -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    from tuner.engine.hardware import describe

    return describe().hardware_class


def _peak_memory(torch: Any) -> int | None:
    """GPU memory in use on the device while the engine is up (the model lives in vLLM's engine-core
    process, so this process's own allocator statistics would read zero)."""
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return int(total - free)
    return None


def device_info() -> BackendInfo:
    """Versions, device and device memory in use, read in the trial's engine process while the engine is up."""
    import torch
    import vllm

    memory = _peak_memory(torch)  # before anything else touches the device
    return BackendInfo(
        vllm_version=vllm.__version__,
        torch_version=torch.__version__,
        device=_device_name(torch),
        peak_memory_bytes=memory,
    )
