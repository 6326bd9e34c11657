"""A trial's ``vllm serve``: started from the config file export would write, on loopback, behind a fresh key.

The server is vLLM's own (``python -m tuner.engine.vllm_cli serve``, see that module for why not the
console script). It runs in a process group of its own inside the trial's engine process's session:
:class:`~tuner.engine.process.EngineProcess` kills that group when the trial ends, and the tuner,
which watches the session, reaches it even if the engine process is killed or the tuner itself dies.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tuner.engine.process import EngineProcess
from tuner.engine.runner_log import SERVER_LOG
from tuner.engine.serve_file import serve_yaml
from tuner.engine.vllm_metrics import Snapshot, snapshot_from_prometheus

HOST = "127.0.0.1"
CONFIG_FILE = "serve.yaml"  # a .yaml name: vLLM's --config reads nothing else
LOG_FILE = SERVER_LOG
# Credentials of vllm.LLM keyword arguments, which a server reads from its environment instead.
_SECRET_ENV = {"hf_token": "HF_TOKEN"}


def serve_args(config_path: Path, port: int) -> list[str]:
    """``vllm serve``'s arguments for a trial's server (pre-flight parses the same, without a server)."""
    return ["serve", "--config", str(config_path), "--host", HOST, "--port", str(port)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """``with VllmServer(llm_kwargs, workdir, start_timeout_s) as server:`` is a healthy server, or raises
    :class:`~tuner.engine.process.EngineNotReady` with the end of its log."""

    def __init__(self, llm_kwargs: dict[str, Any], workdir: Path, start_timeout_s: float) -> None:
        self.llm_kwargs = llm_kwargs
        self.workdir = workdir
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.api_key = secrets.token_hex(16)
        self.config_path = workdir / CONFIG_FILE
        self.log_path = workdir / LOG_FILE
        self._process: EngineProcess | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tuner.engine.vllm_cli", *serve_args(self.config_path, self.port)]

    def __enter__(self) -> VllmServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(serve_yaml(self.llm_kwargs))
        env = dict(os.environ)
        env["VLLM_API_KEY"] = self.api_key  # not on the command line, where any local user could read it
        for key, name in _SECRET_ENV.items():
            if self.llm_kwargs.get(key):
                env[name] = str(self.llm_kwargs[key])
        self._process = EngineProcess(
            self.command(),
            self.log_path,
            env,
            ready=self.healthy,
            ready_timeout_s=self.start_timeout_s,
            poll_s=1.0,
            grace_s=15.0,  # vLLM's own shutdown stops its engine core cleanly within this on SIGTERM
            guard=False,
            new_session=False,
        )
        self._process.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def healthy(self) -> bool:
        # The socket is bound before the engine starts, so a request waits in the backlog: keep it short.
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30.0) as response:
            return str(response.read().decode())

    def spec_counters(self) -> Snapshot:
        return snapshot_from_prometheus(self.metrics_text())
