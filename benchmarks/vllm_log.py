"""Figures vLLM prints while an engine starts, read back from a trial's ``engine.log``.

The tuner measures an engine's start as one number; the log says where it went: torch.compile
(and whether vLLM's compile cache served it), CUDA-graph capture, model loading, and how the GPU
memory was used. Messages are those of vLLM 0.26 (CUDA) and 0.32 (CPU); a message that is absent
leaves its figure out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
# name -> (pattern, group index); every match is summed (a draft model logs its own lines).
_SUMMED = {
    "init_engine_s": (re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM), 1),
    "compile_total_s": (re.compile(r"torch\.compile took " + _NUM + r" s in total"), 1),
    "dynamo_transform_s": (re.compile(r"Dynamo bytecode transform time: " + _NUM), 1),
    "graph_compile_s": (re.compile(r"Compiling a graph for compile range .* takes " + _NUM + " s"), 1),
    "graph_cache_load_s": (re.compile(r"Directly load the compiled graph\(s\) for .* took " + _NUM + " s"), 1),
    "cudagraph_capture_s": (re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM), 1),
    "cudagraph_memory_gib": (re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM), 2),
    "model_load_gib": (re.compile(r"Model loading took " + _NUM + r" GiB"), 1),
    "model_load_s": (re.compile(r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + " seconds"), 2),
    "kv_cache_gib": (re.compile(r"Available KV cache memory: " + _NUM + " GiB"), 1),
}
_COUNTED = {
    "graphs_compiled": re.compile(r"Compiling a graph for compile range"),
    "graphs_loaded_from_cache": re.compile(r"Directly load the compiled graph\(s\)"),
}


def parse_text(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in text.splitlines():
        for name, (pattern, group) in _SUMMED.items():
            match = pattern.search(line)
            if match:
                out[name] = round(out.get(name, 0.0) + float(match.group(group)), 3)
        for name, pattern in _COUNTED.items():
            if pattern.search(line):
                out[name] = out.get(name, 0) + 1
    if "graphs_compiled" in out or "graphs_loaded_from_cache" in out:
        compiled = out.get("graphs_compiled", 0)
        out["compile_cache"] = (
            "miss" if compiled and not out.get("graphs_loaded_from_cache") else ("partial" if compiled else "hit")
        )
    return out


def parse_log(path: Path) -> dict[str, Any]:
    """Start-up figures of one engine log; empty when the file is missing."""
    if not path.is_file():
        return {}
    return parse_text(path.read_text(errors="replace"))
