"""The comment lines every exported file carries, whatever it serves (a trial or a batch-size schedule)."""

from __future__ import annotations

import shlex
from typing import Any

from tuner.results.outcome import StudyOutcome
from tuner.results.scoring import TrialMetrics, level_name

# vllm serve listens on every interface unless told otherwise.
USE_LINE = "# use: vllm serve --config THIS_FILE --host 127.0.0.1 (elsewhere: also --api-key KEY)"


def measurement_lines(metrics: TrialMetrics) -> list[str]:
    name = level_name(metrics.mode)
    sampling = metrics.sampling
    lines = []
    if metrics.mode == "serve":
        lines.append(
            "# measured served: vllm serve under vllm bench serve load, at most "
            + ", ".join(str(lv.batch_size) for lv in metrics.levels)
            + " requests in flight"
        )
    if sampling:
        top_p = sampling.get("top_p")
        lines.append(
            f"# sampling sent with every request: temperature {sampling.get('temperature')}, "
            f"top_p {top_p if top_p is not None else '1.0 (vLLM default)'}, max_tokens {sampling.get('max_tokens')}"
        )
    if len(metrics.levels) > 1:
        weights = ", ".join(f"{name} {lv.batch_size}: {lv.weight:.2f}" for lv in metrics.levels)
        lines.append(
            f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s, the weighted mean over {name} levels "
            f"({weights}) of each level's median; per level below"
        )
    else:
        lines.append(f"# throughput: {metrics.tokens_per_s:.1f} output tokens/s (median of repeats)")
    return lines


def decision_lines(out: StudyOutcome) -> list[str]:
    """How the answer was decided: the confirmation's lines, or that it rests on one engine each, and the
    trials whose speedup is unknown."""
    lines = []
    conf = out.confirmation
    if conf is not None:
        lines += [f"# {line}" for line in conf.summary_lines(level_name(out.mode))]
    elif out.best_speculative is not None:
        lines.append("# not confirmed in fresh engines: the choice rests on one engine per configuration")
    if out.unknown_speedup:
        lines.append(
            f"# speedup unknown for trials {', '.join(map(str, out.unknown_speedup))}: no completed baseline of their "
            "mode (eager or compiled), so they were not candidates"
        )
    return lines


def env_lines(env: dict[str, str]) -> list[str]:
    """A config file cannot set the environment: the measured engine's variables are named for the serving host."""
    if not env:
        return []
    values = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))  # pasteable before `vllm serve`
    return [f"# measured with the environment {values} (target.env): set it where you serve; --config cannot"]


def pinned_lines(resolved: dict[str, int], llm_kwargs: dict[str, Any]) -> list[str]:
    """``vllm serve`` and ``vllm.LLM`` resolve different defaults (max_num_seqs, max_num_batched_tokens): the file
    pins what the measured engine ran."""
    added = {k: v for k, v in resolved.items() if llm_kwargs.get(k) is None}
    if not added:
        return []
    values = ", ".join(f"{k}={v}" for k, v in sorted(added.items()))
    return [f"# pinned as the measured engine resolved them (vllm serve's defaults differ): {values}"]
