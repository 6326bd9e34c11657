"""EngineProcess owns its process group; a measurement backend drives the engine process's measuring."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tuner.engine import measure, offline
from tuner.engine.backend import BackendInfo, LevelResult, MeasurementBackend, RepeatHook, Workload
from tuner.engine.process import EngineNotReady, EngineProcess
from tuner.engine.request import EngineResult, ProgressEvent, RepeatMeasurement, TrialRequest
from tuner.engine.vllm_metrics import Snapshot, SpecStats, diff
from tuner.study.prompts import Prompt

# A parent that starts a child ignoring SIGTERM (as multiprocessing's resource tracker does), writes
# the child's pid, says it is ready, then waits.
PARENT = """
import subprocess, sys, time, pathlib
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
print("READY", flush=True)
time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _log_says(path: Path, text: str) -> Any:
    return lambda: path.exists() and text in path.read_text(errors="replace")


def _group(tmp_path: Path, **kwargs: Any) -> EngineProcess:
    log = tmp_path / "engine.log"
    cmd = [sys.executable, "-c", PARENT, str(tmp_path / "child.pid")]
    return EngineProcess(
        cmd, log, ready=_log_says(log, "READY"), ready_timeout_s=30, poll_s=0.05, grace_s=0.5, **kwargs
    )


def test_starts_in_its_own_session_and_reports_ready(tmp_path: Path) -> None:
    with _group(tmp_path) as engine:
        assert os.getsid(engine.pid) == engine.pid
        assert os.getpgid(engine.pid) == engine.pid
        assert os.getpgid(engine.pid) != os.getpgid(0)
        assert engine.poll() is None
        assert "READY" in (tmp_path / "engine.log").read_text()


def test_whole_group_is_gone_after_the_block(tmp_path: Path) -> None:
    with _group(tmp_path) as engine:
        pid = engine.pid
        child = int((tmp_path / "child.pid").read_text())
        assert _alive(child)
    assert not _alive(pid)
    assert not _alive(child)


def test_whole_group_is_gone_after_an_exception_in_the_block(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), _group(tmp_path, guard=False) as engine:
        pid = engine.pid
        child = int((tmp_path / "child.pid").read_text())
        raise RuntimeError("boom")
    assert not _alive(pid)
    assert not _alive(child)


