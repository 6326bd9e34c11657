"""Environment variables the tuner reads, named once for the CLI, the workers it starts and the engines
(which must not inherit them: they may carry database passwords), and the one it sets for vLLM."""

import os

# Defaults for --storage and --tracking-uri: URLs with passwords stay out of the command line (and `ps`).
STORAGE_ENV = "SPECDEC_TUNER_STORAGE"
TRACKING_ENV = "SPECDEC_TUNER_TRACKING_URI"


def spawn_engine_cores() -> None:
    """Have vLLM spawn, not fork, the engine core of an ``LLM`` built in this process.

    On a GPU host vLLM forks it unless CUDA is already initialised, and a child forked after this process ran
    torch's OpenMP pool (widening the 13 GB target, for one) hangs in its first parallel torch op: libgomp is
    not fork-safe (benchmarks/fork_after_openmp.py). Three GPU sessions lost the head's generation this way,
    silent after "Using V2 Model Runner" (docs/measurement-log.md, 2026-12-07). The CPU platform spawns anyway.
    Trials need none of this: each engine runs in a fresh ``tuner.engine.measure`` process."""
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
