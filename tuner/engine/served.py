"""The served engine: a real ``vllm serve`` (:mod:`tuner.engine.server`) under ``vllm bench serve`` load
(:mod:`tuner.engine.load`), behind the same :class:`~tuner.engine.backend.MeasurementBackend` interface
as the offline engine. A level is a ``--max-concurrency``; the speculative counters come from the
server's ``/metrics``, diffed around each measured window, so warm-up never counts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner.engine.backend import BackendInfo, LevelResult, RepeatHook, Workload
from tuner.engine.load import BenchClient
from tuner.engine.offline import device_info, render_prompts
from tuner.engine.rate_search import search_rate
from tuner.engine.request import RepeatMeasurement, SloProbe, SloSearch
from tuner.engine.runner_log import parse_runner_log
from tuner.engine.server import HOST, VllmServer
from tuner.engine.server import LOG_FILE as SERVER_LOG
from tuner.engine.vllm_metrics import Snapshot, diff
from tuner.study.config import ServeConfig

ProbeHook = Callable[[SloProbe], None]


class ServeBackend:
    def __init__(self, config: ServeConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.server: VllmServer | None = None
        self.client: BenchClient | None = None
        self._llm_kwargs: dict[str, Any] = {}
        self._n_prompts = 0
        self._tokenizer: Any = None

    def start(self, llm_kwargs: Mapping[str, Any]) -> None:
        self._llm_kwargs = dict(llm_kwargs)
        server = VllmServer(self._llm_kwargs, self.workdir, self.config.start_timeout_s)
        self.server = server.__enter__()

    def prepare(self, workload: Workload) -> None:
        from transformers import AutoTokenizer

        assert self.server is not None
        kwargs = self._llm_kwargs
        tokenizer = AutoTokenizer.from_pretrained(
            kwargs.get("tokenizer") or kwargs["model"], trust_remote_code=bool(kwargs.get("trust_remote_code"))
        )
        prompts = render_prompts(tokenizer, workload.prompts)
        self._n_prompts = len(prompts)
        self._tokenizer = tokenizer
        self.client = BenchClient(
            HOST,
            self.server.port,
            self.server.api_key,
            str(kwargs["model"]),
            self.workdir,
            prompts,
            workload.max_tokens,
            workload.temperature,
            workload.top_p,
            self.config.slo,
        )

    def warmup(self, n_prompts: int) -> None:
        if n_prompts:
            assert self.client is not None
            self.client.run(n_prompts, concurrency=n_prompts)

    def requests_for(self, concurrency: int) -> int:
        """Every prompt once, and at least two waves of ``concurrency`` requests, so the level is held."""
        return self.config.requests_per_level or max(self._n_prompts, 2 * concurrency)

    def measure(self, batch_size: int, repeats: int, on_repeat: RepeatHook | None = None) -> LevelResult:
        assert self.client is not None
        level = LevelResult()
        for repeat in range(repeats):
            before = self.spec_counters()
            window = self.client.run(self.requests_for(batch_size), concurrency=batch_size)
            measurement = RepeatMeasurement(
                batch_size=batch_size,
                repeat=repeat,
                output_tokens=window.output_tokens,
                elapsed_s=window.duration_s,
                spec=diff(before, self.spec_counters()),
                served=window,
            )
            level.repeats.append(measurement)
            if repeat == 0:
                level.token_ids = self._first_outputs()
            if on_repeat is not None:
                on_repeat(measurement)
        return level

    def _first_outputs(self) -> list[list[int]] | None:
        """Each prompt's output in the window just measured (its first request), as token ids for the
        lossless check against the baseline. The client returns text, not ids: re-encoded, equal texts give
        equal ids, and a divergence is found at the token where the texts part."""
        assert self.client is not None
        texts = self.client.last_texts[: self._n_prompts]
        if len(texts) < self._n_prompts or self._tokenizer is None:
            return None
        return [list(self._tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def slo_search(self, on_probe: ProbeHook | None = None) -> SloSearch:
        """The highest Poisson (or gamma, by ``burstiness``) request rate at which the SLO holds."""
        assert self.client is not None and self.config.slo is not None
        slo, cfg = self.config.slo, self.config.rate_search
        result = SloSearch(percentile=slo.percentile, ttft_ms=slo.ttft_ms, tpot_ms=slo.tpot_ms)
        fewest = cfg.requests or 2 * self._n_prompts
        client = self.client

        def holds(rate: float) -> bool:
            before = self.spec_counters()
            window = client.run(max(fewest, math.ceil(rate * cfg.probe_s)), rate=rate, burstiness=cfg.burstiness)
            probe = SloProbe(
                rate_rps=rate, held=result.held_at(window), window=window, spec=diff(before, self.spec_counters())
            )
            result.probes.append(probe)
            if on_probe is not None:
                on_probe(probe)
            return probe.held

        t0 = time.monotonic()
        outcome = search_rate(holds, cfg)
        result.max_rate_rps = outcome.max_rate_rps
        result.truncated = outcome.truncated
        result.elapsed_s = time.monotonic() - t0
        return result

    def spec_counters(self) -> Snapshot:
        assert self.server is not None
        return self.server.spec_counters()

    def info(self) -> BackendInfo:
        # the server's own log: the engine process's says nothing of the engine
        return dataclasses.replace(device_info(), runner=parse_runner_log(self.workdir / SERVER_LOG))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
