"""The highest request rate at which a latency SLO holds: a doubling ramp, then bisection, bounded in time.

As DistServe and vLLM's ``auto_tune`` define goodput capacity: probe a rate with a fixed number of
open-loop requests; if the SLO holds, double the rate (up to ``max_rps``); at the first rate where it
fails, bisect between the last rate that held and that one. If the first rate already fails, the
bisection runs between 0 and it. The answer is the highest rate that held (0.0 if none did).
The probed rates depend only on the outcomes, so two trials with the same outcomes probe the same
rates and tie exactly (the tie is then broken by throughput).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel

from tuner.study.config import RateSearchConfig


class RateSearchOutcome(BaseModel):
    max_rate_rps: float
    probed: list[tuple[float, bool]]
    truncated: bool


def search_rate(
    holds: Callable[[float], bool], config: RateSearchConfig, clock: Callable[[], float] = time.monotonic
) -> RateSearchOutcome:
    """``holds(rate)`` measures one probe and says whether the SLO held at ``rate`` requests/s."""
    deadline = clock() + config.time_limit_s
    probed: list[tuple[float, bool]] = []

    def probe(rate: float) -> bool | None:
        if probed and clock() > deadline:
            return None
        held = holds(rate)
        probed.append((rate, held))
        return held

    low, high = 0.0, None
    rate = config.start_rps
    while high is None:
        held = probe(rate)
        if held is None:
            return RateSearchOutcome(max_rate_rps=low, probed=probed, truncated=True)
        if not held:
            high = rate
        elif rate >= config.max_rps:
            return RateSearchOutcome(max_rate_rps=rate, probed=probed, truncated=False)
        else:
            low, rate = rate, min(rate * 2, config.max_rps)
    for _ in range(config.bisect_steps):
        mid = (low + high) / 2
        held = probe(mid)
        if held is None:
            return RateSearchOutcome(max_rate_rps=low, probed=probed, truncated=True)
        low, high = (mid, high) if held else (low, mid)
    return RateSearchOutcome(max_rate_rps=low, probed=probed, truncated=False)
