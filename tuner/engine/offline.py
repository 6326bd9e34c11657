"""Entry point of a trial's engine process: ``python -m tuner.engine.offline REQUEST.json OUTDIR``.

Builds one ``vllm.LLM`` (:class:`OfflineBackend`, a :class:`~tuner.engine.backend.MeasurementBackend`),
warms it up, measures every batch size ``repeats`` times, and writes
``OUTDIR/progress.jsonl`` as it goes and ``OUTDIR/result.json`` at the end. The tuner runs it in
its own process group and kills the group on timeout, so nothing here needs to clean up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.engine.backend import BackendInfo, LevelResult, MeasurementBackend, RepeatHook, Workload
from tuner.engine.request import EngineResult, ProgressEvent, RepeatMeasurement, TrialRequest
from tuner.engine.vllm_metrics import Snapshot, diff, snapshot
from tuner.study.prompts import Prompt

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.jsonl"
LOG_FILE = "engine.log"
REQUEST_FILE = "request.json"
SECRET_ARGS_ENV = "SPECDEC_TUNER_SECRET_ARGS"  # credentials for vllm.LLM, passed outside the request file


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


class Progress:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.perf_counter()

    def emit(self, event: str, measurement: RepeatMeasurement | None = None) -> None:
        line = ProgressEvent(event=event, elapsed_s=time.perf_counter() - self.t0, measurement=measurement)
        with self.path.open("a") as fh:
            fh.write(line.model_dump_json() + "\n")


class OfflineBackend:
    """The offline ``vllm.LLM`` engine, in this process (its engine core in processes of its own)."""

    def __init__(self) -> None:
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
            max_tokens=workload.max_tokens, temperature=workload.temperature, seed=workload.seed
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
        import torch
        import vllm

        memory = _peak_memory(torch)  # before anything else touches the device
        return BackendInfo(
            vllm_version=vllm.__version__,
            torch_version=torch.__version__,
            device=_device_name(torch),
            peak_memory_bytes=memory,
        )

    def stop(self) -> None:
        """Nothing to do: once the result is written the tuner kills this process's whole group,
        which is faster than vLLM's own shutdown."""


def run(request: TrialRequest, outdir: Path, backend: MeasurementBackend | None = None) -> EngineResult:
    """Measure the request's workload on ``backend`` (default: the offline ``vllm.LLM`` engine)."""
    progress = Progress(outdir / PROGRESS_FILE)
    t0 = time.perf_counter()
    if backend is None:
        import torch  # noqa: F401  (imported before the clock stops, as the engine's start includes it)
        import vllm  # noqa: F401

        backend = OfflineBackend()
    kwargs = {**request.llm_kwargs, **json.loads(os.environ.pop(SECRET_ARGS_ENV, "{}") or "{}")}
    try:
        backend.start(kwargs)
        engine_start_s = time.perf_counter() - t0
        progress.emit("engine_ready")

        backend.prepare(
            Workload(
                prompts=request.prompts,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                seed=request.seed,
            )
        )
        t1 = time.perf_counter()
        backend.warmup(request.warmup_prompts)
        warmup_s = time.perf_counter() - t1

        repeats: list[RepeatMeasurement] = []
        token_ids: dict[int, list[list[int]]] = {}
        for batch_size in request.batch_sizes:
            level = backend.measure(batch_size, request.repeats, lambda m: progress.emit("repeat", m))
            repeats += level.repeats
            if level.token_ids is not None:
                token_ids[batch_size] = level.token_ids

        info = backend.info()
    finally:
        backend.stop()
    return EngineResult(
        engine_start_s=engine_start_s,
        warmup_s=warmup_s,
        repeats=repeats,
        token_ids=token_ids,
        vllm_version=info.vllm_version,
        torch_version=info.torch_version,
        device=info.device,
        peak_memory_bytes=info.peak_memory_bytes,
    )


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


def main(argv: list[str]) -> int:
    request = TrialRequest.model_validate_json(Path(argv[0]).read_text())
    outdir = Path(argv[1])
    result = run(request, outdir)
    tmp = outdir / (RESULT_FILE + ".tmp")
    tmp.write_text(result.model_dump_json())
    tmp.rename(outdir / RESULT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
