"""Entry point of a trial's engine process: ``python -m tuner.engine_worker REQUEST.json OUTDIR``.

Builds one ``vllm.LLM``, warms it up, measures every batch size ``repeats`` times, and writes
``OUTDIR/progress.jsonl`` as it goes and ``OUTDIR/result.json`` at the end. The tuner runs it in
its own process group and kills the group on timeout, so nothing here needs to clean up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tuner.measurement import EngineResult, ProgressEvent, RepeatMeasurement, TrialRequest
from tuner.prompts import Prompt
from tuner.spec_metrics import diff, snapshot

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


def run(request: TrialRequest, outdir: Path) -> EngineResult:
    progress = Progress(outdir / PROGRESS_FILE)
    t0 = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams

    kwargs = {**request.llm_kwargs, **json.loads(os.environ.pop(SECRET_ARGS_ENV, "{}") or "{}")}
    llm = LLM(**kwargs)
    engine_start_s = time.perf_counter() - t0
    progress.emit("engine_ready")

    prompts = render_prompts(llm.get_tokenizer(), request.prompts)
    params = SamplingParams(max_tokens=request.max_tokens, temperature=request.temperature, seed=request.seed)
    t1 = time.perf_counter()
    if request.warmup_prompts:
        llm.generate(prompts[: request.warmup_prompts], params, use_tqdm=False)
    warmup_s = time.perf_counter() - t1

    repeats: list[RepeatMeasurement] = []
    token_ids: dict[int, list[list[int]]] = {}
    for batch_size in request.batch_sizes:
        level_prompts = fill_batch(prompts, batch_size)
        for repeat in range(request.repeats):
            before = snapshot(llm.get_metrics())
            outputs: list[Any] = []
            start = time.perf_counter()
            for i in range(0, len(level_prompts), batch_size):
                outputs += llm.generate(level_prompts[i : i + batch_size], params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            spec = diff(before, snapshot(llm.get_metrics()))
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
                token_ids[batch_size] = [list(o.outputs[0].token_ids) for o in outputs[: len(prompts)]]
            repeats.append(measurement)
            progress.emit("repeat", measurement)

    memory = _peak_memory(torch)
    return EngineResult(
        engine_start_s=engine_start_s,
        warmup_s=warmup_s,
        repeats=repeats,
        token_ids=token_ids,
        vllm_version=vllm.__version__,
        torch_version=torch.__version__,
        device=_device_name(torch),
        peak_memory_bytes=memory,
    )


def _device_name(torch: Any) -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    from tuner.hardware import describe

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
