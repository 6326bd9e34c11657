"""Servers the project starts or recommends listen on loopback unless the user says otherwise; a recipe
that must listen on the network says what protects it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks import config_check
from tests.conftest import ROOT

WILDCARD = "0.0.0.0"
# Words that show a recipe listening beyond loopback says who may connect.
AUTH_NOTE = re.compile(r"basic-auth|authenticat|NetworkPolicy|network policy|pg_hba|firewall", re.I)
NEARBY_LINES = 25
SKIP = ("benchmarks/results/",)  # recorded output, not recommendations


def test_config_check_serves_on_loopback_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = config_check.serve_command(tmp_path / "best.yaml", 8011)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"

    seen: dict[str, Any] = {}

    def fake_serve(config: Path, port: int, timeout_s: float, log_path: Path, host: str = "") -> dict[str, Any]:
        seen["cmd"] = config_check.serve_command(config, port, host)
        return {"ok": True}

    monkeypatch.setattr(config_check, "serve", fake_serve)
    out = tmp_path / "check.json"
    assert config_check.main(["serve", "--config", str(tmp_path / "best.yaml"), "--out", str(out)]) == 0
    assert seen["cmd"][seen["cmd"].index("--host") + 1] == "127.0.0.1"
    config_check.main(["serve", "--config", "x.yaml", "--out", str(out), "--host", "10.0.0.5"])
    assert seen["cmd"][seen["cmd"].index("--host") + 1] == "10.0.0.5"  # the user's choice is kept


def test_a_wildcard_server_is_checked_through_loopback() -> None:
    assert config_check._reachable("127.0.0.1") == "127.0.0.1"
    assert config_check._reachable(WILDCARD) == "127.0.0.1"
    assert config_check._reachable("::1") == "[::1]"
    assert config_check._reachable("gpu-host.internal") == "gpu-host.internal"


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        names = out.split()
    except (OSError, subprocess.CalledProcessError):  # an export without .git: every file under the root
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    this = str(Path(__file__).resolve().relative_to(ROOT))
    return [ROOT / n for n in names if n != this and not n.startswith(SKIP)]


def test_no_file_recommends_listening_everywhere_without_saying_what_protects_it() -> None:
    unprotected = []
    for path in _tracked_files():
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(lines):
            if WILDCARD not in line and not re.search(r"--host[= ]+(?!127\.0\.0\.1|localhost|::1)[\w<]", line):
                continue
            context = "\n".join(lines[max(0, i - NEARBY_LINES) : i + NEARBY_LINES + 1])
            if not AUTH_NOTE.search(context):
                unprotected.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert not unprotected, "servers listening beyond loopback with no word on who may connect:\n" + "\n".join(
        unprotected
    )


def test_distributed_recipes_default_to_loopback() -> None:
    text = (ROOT / "docs" / "distributed.md").read_text()
    first = re.search(r"mlflow server .*?--port", text, re.S)
    assert first is not None and "--host 127.0.0.1" in first.group(0)
    assert "--app-name basic-auth" in text and "MLFLOW_TRACKING_PASSWORD" in text