def test_readiness_timeout_raises_with_the_log_tail_and_kills_the_group(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    code = "import time; print('loading the model', flush=True); time.sleep(3600)"
    engine = EngineProcess([sys.executable, "-c", code], log, ready=lambda: False, ready_timeout_s=1.0, poll_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(EngineNotReady, match="not ready within") as info, engine:
        pytest.fail("the block must not run")
    assert "loading the model" in str(info.value)
    assert info.value.exit_code is None
    assert time.monotonic() - t0 < 15
    assert engine.returncode is not None
    assert not _alive(engine.pid)


def test_exit_before_ready_raises_with_the_exit_code(tmp_path: Path) -> None:
    code = "import sys; print('ValueError: bad config', flush=True); sys.exit(3)"
    engine = EngineProcess([sys.executable, "-c", code], tmp_path / "engine.log", ready=lambda: False, poll_s=0.05)
    with pytest.raises(EngineNotReady, match="exited with code 3") as info, engine:
        pass
    assert info.value.exit_code == 3
    assert "ValueError: bad config" in str(info.value)


class FakeBackend:
    """A backend with no engine: each generation takes a fixed time and drafts a fixed number of tokens."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.counters = {"vllm:spec_decode_num_drafts": 0, "vllm:spec_decode_num_draft_tokens": 0}
        self.workload: Workload | None = None

    def start(self, llm_kwargs: Mapping[str, Any]) -> None:
        self.calls.append(f"start {llm_kwargs['model']}")

    def prepare(self, workload: Workload) -> None:
        self.workload = workload
        self.calls.append("prepare")

    def warmup(self, n_prompts: int) -> None:
        self.calls.append(f"warmup {n_prompts}")

    def measure(self, batch_size: int, repeats: int, on_repeat: RepeatHook | None = None) -> LevelResult:
        assert self.workload is not None
        level = LevelResult()
        for repeat in range(repeats):
            before = self.spec_counters()
            self.counters["vllm:spec_decode_num_drafts"] += batch_size
            self.counters["vllm:spec_decode_num_draft_tokens"] += 3 * batch_size
            m = RepeatMeasurement(
                batch_size=batch_size,
                repeat=repeat,
                output_tokens=batch_size * self.workload.max_tokens,
                elapsed_s=0.5,
                spec=diff(before, self.spec_counters()),
            )
            if repeat == 0:
                level.token_ids = [[1, 2, 3] for _ in self.workload.prompts]
            level.repeats.append(m)
            if on_repeat is not None:
                on_repeat(m)
        return level

    def spec_counters(self) -> Snapshot:
        return dict(self.counters)

    def info(self) -> BackendInfo:
        return BackendInfo(vllm_version="fake", torch_version="fake", device="cpu (fake)")

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_backend_driven_through_the_interface_gives_an_engine_result(tmp_path: Path) -> None:
    backend = FakeBackend()
    assert isinstance(backend, MeasurementBackend)
    assert isinstance(offline.OfflineBackend(), MeasurementBackend)
    request = TrialRequest(
        llm_kwargs={"model": "m"},
        prompts=[Prompt(id="a", text="a"), Prompt(id="b", text="b")],
        max_tokens=8,
        temperature=0.0,
        batch_sizes=[1, 4],
        repeats=2,
        warmup_prompts=1,
    )
    result = measure.run(request, tmp_path, backend)
    assert isinstance(result, EngineResult)
    assert backend.calls == ["start m", "prepare", "warmup 1", "stop"]
    assert [(r.batch_size, r.repeat) for r in result.repeats] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    assert result.token_ids == {1: [[1, 2, 3], [1, 2, 3]], 4: [[1, 2, 3], [1, 2, 3]]}
    assert result.repeats[-1].spec == SpecStats(drafts=4, draft_tokens=12)
    assert (result.vllm_version, result.device, result.peak_memory_bytes) == ("fake", "cpu (fake)", None)
    assert result.engine_start_s >= 0 and result.warmup_s >= 0
    events = [
        ProgressEvent.model_validate_json(line) for line in (tmp_path / measure.PROGRESS_FILE).read_text().splitlines()
    ]
    assert [e.event for e in events] == ["engine_ready"] + ["repeat"] * 4
    assert [e.measurement for e in events[1:]] == result.repeats
    # Round trip through the file the tuner reads.
    assert EngineResult.model_validate_json(result.model_dump_json()) == result


def test_secret_arguments_reach_the_backend_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class Recording(FakeBackend):
        def start(self, llm_kwargs: Mapping[str, Any]) -> None:
            seen.update(llm_kwargs)

    monkeypatch.setenv(measure.SECRET_ARGS_ENV, '{"hf_token": "s3cret"}')
    request = TrialRequest(
        llm_kwargs={"model": "m"},
        prompts=[Prompt(id="a", text="a")],
        max_tokens=1,
        temperature=0.0,
        batch_sizes=[1],
        repeats=1,
        warmup_prompts=0,
    )
    measure.run(request, tmp_path, Recording())
    assert seen == {"model": "m", "hf_token": "s3cret"}
    assert measure.SECRET_ARGS_ENV not in os.environ


def test_sigterm_ignoring_child_needs_sigkill(tmp_path: Path) -> None:
    """The grace period passes, then SIGKILL reaches the child (not just the parent)."""
    with _group(tmp_path, guard=False) as engine:
        child = int((tmp_path / "child.pid").read_text())
        os.kill(engine.pid, signal.SIGTERM)  # the parent goes; the child stays in the group
        time.sleep(0.3)
        assert _alive(child)
    assert not _alive(child)
