"""A SIGKILLed engine is labelled out-of-memory only with evidence of it."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from tuner.engine import process as runner
from tuner.engine.request import TrialRequest
from tuner.study.prompts import Prompt


def _run(tmp_path: Path, k: int, **fake: Any) -> runner.RunOutcome:
    request = TrialRequest(
        llm_kwargs={"model": "fake", "speculative_config": {"method": "ngram", "num_speculative_tokens": k}, **fake},
        prompts=[Prompt(id="1", text="Once upon a time")],
        max_tokens=8,
        temperature=0.0,
        batch_sizes=[1],
        repeats=1,
        warmup_prompts=0,
    )
    return runner.run_engine(request, tmp_path / f"trial-{k}", timeout_s=120, poll_s=0.1)


@pytest.fixture()
def oom_counter(monkeypatch: pytest.MonkeyPatch, fake_engine: str) -> list[int | None]:
    """The kernel's OOM-kill counter as the runner reads it, before and after the engine (stand-in)."""
    counts: list[int | None] = [7, 7]
    reads = iter(range(10))
    monkeypatch.setattr(runner, "oom_kills", lambda: counts[min(next(reads), 1)])
    return counts


def test_sigkill_without_evidence_is_killed_not_oom(tmp_path: Path, oom_counter: list[int | None]) -> None:
    outcome = _run(tmp_path, 2, fake_kill_k=2)
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.failure == "killed", outcome.message
    assert "no out-of-memory record" in outcome.message


def test_sigkill_with_an_oom_error_in_the_log_is_oom(tmp_path: Path, oom_counter: list[int | None]) -> None:
    outcome = _run(tmp_path, 3, fake_oom_k=3)
    assert outcome.failure == "oom", outcome.message
    assert "CUDA out of memory" in outcome.message


def test_sigkill_while_the_kernel_counted_an_oom_kill_is_oom(tmp_path: Path, oom_counter: list[int | None]) -> None:
    oom_counter[1] = 8  # the cgroup's memory.events oom_kill moved during the trial
    outcome = _run(tmp_path, 2, fake_kill_k=2)
    assert outcome.failure == "oom", outcome.message
    assert "OOM killer" in outcome.message


def test_oom_counter_is_read_from_the_kernel() -> None:
    assert isinstance(runner.oom_kills(), int)  # Linux: a memory cgroup's count, or /proc/vmstat's


def test_classification() -> None:
    assert runner.classify_failure(-signal.SIGKILL, "loading weights\n")[0] == "killed"
    assert runner.classify_failure(-signal.SIGKILL, "loading weights\n", oom_killed=True)[0] == "oom"
    assert runner.classify_failure(1, "RuntimeError: CUDA out of memory\n")[0] == "oom"
    assert runner.classify_failure(1, "RuntimeError: Engine core initialization failed\n")[0] == "engine_error"
