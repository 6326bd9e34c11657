"""Real servers on loopback for the multi-worker tests: PostgreSQL and an MLflow tracking server."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError("PostgreSQL server binaries missing: run scripts/services/postgres.sh")
    return found[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_server() -> Iterator[str]:
    """A throw-away cluster; yields a SQLAlchemy URL of an empty database."""
    root = Path(tempfile.mkdtemp(prefix="specdec-pg-", dir="/tmp"))
    os.chmod(root, 0o755)
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
    port = free_port()
    subprocess.run(
        _as_postgres([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    subprocess.run(
        _as_postgres(
            [
                _pg_bin("pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "log"),
                "-w",
                "-o",
                f"-h 127.0.0.1 -p {port} -k {root} -c max_connections=200",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            _as_postgres([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "tuner"]),
            check=True,
            capture_output=True,
        )
        subprocess.run(
            _as_postgres([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow"]),
            check=True,
            capture_output=True,
        )
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/tuner"
    finally:
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def mlflow_server(backend_uri: str, artifacts: Path) -> Iterator[str]:
    port = free_port()
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    log = (artifacts.parent / f"mlflow-server-{port}.log").open("wb")
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts-destination",
            str(artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # MLflow 3's job runner starts three more Python processes (huey consumers) that import MLflow
        # beside the tests' engines on a 2-core machine; the tuner uses no MLflow jobs.
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start; see {log.name}")
            time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        log.close()
