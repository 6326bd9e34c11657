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
  fake_engine_factors, fake_launch_file: the n-th engine started (counted in the file) runs at
    fake_engine_factors[n] times its throughput: noise between engines, as on a real machine
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner.engine.measure import PROGRESS_FILE, RESULT_FILE
from tuner.engine.request import EngineResult, ProgressEvent, RepeatMeasurement, TrialRequest
from tuner.engine.vllm_metrics import SpecStats


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


def main(argv: list[str]) -> int:
    request = TrialRequest.model_validate_json(Path(argv[0]).read_text())
    outdir = Path(argv[1])
    kwargs = request.llm_kwargs
    spec = kwargs.get("speculative_config")
    k = spec["num_speculative_tokens"] if spec else None
    print("fake engine starting", flush=True)
    if kwargs.get("fake_helper"):
        helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
        subprocess.Popen([sys.executable, "-c", helper], stdin=subprocess.DEVNULL)
    if k is not None and k == kwargs.get("fake_crash_k"):
        print("RuntimeError: Engine core initialization failed (fake crash)", flush=True)
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
    t0 = time.perf_counter()
    progress = outdir / PROGRESS_FILE

    def emit(event: str, m: RepeatMeasurement | None = None) -> None:
        line = ProgressEvent(event=event, elapsed_s=time.perf_counter() - t0, measurement=m)
        with progress.open("a") as fh:
            fh.write(line.model_dump_json() + "\n")

    emit("engine_ready")
    repeat_s = float(kwargs.get("fake_repeat_s", 0.05))
    factor = 1.0
    if kwargs.get("fake_launch_file"):
        counter = Path(kwargs["fake_launch_file"])
        launched = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(launched + 1))
        factors = kwargs["fake_engine_factors"]
        factor = factors[launched % len(factors)]
    repeats = []
    tokens: dict[int, list[list[int]]] = {}
    for bs in request.batch_sizes:
        tps, stats = throughput(spec, bs, kwargs.get("fake_gain"))
        if spec and "fake_spec_gain" in kwargs:
            tps = throughput(None, bs)[0] * float(kwargs["fake_spec_gain"])
        tps *= factor
        for r in range(request.repeats):
            time.sleep(repeat_s)
            jitter = 1.0 + 0.01 * ((r % 3) - 1)
            out_tokens = request.max_tokens * len(request.prompts)
            m = RepeatMeasurement(
                batch_size=bs,
                repeat=r,
                output_tokens=out_tokens,
                elapsed_s=out_tokens / (tps * jitter),
                ttft_s=[0.01] * len(request.prompts),
                tpot_s=[1.0 / tps] * len(request.prompts),
                spec=stats,
            )
            repeats.append(m)
            emit("repeat", m)
        tokens[bs] = [[i, i + 1, i + 2] for i in range(len(request.prompts))]
    result = EngineResult(
        engine_start_s=0.01,
        warmup_s=0.0,
        repeats=repeats,
        token_ids=tokens,
        vllm_version="fake",
        torch_version="fake",
        device="cpu (fake)",
    )
    (outdir / RESULT_FILE).write_text(result.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
