"""Validate speculative settings with vLLM's own ``SpeculativeConfig`` rules, without an engine.

Runs as ``python -m tuner.study.vllm_checks`` in a subprocess (importing vLLM is slow and heavy; the
tuner process stays light). Only configurations that need no model are built (methods whose
``checkable_without_model`` is true in ``tuner.study.methods``: n-gram, suffix):
a draft model's config would need the target's, which costs an engine-sized load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def validate(configs: list[dict[str, Any]]) -> list[str | None]:
    from vllm.config import SpeculativeConfig

    errors: list[str | None] = []
    for config in configs:
        try:
            SpeculativeConfig(**config)
            errors.append(None)
        except Exception as exc:
            errors.append(_describe(exc))
    return errors


def _describe(exc: Exception) -> str:
    details = getattr(exc, "errors", None)
    if callable(details):
        first = details()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def validate_in_subprocess(configs: list[dict[str, Any]], timeout_s: float = 180.0) -> list[str | None] | None:
    """None when vLLM cannot be asked (not installed, or too slow): the engine will check instead."""
    if not configs:
        return []
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.study.vllm_checks"],
            input=json.dumps(configs),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        return None
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        result = json.loads(last)
    except json.JSONDecodeError:
        return None
    return result if isinstance(result, list) else None


if __name__ == "__main__":
    print(json.dumps(validate(json.loads(sys.stdin.read()))))
