"""A stand-in engine process for fast tests of the search logic (no vLLM).

Same protocol as ``tuner.engine.measure``: reads REQUEST.json, writes progress.jsonl and result.json.
Throughput is a deterministic function of the speculative settings; behaviour is steered through
``engine_args`` keys starting with ``fake_`` (never sent to a real engine):
  fake_crash_k: exit 1 with a vLLM-like error when num_speculative_tokens equals it
  fake_invalid_k: exit 1 with a ValidationError when num_speculative_tokens equals it
  fake_hang_k: sleep forever when num_speculative_tokens equals it
  fake_kill_k: SIGKILL itself (as a person or a scheduler would) when num_speculative_tokens equals it
  fake_oom_k: log a CUDA out-of-memory error, then SIGKILL itself, when num_speculative_tokens equals it
  fake_hang_file: sleep forever while this file exists (tests remove it to let a retry pass)
  fake_repeat_s: seconds each measured repeat takes (default 0.05)
  fake_gain: {"K": factor}: an n-gram trial with num_speculative_tokens K runs at factor x the baseline
  fake_helper: start a child that ignores SIGTERM, as multiprocessing's resource tracker does, and
    outlives the engine unless someone kills it
  fake_spec_gain: speculative throughput is this times the baseline's (instead of the formula below)
  fake_compiled_gain: an engine with enforce_eager false runs at this factor (CUDA graphs; default 1.0)
  fake_crash_baseline: "eager", "compiled" or "all": the no-speculation engine of that mode exits 1
  fake_engine_factors, fake_launch_file: the n-th engine started (counted in the file) runs at
    fake_engine_factors[n] times its throughput: noise between engines, as on a real machine
  fake_capacity_rps: serve mode, the request rate the baseline saturates at (default 8.0; speculation
    raises it by its throughput gain)
  fake_probe_s: serve mode, seconds each SLO probe takes (default fake_repeat_s)
  fake_v1_runner: log vLLM 0.26's fallback to the V1 model runner instead of "Using V2 Model Runner"

Like a real engine it logs its model runner and CUDA-graph mode (NONE when eager, FULL_AND_PIECEWISE
otherwise) in vLLM's words, and reads them back from its own log as the real one does.

Serve mode (``request.mode == "serve"``): every repeat carries a ``served`` window with latencies from
a fake model (TPOT from the per-stream throughput, TTFT growing with concurrency or request rate),
and with ``serve.slo`` set the rate search of :mod:`tuner.engine.rate_search` runs on the same model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tuner.engine.measure import LOG_FILE, PROGRESS_FILE, RESULT_FILE
from tuner.engine.rate_search import search_rate
from tuner.engine.request import (
    EngineResult,
    ProgressEvent,
    RepeatMeasurement,
    ServedWindow,
    SloProbe,
    SloSearch,
    TrialRequest,
)
from tuner.engine.runner_log import parse_runner_log
from tuner.engine.vllm_metrics import SpecStats
from tuner.study.config import ServeConfig

# p50 -> p90 -> p99 and mean of every fake latency: a right-skewed spread, as served latencies have
_SPREAD = {"p50": 1.0, "p90": 1.25, "p99": 1.5, "mean": 1.08}
TTFT_MS = 15.0  # an idle server's time to first token
TPOT_MS = 10.0  # an idle server's time per output token without speculation (100 tokens/s per stream)


def throughput(spec: dict | None, batch_size: int, gains: dict[str, float] | None = None) -> tuple[float, SpecStats]:
    base = 100.0 * batch_size**0.5
    if not spec:
        return base, SpecStats()
    k = spec["num_speculative_tokens"]
    if spec["method"] == "ngram":
        rate = 0.6
        gain = (gains or {}).get(str(k), 1.0 + 0.12 * min(k, 4) - 0.05 * max(0, k - 4))
    else:
        rate = 0.01
        gain = 0.7
    drafts = 100
    accepted = int(drafts * k * rate)
    per_pos = [int(drafts * rate ** (i + 1)) for i in range(k)]
    return base * gain, SpecStats(
        drafts=drafts, draft_tokens=drafts * k, accepted_tokens=accepted, accepted_per_pos=per_pos
    )


def _latencies(ttft: float, tpot: float, itl: float, max_tokens: int) -> dict[str, float]:
    e2el = ttft + tpot * max(0, max_tokens - 1)
    return {
        f"{name}_{stat}": base * factor
        for name, base in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el))
        for stat, factor in _SPREAD.items()
    }


def level_window(request: TrialRequest, concurrency: int, tps: float, stats: SpecStats) -> ServedWindow:
    """One ``vllm bench serve`` window at ``--max-concurrency``: every stream decodes at tps / concurrency."""
    n = (request.serve.requests_per_level if request.serve else None) or max(len(request.prompts), 2 * concurrency)
    tpot = 1000.0 * concurrency / tps
    ttft = TTFT_MS * (1 + 0.5 * (concurrency - 1)) * (1.05 if stats.drafts else 1.0)
    out_tokens = n * request.max_tokens
    duration = out_tokens / tps
    return ServedWindow(
        max_concurrency=concurrency,
        completed=n,
        duration_s=duration,
        output_tokens=out_tokens,
        request_throughput=n / duration,
        output_throughput=tps,
        # tokens come in bursts of the mean acceptance length, so the gap between chunks is longer
        latency_ms=_latencies(ttft, tpot, tpot * (stats.mean_acceptance_length or 1.0), request.max_tokens),
    )


def rate_window(request: TrialRequest, rate: float, n: int, gain: float, capacity: float) -> ServedWindow:
    """Open-loop arrivals at ``rate``: queueing grows TTFT as 1 / (1 - load), batching grows TPOT."""
    load = rate / (capacity * gain)
    ttft = TTFT_MS / (1 - load) if load < 0.95 else TTFT_MS * 40 * (1 + load)
    tpot = TPOT_MS / gain * (1 + 2 * load)
    latency = _latencies(ttft, tpot, tpot, request.max_tokens)
    duration = n / rate + latency["e2el_p50"] / 1000.0
    out_tokens = n * request.max_tokens
    return ServedWindow(
        request_rate=rate,
        completed=n,
        duration_s=duration,
        output_tokens=out_tokens,
        request_throughput=n / duration,
        output_throughput=out_tokens / duration,
        latency_ms=latency,
    )


def slo_search(
    request: TrialRequest, gain: float, stats: SpecStats, kwargs: dict, emit_probe: Callable[[SloProbe], None]
) -> SloSearch:
    """The real rate search (tuner.engine.rate_search) over the fake latency model."""
    serve = request.serve or ServeConfig()
    assert serve.slo is not None
    slo, cfg = serve.slo, serve.rate_search
    result = SloSearch(percentile=slo.percentile, ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms)
    n = cfg.requests or 2 * len(request.prompts)
    capacity = float(kwargs.get("fake_capacity_rps", 8.0))
    probe_s = float(kwargs.get("fake_probe_s", kwargs.get("fake_repeat_s", 0.05)))

    def holds(rate: float) -> bool:
        time.sleep(probe_s)
        window = rate_window(request, rate, n, gain, capacity)
        probe = SloProbe(rate_rps=rate, held=result.held_at(window), window=window, spec=stats)
        result.probes.append(probe)
        emit_probe(probe)
        return probe.held

    t0 = time.monotonic()
    outcome = search_rate(holds, cfg)
    result.max_rate_rps, result.truncated = outcome.max_rate_rps, outcome.truncated
    result.elapsed_s = time.monotonic() - t0
    return result


def level_throughput(spec: dict | None, batch_size: int, kwargs: dict) -> tuple[float, SpecStats]:
    tps, stats = throughput(spec, batch_size, kwargs.get("fake_gain"))
    if spec and "fake_spec_gain" in kwargs:
        tps = throughput(None, batch_size)[0] * float(kwargs["fake_spec_gain"])
    if kwargs.get("enforce_eager") is False:
        tps *= float(kwargs.get("fake_compiled_gain", 1.0))
    return tps, stats


def misbehave(kwargs: dict, spec: dict | None) -> int | None:
    """The failure the ``fake_*`` knobs ask of this trial: an exit code, a kill or a hang; None: run."""
    k = spec["num_speculative_tokens"] if spec else None
    if kwargs.get("fake_helper"):
        helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
        subprocess.Popen([sys.executable, "-c", helper], stdin=subprocess.DEVNULL)
    if k is not None and k == kwargs.get("fake_crash_k"):
        print("RuntimeError: Engine core initialization failed (fake crash)", flush=True)
        return 1
    crash = kwargs.get("fake_crash_baseline")
    mode = "eager" if kwargs.get("enforce_eager", True) else "compiled"
    if not spec and crash in ("all", mode):
        print(f"RuntimeError: Engine core initialization failed (fake crash of the {mode} baseline)", flush=True)
        return 1
    if k is not None and k == kwargs.get("fake_invalid_k"):
        print("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig", flush=True)
        return 1
    if k is not None and k == kwargs.get("fake_oom_k"):
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    if k is not None and k in (kwargs.get("fake_kill_k"), kwargs.get("fake_oom_k")):
        os.kill(os.getpid(), signal.SIGKILL)
    if k is not None and k == kwargs.get("fake_hang_k"):
        time.sleep(3600)
    hang_file = kwargs.get("fake_hang_file")
    if spec and hang_file and Path(hang_file).exists():
        time.sleep(3600)
    return None


def log_runner(kwargs: dict) -> None:
    """The model runner's and CUDA-graph mode's lines of a real engine log (vLLM 0.26 and 0.32, H200)."""
    graphs = "NONE: 0" if kwargs.get("enforce_eager") else "FULL_AND_PIECEWISE: (2, 1)"
    print(
        "(EngineCore pid=2352) INFO 12-04 03:06:54 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
        f"model='fake', compilation_config={{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
        f"<CUDAGraphMode.{graphs}>, 'cudagraph_num_of_warmups': 1}}",
        flush=True,
    )
    if kwargs.get("fake_v1_runner"):
        print(
            "WARNING 12-02 19:08:15 [vllm.py:584] Model Runner V2 does not yet support speculative method "
            "'draft_model'; using the V1 model runner instead.",
            flush=True,
        )
    else:
        print("(EngineCore pid=2352) INFO 12-04 03:06:57 [gpu_worker.py:518] Using V2 Model Runner", flush=True)


def launch_factor(kwargs: dict) -> float:
    if not kwargs.get("fake_launch_file"):
        return 1.0
    counter = Path(kwargs["fake_launch_file"])
    launched = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(launched + 1))
    factors = kwargs["fake_engine_factors"]
    return float(factors[launched % len(factors)])


def measurement(
    request: TrialRequest, bs: int, repeat: int, tps: float, stats: SpecStats, jitter: float
) -> RepeatMeasurement:
    if request.mode == "serve":
        window = level_window(request, bs, tps * jitter, stats)
        return RepeatMeasurement(
            batch_size=bs,
            repeat=repeat,
            output_tokens=window.output_tokens,
            elapsed_s=window.duration_s,
            spec=stats,
            served=window,
        )
    out_tokens = request.max_tokens * len(request.prompts)
    return RepeatMeasurement(
        batch_size=bs,
        repeat=repeat,
        output_tokens=out_tokens,
        elapsed_s=out_tokens / (tps * jitter),
        ttft_s=[0.01] * len(request.prompts),
        tpot_s=[1.0 / tps] * len(request.prompts),
        spec=stats,
    )


def main(argv: list[str]) -> int:
    request = TrialRequest.model_validate_json(Path(argv[0]).read_text())
    outdir = Path(argv[1])
    kwargs = request.llm_kwargs
    spec = kwargs.get("speculative_config")
    print("fake engine starting", flush=True)
    log_runner(kwargs)
    code = misbehave(kwargs, spec)
    if code is not None:
        return code
    t0 = time.perf_counter()
    progress = outdir / PROGRESS_FILE

    def emit(event: str, m: RepeatMeasurement | None = None, probe: SloProbe | None = None) -> None:
        line = ProgressEvent(event=event, elapsed_s=time.perf_counter() - t0, measurement=m, probe=probe)
        with progress.open("a") as fh:
            fh.write(line.model_dump_json() + "\n")

    emit("engine_ready")
    repeat_s = float(kwargs.get("fake_repeat_s", 0.05))
    factor = launch_factor(kwargs)
    repeats = []
    tokens: dict[int, list[list[int]]] = {}
    for bs in request.batch_sizes:
        tps, stats = level_throughput(spec, bs, kwargs)
        tps *= factor
        for r in range(request.repeats):
            time.sleep(repeat_s)
            jitter = 1.0 + 0.01 * ((r % 3) - 1)
            m = measurement(request, bs, r, tps, stats, jitter)
            repeats.append(m)
            emit("repeat", m)
        if request.mode != "serve":  # a served trial has no token ids to compare (as tuner.engine.served)
            tokens[bs] = [[i, i + 1, i + 2] for i in range(len(request.prompts))]
    slo = None
    if request.mode == "serve" and request.serve is not None and request.serve.slo is not None:
        tps, stats = level_throughput(spec, 1, kwargs)
        gain = tps * factor / throughput(None, 1)[0]
        slo = slo_search(request, gain, stats, kwargs, lambda p: emit("slo_probe", probe=p))
    result = EngineResult(
        engine_start_s=0.01,
        warmup_s=0.0,
        repeats=repeats,
        token_ids=tokens,
        vllm_version="fake",
        torch_version="fake",
        device="cpu (fake)",
        mode=request.mode,
        slo=slo,
        runner=parse_runner_log(outdir / LOG_FILE),
    )
    (outdir / RESULT_FILE).write_text(result.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
