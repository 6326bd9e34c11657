"""vLLM's speculative-decoding counters, read from ``LLM.get_metrics()`` and diffed over a window.

The counters are cumulative since engine start; a window's statistics are the difference of two
snapshots, so warm-up never leaks into measured numbers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts"
DRAFT_TOKENS = PREFIX + "num_draft_tokens"
ACCEPTED = PREFIX + "num_accepted_tokens"
PER_POS = PREFIX + "num_accepted_tokens_per_pos"

Snapshot = dict[str, Any]


class SpecStats(BaseModel):
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = []

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens emitted per drafted verification step: 1 (the target's own) + accepted per draft.

        Only steps that verified a draft count (``drafts``); steps without one (an n-gram lookup that
        found no match) emit 1 token and are left out, so this is not tokens per target forward pass.
        """
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position_rate(self) -> list[float]:
        return [n / self.drafts for n in self.accepted_per_pos] if self.drafts else []

    def __add__(self, other: SpecStats) -> SpecStats:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: list(xs) + [0] * (width - len(xs))  # noqa: E731
        return SpecStats(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_pos=[
                a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos), strict=True)
            ],
        )

    def summary(self) -> dict[str, Any]:
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "accepted_per_pos": self.accepted_per_pos,
            "per_position_rate": self.per_position_rate,
        }


def snapshot(metrics: list[Any]) -> Snapshot:
    """Sum each spec-decode metric over its label sets (engines)."""
    snap: Snapshot = {}
    for metric in metrics:
        name = getattr(metric, "name", "")
        if not name.startswith(PREFIX):
            continue
        if hasattr(metric, "values"):  # vllm.v1.metrics.reader.Vector
            values = [int(v) for v in metric.values]
            prev = snap.get(name, [])
            width = max(len(prev), len(values))
            snap[name] = [
                (prev[i] if i < len(prev) else 0) + (values[i] if i < len(values) else 0) for i in range(width)
            ]
        elif hasattr(metric, "value"):
            snap[name] = snap.get(name, 0) + int(metric.value)
    return snap


def diff(before: Snapshot, after: Snapshot) -> SpecStats:
    def delta(name: str) -> int:
        return int(after.get(name, 0)) - int(before.get(name, 0))

    prev = list(before.get(PER_POS, []))
    cur = list(after.get(PER_POS, []))
    prev += [0] * (len(cur) - len(prev))
    return SpecStats(
        drafts=delta(DRAFTS),
        draft_tokens=delta(DRAFT_TOKENS),
        accepted_tokens=delta(ACCEPTED),
        accepted_per_pos=[c - p for c, p in zip(cur, prev, strict=False)],
    )


def snapshot_from_prometheus(text: str) -> Snapshot:
    """The same snapshot from a server's ``/metrics`` page (Prometheus text).

    A counter family's name is the ``get_metrics()`` name; only its ``_total`` samples are counts
    (``_created`` holds a timestamp). Label sets (engines) are summed; per-position counts are
    indexed by their ``position`` label.
    """
    from prometheus_client.parser import text_string_to_metric_families

    snap: Snapshot = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # By the sample's name: a page whose TYPE lines do not group samples into families parses too.
            if not (sample.name.startswith(PREFIX) and sample.name.endswith("_total")):
                continue
            name = sample.name.removesuffix("_total")
            value = int(float(sample.value))
            if name == PER_POS:
                pos = int(sample.labels.get("position", 0))
                counts = snap.setdefault(name, [])
                counts += [0] * (pos + 1 - len(counts))
                counts[pos] += value
            else:
                snap[name] = snap.get(name, 0) + value
    return snap
