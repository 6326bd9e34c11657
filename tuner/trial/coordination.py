"""Several workers, one study: a storage-wide lock around "is there budget left? then ask", and a
heartbeat per running trial so that a dead worker's trial goes stale and is retried elsewhere.

Optuna's own model (workers sharing one relational storage) does the rest; no scheduler of ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import text


@contextlib.contextmanager
def study_lock(storage: Any, study_name: str) -> Iterator[None]:
    """Exclusive across processes and hosts sharing ``storage``: PostgreSQL advisory lock, or a file
    lock beside a SQLite database (one host). Other backends get no lock (keep one worker there)."""
    url = str(storage.engine.url)
    if url.startswith("postgresql"):
        key = zlib.crc32(f"specdec-tuner:{study_name}".encode())
        with storage.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
        return
    database = storage.engine.url.database
    if url.startswith("sqlite") and database and database != ":memory:":
        lock_path = Path(database).with_name(Path(database).name + f".{study_name}.lock")
        with lock_path.open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    yield


class Heartbeat:
    """Records a trial's heartbeat every ``interval_s`` until stopped (what ``study.optimize`` does
    internally; the tuner drives Optuna with ask/tell so that budget checks can be atomic)."""

    def __init__(self, storage: Any, trial_id: int, interval_s: float) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trial-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a missed beat only makes the trial look older
                self._storage.record_heartbeat(self._trial_id)
            self._stop.wait(self._interval_s)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
