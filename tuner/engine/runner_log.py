"""Which model runner (V1 or V2) and which CUDA-graph mode an engine ran with, read from its own log.

Both decide how fast a speculative engine can be: on vLLM 0.26 every ``ngram`` and ``draft_model`` engine
fell back to the V1 runner, whose decode step cost twice the V2 runner's (docs/benchmarks.md). vLLM says
both in every engine's log, offline and served, in every version this project has run:

- V2: ``Using V2 Model Runner`` (the worker: vLLM 0.26 and 0.32 on the H200; 0.32's CPU worker logs the same);
- V1: ``Model Runner V2 does not yet support ...; using the V1 model runner instead.`` (0.26 and 0.32),
  ``Model Runner V2 requires Triton; using the V1 model runner instead.`` (0.32 CPU, no Triton);
- the CUDA-graph mode: the engine's config line (``Initializing a V1 LLM engine ... 'cudagraph_mode':
  <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>``), then any later resolution vLLM logs ("Overriding
  cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE", an attention backend's "...; setting
  cudagraph_mode=PIECEWISE", "... Overriding to CUDAGraphMode.NONE."); the last one is what ran.

A statement that is absent leaves its key out (a vLLM that logs at WARNING hides the V2 line).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MODEL_RUNNER = "model_runner"  # "V1" | "V2"
CUDAGRAPH_MODE = "cudagraph_mode"  # vLLM's CUDAGraphMode name: NONE, PIECEWISE, FULL, FULL_AND_PIECEWISE, ...

_V2 = re.compile(r"Using V2 Model Runner")
_V1 = re.compile(r"using the V1 model runner instead", re.IGNORECASE)
_MODE = r"(?:CUDAGraphMode\.)?([A-Z][A-Z_]*)\b"
_GRAPH_MODES = [
    re.compile(r"'cudagraph_mode': <CUDAGraphMode\.([A-Z_]+):"),  # the engine's config line
    re.compile(r"Overriding cudagraph_mode (?:from \w+ )?to " + _MODE),
    re.compile(r"; setting cudagraph_mode=" + _MODE),
    re.compile(r"Cudagraph mode \S+ requires piecewise capture.*Overriding to " + _MODE),
]


def parse_runner(text: str) -> dict[str, str]:
    """``{"model_runner": "V1"|"V2", "cudagraph_mode": NAME}`` from an engine log's text; a key whose
    statement is absent is left out. Both runner statements in one log (never seen) read ``V1+V2``."""
    runners: set[str] = set()
    mode = ""
    for line in text.splitlines():
        if _V2.search(line):
            runners.add("V2")
        elif _V1.search(line):
            runners.add("V1")
        for pattern in _GRAPH_MODES:
            for match in pattern.finditer(line):
                mode = match.group(1)
    out: dict[str, str] = {}
    if runners:
        out[MODEL_RUNNER] = "+".join(sorted(runners))
    if mode:
        out[CUDAGRAPH_MODE] = mode
    return out


def parse_runner_log(path: Path) -> dict[str, str]:
    """:func:`parse_runner` of the log at ``path``; empty when there is no such file."""
    if not path.is_file():
        return {}
    return parse_runner(path.read_text(errors="replace"))


def runner_from_config(vllm_config: Any) -> dict[str, str]:
    """The same two values from an engine's ``VllmConfig`` (vLLM 0.32: ``use_v2_model_runner``,
    ``compilation_config.cudagraph_mode``), for an engine whose log is not at hand (one run in the test's
    own process). The log is preferred: with vLLM's engine core in its own process, a mode its worker
    resolves later is not in this process's copy of the config. Whatever this vLLM lacks is left out."""
    out: dict[str, str] = {}
    try:
        v2 = getattr(vllm_config, "use_v2_model_runner", None)
    except Exception:  # a property of vLLM's, evaluated here: its error is not the trial's
        v2 = None
    if isinstance(v2, bool):
        out[MODEL_RUNNER] = "V2" if v2 else "V1"
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    name = getattr(mode, "name", None)
    if isinstance(name, str) and name:
        out[CUDAGRAPH_MODE] = name
    return out


# The logs an engine's directory holds: the measuring process's (tuner.engine.measure) and, for a served
# trial, the server's (tuner.engine.server).
ENGINE_LOG = "engine.log"
SERVER_LOG = "server.log"


def workdir_runner(workdir: Path) -> dict[str, str]:
    """The runner of the engine a trial's directory holds the logs of (``engine.log``, and a served
    trial's ``server.log``), for an engine that wrote no result: pruned, failed or killed."""
    return {**parse_runner_log(workdir / ENGINE_LOG), **parse_runner_log(workdir / SERVER_LOG)}
