"""Shared fixtures. Real-engine studies are session-scoped: each engine start costs about a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = "tests.fake_engine"

# This machine's environment sets PYTHONDONTWRITEBYTECODE=1 and the venv is installed with pip --no-compile, so
# without this every Python process the tests start (each CLI run, engine, server and pre-flight probe)
# compiled torch, vLLM and MLflow from source again: `from vllm import LLM` took 32 s that way and 13 s
# from cached bytecode (2-core machine, 2026-12-04). Each module is compiled once, on its first import.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# An offline vLLM engine otherwise spawns an engine-core and a worker process, each importing torch and vLLM
# again: on the 2-core CI class machine an eager start with a draft took 27.1 s that way and 7.0 s
# in-process (benchmarks/engine_start.py, 2026-12-02). The tuner's engines inherit this from the tests; users' engines keep vLLM's
# default. Only vllm.LLM reads it (`vllm serve` keeps its processes). Tests about vLLM's own process tree
# set MULTIPROCESS back.
MULTIPROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
os.environ.setdefault(MULTIPROCESS_ENV, "0")
MULTIPROCESS = {MULTIPROCESS_ENV: "1"}

COPY_PROMPTS = [
    "Rewrite this Python function with type hints:\n\ndef add(a, b):\n    total = a + b\n    return total\n",
    "Quote this sentence exactly and then summarise it: 'The quick brown fox jumps over the lazy dog.'",
    "Return this list with every item in upper case:\n- apples\n- bread\n- milk\n- eggs",
]
OPEN_PROMPTS = ["Write a short poem about the sea.", "Explain what a hash map is."]


ENV_PREFIX = "[specdec-env] "


def write_prompts(path: Path, n: int = 5) -> Path:
    texts = (COPY_PROMPTS + OPEN_PROMPTS) * 4
    with path.open("w") as fh:
        for i, text in enumerate(texts[:n]):
            fh.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": text}]}) + "\n")
    return path


def study_dict(tmp: Path, name: str = "test-study", **overrides: Any) -> dict[str, Any]:
    """A small study in ``tmp``; ``overrides`` replace top-level sections."""
    prompts = write_prompts(tmp / "prompts.jsonl")
    data: dict[str, Any] = {
        "name": name,
        "target": {
            "model": "demo:SmolLM2-135M-Instruct",
            "dtype": "float32",
            "max_model_len": 512,
            "engine_args": {"kv_cache_memory_bytes": 512 * 1024 * 1024},
        },
        "candidates": [
            {"name": "none", "method": "none"},
            {
                "name": "ngram",
                "method": "ngram",
                "num_speculative_tokens": [1, 6],
                "prompt_lookup_max": [2, 4],
                "prompt_lookup_min": [1, 2],
            },
            {
                "name": "draft-4l",
                "method": "draft_model",
                "model": "demo:SmolLM2-135M-Instruct-4L",
                "num_speculative_tokens": [1, 3],
            },
        ],
        "search": {"enforce_eager": [True], "seed": 1, "startup_trials": 2},
        "workload": {"prompts": str(prompts), "max_tokens": 24, "batch_sizes": [4], "repeats": 2, "warmup_prompts": 1},
        "budget": {"trials": 3, "trial_timeout_s": 600},
        # Off unless a test is about it: each confirmation engine is one more engine start.
        "confirm": {"enabled": False},
        "storage": f"sqlite:///{tmp / 'optuna.db'}",
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
    }
    data.update(overrides)
    return data


def one_wave(data: dict[str, Any]) -> dict[str, Any]:
    """A real engine's workload made short: four prompts (three copy tasks), so that batch size 4 is one wave,
    of 16 tokens each, instead of 5 of 24 (2 waves at batch size 4)."""
    write_prompts(Path(data["workload"]["prompts"]), n=4)
    data["workload"]["max_tokens"] = 16
    return data


def write_study(tmp: Path, data: dict[str, Any]) -> Path:
    path = tmp / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 3000) -> CliResult:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture()
def fake_engine(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SPECDEC_TUNER_ENGINE_MODULE", FAKE_ENGINE)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return FAKE_ENGINE


@dataclass
class RealStudy:
    dir: Path
    study_path: Path
    storage: str
    tracking_uri: str
    export_path: Path
    result: CliResult


@pytest.fixture(scope="session")
def demo_models() -> None:
    from tuner.models.demo import prepare_demo

    prepare_demo(log=lambda m: None)


@pytest.fixture(scope="session")
def real_study(tmp_path_factory: pytest.TempPathFactory, demo_models: None) -> RealStudy:
    """One real CPU-vLLM study shared by the engine tests (test_engine_study, test_schedule_engine): baseline,
    an n-gram trial, a draft trial."""
    tmp = tmp_path_factory.mktemp("real-study")
    data = study_dict(tmp, name="real-study")
    data["workload"]["batch_sizes"] = [1, 4]  # per-level metrics at two concurrencies
    one_wave(data)  # also what the tests that resume this study measure (interrupts, the schedule's validation)
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
        {"candidate": "draft-4l", "num_speculative_tokens": 2},
    ]
    # Every trial completes: test_schedule_engine derives a schedule from their k's (pruning has its own test).
    data["pruning"] = {"enabled": False}
    # The smallest confirmation: one fresh engine each for the best speculative trial and the baseline.
    # Measured whatever the CPU says: the engines are what test_finalists_confirmed_in_fresh_engines checks.
    data["confirm"] = {"enabled": True, "rounds": 1, "repeats": 1, "skip_when_behind": False}
    # target.env reaches every engine: a log prefix that test_engine_study finds in every engine's log. Not
    # MULTIPROCESS_ENV: the tests set it in the process environment, and test_interrupt's copies of this study
    # set it back to 1 for vLLM's process tree (a study's env would override them, and it is fingerprinted).
    data["target"]["env"] = {"VLLM_LOGGING_PREFIX": ENV_PREFIX}
    path = write_study(tmp, data)
    export = tmp / "best.yaml"
    result = run_cli(["optimize", "--study", str(path), "--export", str(export)], cwd=tmp)
    return RealStudy(tmp, path, data["storage"], data["tracking"]["uri"], export, result)
