"""A stand-in engine for batch-size schedule tests: ``tests.fake_engine`` with throughput by (k, batch size).

Same protocol and ``fake_*`` settings as ``tests.fake_engine``, except ``fake_gain``, whose keys here are
``"K@BS"``: a configuration drafting K tokens runs at that factor times the baseline at batch size BS
(1.0 when the key is missing; ``"0@BS"`` is a schedule's k = 0 there). A ``speculative_config`` with
``num_speculative_tokens_per_batch_size`` drafts, at each batch size, the k of the last range starting
at or below it, capped at ``num_speculative_tokens`` (vLLM's dense lookup: gaps and the tail reuse the
previous k); ``fake_gain["schedule"]`` then scales the whole engine (a schedule's own cost).
"""

from __future__ import annotations

import sys
from typing import Any

from tests import fake_engine
from tuner.engine.vllm_metrics import SpecStats

_formula = fake_engine.throughput


def k_at(schedule: list[list[int]], batch_size: int) -> int:
    return [k for start, _, k in sorted(schedule) if start <= batch_size][-1]


def throughput(
    spec: dict[str, Any] | None, batch_size: int, gains: dict[str, float] | None = None
) -> tuple[float, SpecStats]:
    base, _ = _formula(None, batch_size)
    if not spec:
        return base, SpecStats()
    gains = gains or {}
    k = spec["num_speculative_tokens"]
    factor = 1.0
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    if schedule:
        k = min(k_at(schedule, batch_size), k)
        factor = gains.get("schedule", 1.0)
    tps = base * gains.get(f"{k}@{batch_size}", 1.0) * factor
    if k == 0:
        return tps, SpecStats()
    return tps, _formula({**spec, "num_speculative_tokens": k}, batch_size)[1]


if __name__ == "__main__":
    fake_engine.throughput = throughput  # main() looks it up at call time
    sys.exit(fake_engine.main(sys.argv[1:]))
