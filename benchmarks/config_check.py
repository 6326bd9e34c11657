"""Check an exported configuration the way a user would use it: start vLLM from it and generate.

    python -m benchmarks.config_check serve --config best.yaml --out serve_check.json [--port 8011] [--host 127.0.0.1]
    python -m benchmarks.config_check engine --config best.yaml --out engine_check.json

``serve`` runs ``vllm serve --config FILE`` (as ``python -m vllm.entrypoints.cli.main``), waits for
``/health``, asks ``/v1/completions`` for a few tokens and stops the server; the server listens on
loopback only (``--host 127.0.0.1``; vLLM's own default is every interface) unless ``--host`` says
otherwise. ``engine`` is the equivalent engine construction for builds whose CLI cannot start
(vLLM's parser reads the file, then ``vllm.LLM`` is built from it). Both record whether the engine log shows the speculative settings.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tuner.engine.process import EngineNotReady, EngineProcess

PROMPT = "The capital of France is"
LOOPBACK = "127.0.0.1"


def serve_command(config: Path, port: int, host: str = LOOPBACK) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "--config",
        str(config),
        "--host",
        host,
        "--port",
        str(port),
    ]


def _spec_from_log(text: str) -> dict[str, Any]:
    spec = re.search(r"speculative_config=(.*?), tokenizer=", text)
    eager = re.search(r"enforce_eager=(\w+)", text)
    return {
        "engine_speculative_config": spec.group(1) if spec else None,
        "engine_enforce_eager": eager.group(1) if eager else None,
    }


def _reachable(host: str) -> str:
    """Where this check connects to a server listening on ``host`` (a wildcard is reached on loopback)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host  # a host name
    if address.is_unspecified:
        return LOOPBACK
    return f"[{host}]" if address.version == 6 else host


def serve(config: Path, port: int, timeout_s: float, log_path: Path, host: str = LOOPBACK) -> dict[str, Any]:
    base = f"http://{_reachable(host)}:{port}"
    result: dict[str, Any] = {"mode": "vllm serve --config", "ok": False}
    t0 = time.monotonic()
    server = EngineProcess(
        serve_command(config, port, host),
        log_path,
        ready=lambda: _healthy(base),
        ready_timeout_s=timeout_s,
        poll_s=1.0,
        grace_s=30.0,
        guard=False,
    )
    try:
        with server:
            result["ready_s"] = round(time.monotonic() - t0, 1)
            model = json.load(urllib.request.urlopen(base + "/v1/models", timeout=10))["data"][0]["id"]
            body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
            request = urllib.request.Request(
                base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            reply = json.load(urllib.request.urlopen(request, timeout=120))
            result.update(
                ok=True, model=model, prompt=PROMPT, text=reply["choices"][0]["text"], usage=reply.get("usage")
            )
    except EngineNotReady as exc:
        result["ready_s"] = round(time.monotonic() - t0, 1)
        if exc.exit_code is not None:
            result["error"] = f"server exited with code {exc.exit_code} before it was ready"
        else:
            result["error"] = f"server was not ready within {timeout_s:g} s"
    except Exception as exc:
        result["error"] = repr(exc)[:500]
    result.update(_spec_from_log(log_path.read_text(errors="replace")))
    if not result["ok"]:
        result["log_tail"] = log_path.read_text(errors="replace").splitlines()[-30:]
    return result


def _healthy(base: str) -> bool:
    try:
        urllib.request.urlopen(base + "/health", timeout=5)
    except OSError:
        return False
    return True


def engine(config: Path) -> dict[str, Any]:
    """vLLM's own parser accepts the file; then the engine is built from its keys."""
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    result: dict[str, Any] = {"mode": "vllm.LLM from the config file", "ok": False}
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--config", str(config)])
    result["parsed_speculative_config"] = getattr(parsed, "speculative_config", None)
    # Every key of the file, with the value vLLM's parser gave it (`no-enforce-eager: true` -> enforce_eager=False).
    keys = [k.removeprefix("no-") if v is True else k for k, v in yaml.safe_load(config.read_text()).items()]
    kwargs = {k.replace("-", "_"): getattr(parsed, k.replace("-", "_")) for k in keys}
    t0 = time.monotonic()
    llm = LLM(**kwargs)
    result["ready_s"] = round(time.monotonic() - t0, 1)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=16, temperature=0.0), use_tqdm=False)
    result.update(ok=True, prompt=PROMPT, text=out[0].outputs[0].text, tokens=len(out[0].outputs[0].token_ids))
    spec = llm.llm_engine.vllm_config.speculative_config
    result["engine_speculative_config"] = str(spec) if spec is not None else None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["serve", "engine"])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--host", default=LOOPBACK, help="address the server listens on (default: loopback only)")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        result = serve(args.config, args.port, args.timeout_s, args.out.with_suffix(".log"), args.host)
    else:
        try:
            result = engine(args.config)
        except Exception as exc:
            result = {"mode": "vllm.LLM from the config file", "ok": False, "error": repr(exc)[:1000]}
    result["config"] = str(args.config)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}, default=str))
    if not result["ok"] and result.get("log_tail"):
        print("\n".join(result["log_tail"]), file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
