"""Why a small draft model is slow inside speculative decoding: time per engine step, and what runs in it.

One configuration per process (an engine created in a fresh process), the worker kept in-process so that
``torch.profiler`` sees it, vLLM's named profiling scopes on:

    TARGET=/path/7b DRAFT=/path/135m python -m benchmarks.draft_profile {none|ngram|draft} BATCH [--out F.jsonl]

Optional environment: ASYNC=1 (async_scheduling), CGMODE=PIECEWISE|FULL_AND_PIECEWISE (cudagraph_mode).
Prints tokens/s, ms per engine step and, per step, the number of CUDA graph launches, kernel launches and
eager attention calls; appends the same as one JSON line to --out. (From the vLLM 0.26 source reading in
docs/research/draft-model-vllm-0.26.md; its results: docs/measurement-log.md, section "Why the draft models are
slow (vLLM 0.26.0)".)
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # worker in this process: the profiler sees it
os.environ.setdefault("VLLM_CUSTOM_SCOPES_FOR_PROFILING", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

KEYS = ("gpu_model_runner:", "cudaGraphLaunch", "LaunchKernel", "Synchronize", "unified_attention")


def main(argv: list[str]) -> int:
    import torch
    from vllm import LLM, SamplingParams

    mode, bs = argv[0], int(argv[1])
    out_path = argv[argv.index("--out") + 1] if "--out" in argv else None
    spec: dict[str, Any] | None = {
        "none": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        "draft": {"method": "draft_model", "model": os.environ.get("DRAFT"), "num_speculative_tokens": 4},
    }[mode]
    kw: dict[str, Any] = dict(
        dtype="bfloat16",
        max_model_len=1024,
        gpu_memory_utilization=0.35,
        max_num_seqs=max(bs, 4),
        speculative_config=spec,
    )
    if os.environ.get("ASYNC"):
        kw["async_scheduling"] = True
    if os.environ.get("CGMODE"):
        kw["compilation_config"] = {"cudagraph_mode": os.environ["CGMODE"]}
    t0 = time.perf_counter()
    llm = LLM(os.environ["TARGET"], **kw)
    start_s = time.perf_counter() - t0
    cc = llm.llm_engine.vllm_config.compilation_config
    prompts = [f"Write a long, detailed story about robot number {i} exploring a city." for i in range(bs)]
    sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)
    t = time.perf_counter()
    out = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t
    n = sum(len(o.outputs[0].token_ids) for o in out)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        t = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True), use_tqdm=False)
        pdt = time.perf_counter() - t
    ka = prof.key_averages()
    steps = max([e.count for e in ka if e.key == "gpu_model_runner: forward"] or [1])
    per_step = {
        e.key[:60]: {
            "calls": e.count / steps,
            "cpu_ms": e.cpu_time_total / 1e3 / steps,
            "gpu_ms": e.device_time_total / 1e3 / steps,
        }
        for e in ka
        if any(k in e.key for k in KEYS)
    }
    row = {
        "mode": mode,
        "batch": bs,
        "async": bool(os.environ.get("ASYNC")),
        "cudagraph_mode": str(cc.cudagraph_mode),
        "tokens_per_s": n / dt,
        "engine_start_s": start_s,
        "profiled_ms_per_step": pdt * 1e3 / steps,
        "steps": steps,
        "per_step": per_step,
    }
    print(
        f"[{mode} bs={bs} async={row['async']}] {row['tokens_per_s']:.1f} tok/s, {row['profiled_ms_per_step']:.2f} ms/step "
        f"(profiled), cudagraph_mode {row['cudagraph_mode']}"
    )
    for key, v in sorted(per_step.items(), key=lambda kv: -kv[1]["cpu_ms"]):
        print(f"  {key:58s} {v['calls']:8.1f}/step cpu {v['cpu_ms']:7.3f} ms gpu {v['gpu_ms']:7.3f} ms")
    if out_path:
        with open(out_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
