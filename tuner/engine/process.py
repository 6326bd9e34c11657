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

from tuner.engine import process_guard
from tuner.engine import request as engine_files
from tuner.engine.request import EngineResult, ProgressEvent, TrialRequest
from tuner.environment import STORAGE_ENV, TRACKING_ENV
from tuner.redaction import is_secret_key

# oom: out of memory, by the engine's log or the kernel's OOM-kill record; killed: SIGKILL with no such record.
FailureClass = Literal["timeout", "oom", "killed", "engine_error", "invalid_config"]
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
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def env_with_project() -> dict[str, str]:
    """This process's environment with the project first on PYTHONPATH (kept: the GPU host needs its own)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


# The module run as a trial's engine process; tests of the search logic point it at a fake engine.
ENGINE_MODULE_ENV = "SPECDEC_TUNER_ENGINE_MODULE"
DEFAULT_ENGINE_MODULE = "tuner.engine.measure"


def engine_module() -> str:
    return os.environ.get(ENGINE_MODULE_ENV, DEFAULT_ENGINE_MODULE)


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


class EngineNotReady(RuntimeError):
    """The engine process exited, or its readiness check did not pass in time; the message ends with the log's tail.

    ``exit_code``: the process's exit code when it exited before it was ready, else None (timed out)."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class EngineProcess:
    """A command in a session (and process group) of its own, its output in ``log_path``.

    ``with EngineProcess(...) as engine:`` starts it (SIGKILL if this process dies: ``PR_SET_PDEATHSIG``;
    with ``guard``, also registered with :mod:`tuner.engine.process_guard`, so that even ``kill -9`` of
    the tuner takes the whole group), waits for ``ready`` when one is given, and on any exit from the
    block kills the whole process group. ``ready`` is polled until it returns True; if the process
    exits first or ``ready_timeout_s`` passes, :class:`EngineNotReady` is raised with the log's tail
    (the group is killed before).
    """

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *,
        ready: Callable[[], bool] | None = None,
        ready_timeout_s: float = 300.0,
        poll_s: float = 0.5,
        grace_s: float = 3.0,
        guard: bool = True,
        new_session: bool = True,
    ) -> None:
        self.command = command
        self.log_path = log_path
        self.env = dict(os.environ) if env is None else dict(env)
        self.ready = ready
        self.ready_timeout_s = ready_timeout_s
        self.poll_s = poll_s
        self.grace_s = grace_s
        self.guard = guard
        # False: a process group of its own inside this process's session, so that whoever watches
        # this session (the tuner, for a trial's engine process) also reaches it.
        self.new_session = new_session
        self.guard_id: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def __enter__(self) -> EngineProcess:
        env = self.env
        if self.guard:
            process_guard.start_guard()
            self.guard_id = process_guard.new_id()
            # This process's chain of ids (its own appended by start_guard), then the engine's.
            env[process_guard.RUN_ENV] = process_guard.with_id(os.environ.get(process_guard.RUN_ENV), self.guard_id)
        self.started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.new_session,
                process_group=None if self.new_session else 0,
                preexec_fn=_die_with_parent,
                env=env,
            )
        if self.guard and self.new_session:
            process_guard.watch_session(self.proc.pid)
        if self.ready is not None:
            try:
                self.wait_ready()
            except BaseException:
                self.stop()
                raise
        return self

    def wait_ready(self) -> None:
        assert self.proc is not None and self.ready is not None
        deadline = self.started_at + self.ready_timeout_s
        exit_code = None
        while True:
            if self.ready():
                return
            if self.proc.poll() is not None:
                exit_code = self.proc.returncode
                problem = f"exited with code {self.proc.returncode} before it was ready"
                break
            if time.monotonic() > deadline:
                problem = f"was not ready within {self.ready_timeout_s:g} s"
                break
            time.sleep(self.poll_s)
        tail = log_tail(self.log_path, 30)
        raise EngineNotReady(f"{self.command[0]} {problem}; the end of {self.log_path}:\n{tail}", exit_code)

    def stop(self) -> None:
        """Kill the whole group (idempotent)."""
        if self.proc is None:
            return
        kill_group(self.proc, self.grace_s)
        if self.guard_id is not None:
            # Processes of the engine's that left its process group but not its session or environment.
            process_guard.kill_marked(self.guard_id, {self.proc.pid})
            process_guard.unwatch_session(self.proc.pid)
            self.guard_id = None

    def __exit__(self, *exc: object) -> None:
        self.stop()


