"""An eager CPU engine's start with vLLM's engine-core process and in-process (VLLM_ENABLE_V1_MULTIPROCESSING).

    python -m benchmarks.engine_start      # prints a table, writes benchmarks/results/engine_start.json
Each mode runs in a fresh interpreter: the 135M demo model with its 4-layer draft (k=2), 8 prompts x 32 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "engine_start.json"


def _one() -> None:
    from vllm import LLM, SamplingParams

    models = Path(os.environ.get("SPECDEC_TUNER_CACHE", Path.home() / ".cache" / "specdec-tuner")) / "models"
    started = time.monotonic()
    llm = LLM(
        model=str(models / "SmolLM2-135M-Instruct"),
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=512 * 1024 * 1024,
        enforce_eager=True,
        speculative_config={
            "method": "draft_model",
            "model": str(models / "SmolLM2-135M-Instruct-4L"),
            "num_speculative_tokens": 2,
        },
    )
    ready = time.monotonic()
    llm.generate(["Once upon a time", "Write a poem", "def add(a, b):", "Hello"] * 2, SamplingParams(max_tokens=32))
    done = time.monotonic()
    print(json.dumps({"start_s": round(ready - started, 1), "generate_s": round(done - ready, 1)}))


def main() -> None:
    rows = []
    for mode in ("1", "0"):
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING=mode)
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.engine_start", "--one"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows.append(
            {
                "VLLM_ENABLE_V1_MULTIPROCESSING": mode,
                **json.loads(next(line for line in out.splitlines() if line.startswith('{"start_s'))),
            }
        )
    print("| VLLM_ENABLE_V1_MULTIPROCESSING | start s | generate s |\n|---|---|---|")
    for r in rows:
        print(f"| {r['VLLM_ENABLE_V1_MULTIPROCESSING']} | {r['start_s']} | {r['generate_s']} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(), "runs": rows}, indent=1
        )
        + "\n"
    )


if __name__ == "__main__":
    _one() if "--one" in sys.argv else main()
