"""Check an exported configuration the way a user would use it: start vLLM from it and generate.

    python -m benchmarks.config_check serve --config best.yaml --out serve_check.json [--port 8011]
    python -m benchmarks.config_check engine --config best.yaml --out engine_check.json

``serve`` runs ``vllm serve --config FILE`` (as ``python -m vllm.entrypoints.cli.main``), waits for
``/health``, asks ``/v1/completions`` for a few tokens and stops the server. ``engine`` is the
equivalent engine construction for builds whose CLI cannot start (vLLM's parser reads the file, then
``vllm.LLM`` is built from it). Both record whether the engine log shows the speculative settings.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

PROMPT = "The capital of France is"


def _spec_from_log(text: str) -> dict[str, Any]:
    spec = re.search(r"speculative_config=(.*?), tokenizer=", text)
    eager = re.search(r"enforce_eager=(\w+)", text)
    return {
        "engine_speculative_config": spec.group(1) if spec else None,
        "engine_enforce_eager": eager.group(1) if eager else None,
    }


def serve(config: Path, port: int, timeout_s: float, log_path: Path) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"mode": "vllm serve --config", "ok": False}
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "--config", str(config), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        while time.monotonic() - t0 < timeout_s and proc.poll() is None:
            try:
                urllib.request.urlopen(base + "/health", timeout=5)
                break
            except OSError:
                time.sleep(1)
        result["ready_s"] = round(time.monotonic() - t0, 1)
        if proc.poll() is not None:
            result["error"] = f"server exited with code {proc.returncode} before it was ready"
        else:
            model = json.load(urllib.request.urlopen(base + "/v1/models", timeout=10))["data"][0]["id"]
            body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
            request = urllib.request.Request(
                base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            reply = json.load(urllib.request.urlopen(request, timeout=120))
            result.update(
                ok=True, model=model, prompt=PROMPT, text=reply["choices"][0]["text"], usage=reply.get("usage")
            )
    except Exception as exc:
        result["error"] = repr(exc)[:500]
    finally:
        _stop(proc)
    result.update(_spec_from_log(log_path.read_text(errors="replace")))
    if not result["ok"]:
        result["log_tail"] = log_path.read_text(errors="replace").splitlines()[-30:]
    return result


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def engine(config: Path) -> dict[str, Any]:
    """vLLM's own parser accepts the file; then the engine is built from its keys."""
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    result: dict[str, Any] = {"mode": "vllm.LLM from the config file", "ok": False}
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--config", str(config)])
    result["parsed_speculative_config"] = getattr(parsed, "speculative_config", None)
    kwargs = {k.replace("-", "_"): v for k, v in yaml.safe_load(config.read_text()).items()}
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
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        result = serve(args.config, args.port, args.timeout_s, args.out.with_suffix(".log"))
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
