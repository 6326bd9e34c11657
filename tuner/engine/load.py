"""Load from vLLM's own client: ``vllm bench serve`` (``vllm.benchmarks.serve``), run in this process.

This is the trial's engine process, so the client's imports (torch, transformers, aiohttp) never
reach the tuner. Prompts are rendered by the tuner (chat template included) and sent as a custom
dataset with ``--skip-chat-template``, so served and offline trials see the same text; sampling is
always sent explicitly (the client no longer sends temperature 0 by default, and the server's
default would apply).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from tuner.engine.request import LATENCY_METRICS, LATENCY_PERCENTILES, ServedWindow
from tuner.study.config import SloConfig

API_KEY_ENV = "OPENAI_API_KEY"  # the client has no --api-key flag; it reads this


class LoadFailed(RuntimeError):
    """Requests of a measured window failed (the server is broken or overloaded beyond use)."""


def write_dataset(path: Path, prompts: list[str], n_requests: int) -> None:
    """``n_requests`` rows, the prompts in order and cycled, as ``vllm bench serve --dataset-name custom`` reads them."""
    with path.open("w") as fh:
        for i in range(n_requests):
            fh.write(json.dumps({"prompt": prompts[i % len(prompts)]}) + "\n")


class BenchClient:
    def __init__(
        self,
        host: str,
        port: int,
        api_key: str,
        model: str,
        workdir: Path,
        prompts: list[str],
        max_tokens: int,
        temperature: float,
        top_p: float | None,
        slo: SloConfig | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.api_key = api_key
        self.model = model
        self.workdir = workdir
        self.prompts = prompts
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.slo = slo
        self.runs = 0
        # The last window's output texts in request order (``--save-detailed``; the client gathers its
        # requests in the order of the dataset, which --disable-shuffle keeps): the lossless check's input.
        self.last_texts: list[str] = []

    def argv(
        self, dataset: Path, n_requests: int, concurrency: int | None, rate: float | None, burstiness: float
    ) -> list[str]:
        argv = [
            "--backend", "openai",
            "--host", self.host,
            "--port", str(self.port),
            # Named explicitly: without it the client asks /v1/models without the key and gets 401.
            "--model", self.model,
            "--dataset-name", "custom",
            "--dataset-path", str(dataset),
            "--num-prompts", str(n_requests),
            "--disable-shuffle",
            "--skip-chat-template",
            "--custom-output-len", str(self.max_tokens),
            "--temperature", str(self.temperature),
            "--percentile-metrics", ",".join(LATENCY_METRICS),
            "--metric-percentiles", ",".join(str(p) for p in LATENCY_PERCENTILES),
            "--request-rate", "inf" if rate is None else str(rate),
            "--burstiness", str(burstiness),
            "--seed", "0",
            "--disable-tqdm",
            "--save-detailed",  # keeps each request's error and output text in the returned result
        ]  # fmt: skip
        # Sent even when the study leaves it unset: 1.0, what offline trials use, and not whatever
        # the model's generation_config.json would make the server's default.
        argv += ["--top-p", str(1.0 if self.top_p is None else self.top_p)]
        if concurrency is not None:
            argv += ["--max-concurrency", str(concurrency)]
        if self.slo is not None:
            goodput = [
                f"{name}:{limit:g}" for name, limit in (("ttft", self.slo.ttft_ms), ("tpot", self.slo.tpot_ms)) if limit
            ]
            argv += ["--goodput", *goodput]
        return argv

    def run(
        self, n_requests: int, concurrency: int | None = None, rate: float | None = None, burstiness: float = 1.0
    ) -> ServedWindow:
        """One window: ``n_requests`` requests, at most ``concurrency`` in flight, arriving at ``rate``
        requests/s (None: all at once). Raises :class:`LoadFailed` if any request failed."""
        self.runs += 1
        stem = self.workdir / f"bench-{self.runs:03d}"
        dataset = stem.with_suffix(".jsonl")
        write_dataset(dataset, self.prompts, n_requests)
        raw = self._bench(self.argv(dataset, n_requests, concurrency, rate, burstiness))
        kept = {k: v for k, v in raw.items() if not isinstance(v, list)}
        stem.with_suffix(".json").write_text(json.dumps(kept, indent=1, default=str))
        window = window_from_result(raw)
        self.last_texts = [str(t) for t in raw.get("generated_texts") or []]
        if window.failed:
            errors = [e for e in raw.get("errors", []) if e]
            raise LoadFailed(
                f"{window.failed} of {n_requests} requests failed at concurrency {concurrency}, rate {rate}: "
                f"{errors[0][-300:] if errors else 'see server.log'}"
            )
        return window

    def _bench(self, argv: list[str]) -> dict[str, Any]:
        from vllm.benchmarks.serve import add_cli_args, main

        try:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError:  # older layouts
            from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]

        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(argv)
        os.environ[API_KEY_ENV] = self.api_key
        # Its report goes to this process's log, not between the tuner's progress lines.
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = main(args)
        (self.workdir / f"bench-{self.runs:03d}.txt").write_text(out.getvalue())
        return dict(result)


def window_from_result(raw: dict[str, Any]) -> ServedWindow:
    """The figures of a ``vllm bench serve`` result dict (``p90_ttft_ms`` -> ``ttft_p90``)."""
    latency: dict[str, float] = {}
    for metric in LATENCY_METRICS:
        for stat in ("mean", "median"):
            if (value := raw.get(f"{stat}_{metric}_ms")) is not None:
                latency[f"{metric}_{stat}"] = float(value)
        for p in LATENCY_PERCENTILES:
            if (value := raw.get(f"p{p}_{metric}_ms")) is not None:
                latency[f"{metric}_p{p}"] = float(value)
    rate = raw.get("request_rate")
    rate_value = None if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate)) else float(rate)
    goodput = raw.get("request_goodput")
    return ServedWindow(
        max_concurrency=raw.get("max_concurrency"),
        request_rate=rate_value,
        completed=int(raw.get("completed", 0)),
        failed=int(raw.get("failed", 0) or 0),
        duration_s=float(raw["duration"]),
        output_tokens=int(raw.get("total_output_tokens", 0)),
        request_throughput=float(raw.get("request_throughput", 0.0)),
        output_throughput=float(raw.get("output_throughput", 0.0)),
        goodput_rps=None if goodput is None else float(goodput),
        latency_ms=latency,
    )
