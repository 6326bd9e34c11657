"""Nothing the tuner starts outlives it, not even after ``kill -9``.

``PR_SET_PDEATHSIG`` on the engine reaches the engine's own process only. vLLM's engine-core and
worker processes (and ``multiprocessing``'s resource tracker, which ignores SIGTERM and waits for
them) were found alive, reparented to init, after ``kill -9`` of the tuner. So a guard process,
started before anything else, waits for the tuner to end (end of file on a pipe that only the
tuner holds, however it ends) and then kills:

- every process in the session of an engine still running (the tuner starts each engine in a
  session of its own and tells the guard on the pipe); vLLM's processes stay in it;
- every process still carrying the tuner's id in ``SPECDEC_TUNER_RUN_ID``: children inherit it
  whatever session they move to. (Not enough alone: vLLM's processes set their title, which blanks
  what ``/proc/PID/environ`` shows.) The value is a chain, ``outer/inner``: the tuner appends its id
  to one it inherited (a worker of ``optimize --workers``), so one id reaches what one process started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

RUN_ENV = "SPECDEC_TUNER_RUN_ID"
_guard: subprocess.Popen[bytes] | None = None
_pipe: list[int] = []  # the write end of the guard's input


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def with_id(chain: str | None, run_id: str) -> str:
    return f"{chain}/{run_id}" if chain else run_id


def start_guard() -> str:
    """Mark this process's future children with a new id and start its guard (once). Returns the id."""
    global _guard
    if _guard is not None:
        return os.environ[RUN_ENV].rsplit("/", 1)[-1]
    run_id = new_id()
    env = dict(os.environ)  # the guard carries the ids this process inherited, not its own
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    read_end, write_end = os.pipe()  # not inheritable: the tuner's children never hold the write end
    _guard = subprocess.Popen(
        [sys.executable, "-m", "tuner.engine.process_guard", run_id],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # Ctrl-C in the terminal reaches the tuner, not its guard
    )
    os.close(read_end)
    _pipe.append(write_end)  # closed by the kernel when this process ends, however it ends
    os.environ[RUN_ENV] = with_id(os.environ.get(RUN_ENV), run_id)
    return run_id


def watch_session(sid: int) -> None:
    """The guard kills this session if the tuner dies while it runs."""
    _tell(f"+{sid}\n")


def unwatch_session(sid: int) -> None:
    """The session is gone (its id may be reused): the guard forgets it."""
    _tell(f"-{sid}\n")


def _tell(line: str) -> None:
    if _pipe:
        try:
            os.write(_pipe[0], line.encode())
        except OSError:  # the guard is gone; nothing to tell
            pass


def marked(run_id: str) -> list[int]:
    """Processes whose environment carries ``run_id`` in their ``SPECDEC_TUNER_RUN_ID`` chain."""
    prefix = f"{RUN_ENV}=".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix) and run_id in item[len(prefix) :].decode(errors="replace").split("/"):
                found.append(int(entry.name))
                break
    return found


def in_session(sid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def kill_marked(run_id: str, sessions: set[int] | None = None, rounds: int = 20) -> None:
    """SIGKILL every process carrying ``run_id`` or in one of ``sessions``, again while new ones appear
    (a dying parent may still fork)."""
    for _ in range(rounds):
        pids = set(marked(run_id))
        for sid in sessions or ():
            pids.update(in_session(sid))
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sessions: set[int] = set()
    for line in sys.stdin.buffer:  # ends when the tuner is gone
        text = line.decode().strip()
        if text[:1] == "+":
            sessions.add(int(text[1:]))
        elif text[:1] == "-":
            sessions.discard(int(text[1:]))
    kill_marked(argv[0], sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