def progress_ready(workdir: Path) -> Callable[[], bool]:
    """Readiness of a trial's engine process: its progress file has the ``engine_ready`` event."""
    path = workdir / engine_files.PROGRESS_FILE

    def ready() -> bool:
        try:
            return b'"engine_ready"' in path.read_bytes()
        except OSError:
            return False

    return ready


def log_tail(path: Path | None, lines: int = 60) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64_000))
        text = fh.read().decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


def classify_failure(returncode: int | None, log_text: str, oom_killed: bool = False) -> tuple[FailureClass, str]:
    """``oom_killed``: the kernel's OOM killer killed a process of ours while the engine ran."""
    lowered = log_text.lower()
    if oom_killed or any(m in lowered for m in _OOM_MARKERS):
        return "oom", _last_error_line(log_text) or "engine killed by the kernel's OOM killer (out of memory)"
    if returncode == -signal.SIGKILL:
        return "killed", (
            "engine killed by SIGKILL with no out-of-memory record (the kernel's OOM-kill counter did not move "
            "and the log names no memory error): killed by a person, a scheduler or another program"
        )
    line = _last_error_line(log_text)
    if any(m in line.lower() for m in _INVALID_MARKERS):
        return "invalid_config", line
    return "engine_error", line or f"engine exited with code {returncode}"


def oom_kills() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (its sub-cgroups included:
    the engine's), else on the whole machine; None where none is readable."""
    for path in _oom_counters():
        try:
            for line in path.read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def _oom_counters() -> list[Path]:
    root = Path("/sys/fs/cgroup")
    paths = []
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        groups = []
    for line in groups:  # "0::/path" (v2), "4:memory:/path" (v1)
        if line.count(":") < 2:
            continue
        _, controllers, group = line.split(":", 2)
        if controllers == "":
            paths.append(root / group.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            paths.append(root / "memory" / group.lstrip("/") / "memory.oom_control")
    # Inside a container the mounts may be rooted at the container's own cgroup.
    paths += [root / "memory.events", root / "memory" / "memory.oom_control", Path("/proc/vmstat")]
    return paths


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
    for name in (engine_files.RESULT_FILE, engine_files.PROGRESS_FILE):
        (workdir / name).unlink(missing_ok=True)
    secrets = {k: v for k, v in request.llm_kwargs.items() if is_secret_key(k)}
    public = request.model_copy(
        update={"llm_kwargs": {k: v for k, v in request.llm_kwargs.items() if k not in secrets}}
    )
    request_path = workdir / engine_files.REQUEST_FILE
    request_path.write_text(public.model_dump_json(indent=2))
    log_path = workdir / engine_files.LOG_FILE
    env = env_with_project()
    env["PYTHONUNBUFFERED"] = "1"
    env[engine_files.SECRET_ARGS_ENV] = json.dumps(secrets)  # never written to disk
    env.update(request.env)
    for name in (STORAGE_ENV, TRACKING_ENV):  # the engine needs neither (they may carry passwords)
        env.pop(name, None)
    ooms_before = oom_kills()

    outcome = RunOutcome(log_path=log_path)
    start = time.monotonic()
    module = engine_module()
    command = [sys.executable, "-m", module, str(request_path), str(workdir)]
    # No readiness wait here: the progress events (engine_ready among them) are watched with the trial's timeout.
    with EngineProcess(command, log_path, env) as engine:
        proc = engine.proc
        assert proc is not None
        _watch(proc, workdir, start + timeout_s, outcome, on_progress, poll_s)
    outcome.returncode = proc.returncode
    outcome.wall_s = time.monotonic() - start
    if outcome.failure or outcome.pruned_reason:
        return outcome
    result_path = workdir / engine_files.RESULT_FILE
    if result_path.exists():
        outcome.result = EngineResult.model_validate_json(result_path.read_text())
        return outcome
    ooms_after = oom_kills()
    oom_killed = ooms_before is not None and ooms_after is not None and ooms_after > ooms_before
    outcome.failure, outcome.message = classify_failure(proc.returncode, log_tail(log_path, 400), oom_killed)
    return outcome


def _watch(
    proc: subprocess.Popen[bytes],
    workdir: Path,
    deadline: float,
    outcome: RunOutcome,
    on_progress: ProgressHook | None,
    poll_s: float,
) -> None:
    progress_path = workdir / engine_files.PROGRESS_FILE
    result_path = workdir / engine_files.RESULT_FILE
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
