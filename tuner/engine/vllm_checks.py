"""Validate speculative settings with vLLM's own ``SpeculativeConfig`` rules, without an engine.

Runs as ``python -m tuner.engine.vllm_checks`` in a subprocess (importing vLLM is slow and heavy; the
tuner process stays light). Only configurations that need no model are built (methods whose
``checkable_without_model`` is true in ``tuner.study.methods``: n-gram, suffix):
a draft model's config would need the target's, which costs an engine-sized load. The same process
checks the target's engine arguments the way a trial's engine takes them (names for ``vllm.LLM``,
``vllm serve``'s parser for the served config file), so a typo fails the study before any engine starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# Probes that are not speculative configs: a trial's engine arguments, checked as its engine takes them.
LLM_KWARGS = "__vllm_llm_kwargs__"  # {LLM_KWARGS: [names]}: offline, vllm.LLM(**kwargs) -> EngineArgs
SERVE_FILE = "__vllm_serve_file__"  # {SERVE_FILE: yaml text}: served, `vllm serve --config FILE`


def validate(configs: list[dict[str, Any]]) -> list[str | None]:
    from vllm.config import SpeculativeConfig

    errors: list[str | None] = []
    for config in configs:
        if LLM_KWARGS in config:
            errors.append(check_llm_kwargs(config[LLM_KWARGS]))
            continue
        if SERVE_FILE in config:
            errors.append(check_serve_file(config[SERVE_FILE]))
            continue
        try:
            SpeculativeConfig(**config)
            errors.append(None)
        except Exception as exc:
            errors.append(_describe(exc))
    return errors


def check_llm_kwargs(names: list[str]) -> str | None:
    """Names ``vllm.LLM`` would not take: it passes its keyword arguments on to ``EngineArgs``."""
    import dataclasses
    import inspect

    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:  # laid out otherwise: no verdict, the engine will say
        return None
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    unknown = [n for n in names if n not in fields]
    if unknown:  # a few are LLM's own (chat_template): import it (seconds) only then
        try:
            from vllm import LLM

            own = inspect.signature(LLM.__init__).parameters.values()
            unknown = [n for n in unknown if n not in {p.name for p in own if p.kind == p.KEYWORD_ONLY}]
        except ImportError:
            pass
    return f"vLLM has no engine argument {', '.join(unknown)}" if unknown else None


def check_serve_file(text: str) -> str | None:
    """``vllm serve``'s own parser and validation on the config file a served trial starts from (the
    serve subcommand alone: parsing only, no server)."""
    import contextlib
    import io
    import tempfile

    from tuner.engine.server import serve_args

    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser(prog="vllm")
        command = ServeSubcommand()
        command.subparser_init(parser.add_subparsers(dest="subparser"))
    except Exception:  # a vLLM whose CLI is laid out otherwise: no verdict, the server will say
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(text)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(serve_args(Path(fh.name), 8000))
        command.validate(args)
    except SystemExit:  # argparse's error(): its message went to stderr
        return (stderr.getvalue().strip().splitlines() or ["vllm serve rejected its arguments"])[-1]
    except Exception as exc:
        return _describe(exc)
    finally:
        Path(fh.name).unlink(missing_ok=True)
    return None


def _describe(exc: Exception) -> str:
    details = getattr(exc, "errors", None)
    if callable(details):
        first = details()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def validate_in_subprocess(configs: list[dict[str, Any]], timeout_s: float = 180.0) -> list[str | None] | None:
    """None when vLLM cannot be asked (not installed, or too slow): the engine will check instead.

    Verdicts are kept on disk per vLLM installation: importing vLLM costs 40 s on a 2-core machine, and
    every ``python -m tuner`` process (each study, each test's CLI) would otherwise pay it again."""
    if not configs:
        return []
    installed = _vllm_identity()
    if installed is None:
        return None
    keys = [json.dumps(c, sort_keys=True) for c in configs]
    known = _load_verdicts(installed)
    new = list(dict.fromkeys(k for k in keys if k not in known))
    if new:
        errors = _ask_vllm([json.loads(k) for k in new], timeout_s)
        if errors is None or len(errors) != len(new):
            return None
        known.update(zip(new, errors, strict=True))
        _save_verdicts(installed, known)
    return [known[k] for k in keys]


def _vllm_identity() -> str | None:
    """Which vLLM answers, without importing it: its package file and that file's change time."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin)
    try:
        return f"{sys.executable}|{origin}|{origin.stat().st_mtime_ns}"
    except OSError:
        return None


def _verdicts_path() -> Path:
    from tuner.models.demo import cache_root

    return cache_root().parent / "vllm-verdicts.json"


def _load_verdicts(installed: str) -> dict[str, str | None]:
    try:
        stored = json.loads(_verdicts_path().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(stored, dict) or stored.get("vllm") != installed or not isinstance(stored.get("verdicts"), dict):
        return {}
    return dict(stored["verdicts"])


def _save_verdicts(installed: str, verdicts: dict[str, str | None]) -> None:
    import os
    import tempfile

    path = _verdicts_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as fh:
            json.dump({"vllm": installed, "verdicts": verdicts}, fh)
        os.replace(fh.name, path)  # two processes at once: the last whole file wins, none is torn
    except OSError:
        pass  # a read-only cache costs time, not correctness


def _ask_vllm(configs: list[dict[str, Any]], timeout_s: float) -> list[str | None] | None:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tuner.engine.vllm_checks"],
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
