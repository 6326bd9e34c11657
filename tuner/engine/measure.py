"""Entry point of a trial's engine process: ``python -m tuner.engine.measure REQUEST.json OUTDIR``.

Builds the request's engine (offline ``vllm.LLM``, or a ``vllm serve`` under load in serve mode),
warms it up, measures every level ``repeats`` times (then, in serve mode with an SLO, searches the
highest request rate that keeps it), and writes ``OUTDIR/progress.jsonl`` as it goes and
``OUTDIR/result.json`` at the end. The tuner runs it in its own process group and kills the group
on timeout, so nothing here needs to clean up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tuner.engine.backend import MeasurementBackend, Workload
from tuner.engine.request import (
    LOG_FILE,
    PROGRESS_FILE,
    REQUEST_FILE,
    RESULT_FILE,
    SECRET_ARGS_ENV,
    EngineResult,
    ProgressEvent,
    RepeatMeasurement,
    SloProbe,
    SloSearch,
    TrialRequest,
)

__all__ = ["LOG_FILE", "PROGRESS_FILE", "REQUEST_FILE", "RESULT_FILE", "SECRET_ARGS_ENV", "main"]


class Progress:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.perf_counter()

    def emit(self, event: str, measurement: RepeatMeasurement | None = None, probe: SloProbe | None = None) -> None:
        line = ProgressEvent(event=event, elapsed_s=time.perf_counter() - self.t0, measurement=measurement, probe=probe)
        with self.path.open("a") as fh:
            fh.write(line.model_dump_json() + "\n")


def backend_for(request: TrialRequest, outdir: Path) -> MeasurementBackend:
    if request.mode == "serve":
        from tuner.engine.served import ServeBackend
        from tuner.study.config import ServeConfig

        return ServeBackend(request.serve or ServeConfig(), outdir)
    import torch  # noqa: F401  (imported before the clock stops, as the engine's start includes it)
    import vllm  # noqa: F401

    from tuner.engine.offline import OfflineBackend

    return OfflineBackend(outdir / LOG_FILE)


def run(request: TrialRequest, outdir: Path, backend: MeasurementBackend | None = None) -> EngineResult:
    """Measure the request's workload on ``backend`` (default: the one its mode names)."""
    progress = Progress(outdir / PROGRESS_FILE)
    t0 = time.perf_counter()
    if backend is None:
        backend = backend_for(request, outdir)
    kwargs = {**request.llm_kwargs, **json.loads(os.environ.pop(SECRET_ARGS_ENV, "{}") or "{}")}
    slo: SloSearch | None = None
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
                top_p=request.top_p,
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

        if request.serve is not None and request.serve.slo is not None:
            from tuner.engine.served import ServeBackend

            assert isinstance(backend, ServeBackend)
            slo = backend.slo_search(lambda p: progress.emit("slo_probe", probe=p))
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
        mode=request.mode,
        slo=slo,
        resolved_args=info.resolved_args,
        runner=info.runner,
    )


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
