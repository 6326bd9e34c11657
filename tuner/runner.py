"""Run one trial's engine in its own process group, with a hard timeout.

A crash, hang or out-of-memory ends the trial, never the study: on any exit path the whole
process group (the engine and the processes vLLM spawned) is killed, which returns its memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tuner import engine_worker
from tuner.measurement import EngineResult, ProgressEvent, TrialRequest
from tuner.redaction import is_secret_key

FailureClass = Literal["timeout", "oom", "engine_error", "invalid_config"]
# Called for every progress event; returning a reason string stops the engine (pruning).
ProgressHook = Callable[[ProgressEvent], str | None]

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory", "available memory on node")
_INVALID_MARKERS = (
    "validationerror",
    "speculativeconfig",
    "not supported",
    "unsupported speculative",
    "num_speculative_tokens",
    "vocab",
    "must be <=",
    "without speculative model",
)
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def env_with_project() -> dict[str, str]:
    """This process's environment with the project first on PYTHONPATH (kept: the GPU host needs its own)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# The module run as a trial's engine process; tests of the search logic point it at a fake engine.
ENGINE_MODULE_ENV = "SPECDEC_TUNER_ENGINE_MODULE"


@dataclass
class RunOutcome:
    result: EngineResult | None = None
    failure: FailureClass | None = None
    pruned_reason: str | None = None
    message: str = ""
    returncode: int | None = None
    wall_s: float = 0.0
    events: list[ProgressEvent] = field(default_factory=list)
    log_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.result is not None


def _die_with_parent() -> None:
    """Linux: the engine gets SIGKILL if the tuner dies, even by kill -9."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_group(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL, to the engine's whole process group.

    The engine was started in a session of its own, so its group id is its pid: the group (vLLM's
    engine-core and worker processes) is found even after the engine process itself has died.
    """
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(pgid):
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.2)
        if not _group_alive(pgid):
            break
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def log_tail(path: Path | None, lines: int = 60) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64_000))
        text = fh.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def classify_failure(returncode: int | None, log_text: str) -> tuple[FailureClass, str]:
    lowered = log_text.lower()
    if returncode == -signal.SIGKILL or any(m in lowered for m in _OOM_MARKERS):
        return "oom", _last_error_line(log_text) or "engine killed (out of memory?)"
    line = _last_error_line(log_text)
    if any(m in line.lower() for m in _INVALID_MARKERS):
        return "invalid_config", line
    return "engine_error", line or f"engine exited with code {returncode}"


def _last_error_line(log_text: str) -> str:
    """The engine's last error, with the detail lines a pydantic ValidationError puts below it."""
    lines = log_text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        stripped = lines[i].strip()
        if "Error" in stripped and not stripped.startswith(("File ", "Traceback")):
            if "validation error" in stripped.lower():
                detail = [_strip_log_prefix(x) for x in lines[i + 1 : i + 3] if x.strip()]
                stripped = " ".join([stripped, *detail])
            return stripped[-500:]
    return ""


def _strip_log_prefix(line: str) -> str:
    """vLLM prefixes subprocess lines with '(EngineCore pid=N) ERROR date [file:line]'."""
    return line.split("] ", 1)[-1].strip() if line.lstrip().startswith("(") else line.strip()


def run_engine(
    request: TrialRequest,
    workdir: Path,
    timeout_s: float,
    on_progress: ProgressHook | None = None,
    poll_s: float = 0.5,
) -> RunOutcome:
    workdir.mkdir(parents=True, exist_ok=True)
    for name in (engine_worker.RESULT_FILE, engine_worker.PROGRESS_FILE):
        (workdir / name).unlink(missing_ok=True)
    secrets = {k: v for k, v in request.llm_kwargs.items() if is_secret_key(k)}
    public = request.model_copy(
        update={"llm_kwargs": {k: v for k, v in request.llm_kwargs.items() if k not in secrets}}
    )
    request_path = workdir / engine_worker.REQUEST_FILE
    request_path.write_text(public.model_dump_json(indent=2))
    log_path = workdir / engine_worker.LOG_FILE
    env = env_with_project()
    env["PYTHONUNBUFFERED"] = "1"
    env[engine_worker.SECRET_ARGS_ENV] = json.dumps(secrets)  # never written to disk

    outcome = RunOutcome(log_path=log_path)
    start = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                os.environ.get(ENGINE_MODULE_ENV, "tuner.engine_worker"),
                str(request_path),
                str(workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env=env,
        )
        try:
            _watch(proc, workdir, start + timeout_s, outcome, on_progress, poll_s)
        finally:
            kill_group(proc)
    outcome.returncode = proc.returncode
    outcome.wall_s = time.monotonic() - start
    if outcome.failure or outcome.pruned_reason:
        return outcome
    result_path = workdir / engine_worker.RESULT_FILE
    if result_path.exists():
        outcome.result = EngineResult.model_validate_json(result_path.read_text())
        return outcome
    outcome.failure, outcome.message = classify_failure(proc.returncode, log_tail(log_path, 400))
    return outcome


def _watch(
    proc: subprocess.Popen[bytes],
    workdir: Path,
    deadline: float,
    outcome: RunOutcome,
    on_progress: ProgressHook | None,
    poll_s: float,
) -> None:
    progress_path = workdir / engine_worker.PROGRESS_FILE
    result_path = workdir / engine_worker.RESULT_FILE
    offset = 0
    while True:
        # Once the result is written the engine's own shutdown is dead time: the group is killed.
        finished = proc.poll() is not None or result_path.exists()
        offset = _read_events(progress_path, offset, outcome, on_progress)
        if outcome.pruned_reason or finished:
            return
        if time.monotonic() > deadline:
            outcome.failure = "timeout"
            outcome.message = "engine did not finish within the trial timeout (budget.trial_timeout_s)"
            return
        time.sleep(poll_s)


def _read_events(path: Path, offset: int, outcome: RunOutcome, on_progress: ProgressHook | None) -> int:
    if not path.exists():
        return offset
    with path.open("rb") as fh:
        fh.seek(offset)
        data = fh.read()
    complete, _, _ = data.rpartition(b"\n")
    if not complete:
        return offset
    for raw in complete.split(b"\n"):
        offset += len(raw) + 1
        event = ProgressEvent.model_validate_json(raw)
        outcome.events.append(event)
        if on_progress is not None:
            reason = on_progress(event)
            if reason:
                outcome.pruned_reason = reason
                break  # events after the decision were not needed to make it
    return offset
