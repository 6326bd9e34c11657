"""The report's sentences: the headline verdict, each candidate's verdict, and the "why" list."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.outputs.report.served import sampling
from tuner.results.stats import median

if TYPE_CHECKING:
    from tuner.outputs.report.model import CandidateSummary, StudyReport, TrialRow
    from tuner.study.config import StudyConfig

LOW_ACCEPTANCE = 0.2


def verdict(c: CandidateSummary, own: Sequence[TrialRow]) -> str:
    if c.method == "none":
        return (
            "the reference every speedup is measured against" if c.best else "not measured: no speedup can be computed"
        )
    if c.removed and not own:
        return f"removed by pre-flight before any trial, never measured: {c.removed}"
    best = c.best
    if best is None or best.metrics is None:
        if c.failed:
            classes = sorted({r.reason.split(":", 1)[0] for r in own if r.state == "FAIL"})
            return f"no trial completed: {c.failed} failed ({', '.join(classes)})"
        if c.pruned:
            first = next(r.reason for r in own if r.state == "PRUNED")
            return f"no trial completed: {c.pruned} pruned ({first.removeprefix('pruned: ')})"
        return "not measured (the sampler never chose it within the budget)"
    rate = best.metrics.spec.acceptance_rate
    accepted = f"{rate:.0%} of drafted tokens accepted" if rate is not None else "no acceptance counters"
    if best.speedup is None:
        text = f"{accepted}; no baseline to compare with"
    elif best.speedup > 1.0:
        text = f"{best.speedup:.2f}× faster than no speculation at best; {accepted}"
    elif rate is not None and rate < LOW_ACCEPTANCE:
        text = f"slower ({best.speedup:.2f}× at best): drafts are rarely accepted ({accepted}), verifying them is wasted work"
    else:
        text = f"slower ({best.speedup:.2f}× at best): {accepted}, but drafting and verifying cost more than they save"
    slo = best.metrics.slo
    if slo is not None:
        ratio = best.metrics.slo_rate_speedup
        text += f"; SLO kept up to {slo.max_rate_rps:g} requests/s" + (
            f" ({ratio:.2f}× no speculation's rate)" if ratio is not None else ""
        )
    failed = [r for r in own if r.state == "FAIL"]
    if failed:
        ks = ", ".join(
            f"k={r.spec.num_speculative_tokens}: {r.reason.split(':', 1)[0]}" for r in failed if r.spec is not None
        )
        text += f"; {len(failed)} failed ({ks})"
    return text


def headline(r: StudyReport) -> str:
    if not r.rows:
        return f"Study '{r.study_name}' has no trials yet: run `python -m tuner optimize` first."
    if r.chosen is None or r.chosen.metrics is None:
        return f"No trial of study '{r.study_name}' completed yet, so there is no best configuration."
    base = r.baseline
    if base is None or base.metrics is None:
        return (
            f"Best measured configuration: {r.chosen.label} (trial {r.chosen.number}) at "
            f"{r.chosen.metrics.tokens_per_s:.1f} output tokens/s; no baseline without speculation completed, "
            "so its speedup is unknown."
        )
    if r.featured is None:
        return (
            f"No speculative configuration completed yet; without speculation the target runs at "
            f"{base.metrics.tokens_per_s:.1f} output tokens/s ({base.label}, trial {base.number})."
        )
    if r.schedule is not None and r.schedule.exported:
        # The export serves the schedule, not the static winner: the headline must say what the file holds.
        return f"Use the {r.schedule.outcome}."
    if r.slo is not None and r.slo.objective == "goodput":
        return _goodput_headline(r)
    if r.paid and r.chosen.speedup is not None:
        return (
            f"Use {r.chosen.label} (trial {r.chosen.number}): {r.chosen.speedup:.2f}× the throughput of no speculation "
            f"({r.chosen.metrics.tokens_per_s:.1f} against {base.metrics.tokens_per_s:.1f} output tokens/s)."
        )
    tail = ""
    if r.featured is not None and r.featured.speedup is not None:
        tail = f" The best speculative configuration, {r.featured.label} (trial {r.featured.number}), reached {r.featured.speedup:.2f}×."
    return (
        f"Serve without speculation: no speculative configuration beat the baseline "
        f"({base.metrics.tokens_per_s:.1f} output tokens/s, {base.label}).{tail}"
    )


def _goodput_headline(r: StudyReport) -> str:
    """The goodput objective decides by the highest request rate that keeps the SLO."""
    assert r.chosen is not None and r.baseline is not None and r.slo is not None
    chosen, base = r.chosen.metrics, r.baseline.metrics
    assert chosen is not None and base is not None
    base_rate = f"{base.slo.max_rate_rps:g} requests/s" if base.slo is not None else "no measured rate"
    if r.paid and chosen.slo is not None:
        ratio = f", {chosen.slo_rate_speedup:.2f}× the" if chosen.slo_rate_speedup is not None else " against the"
        tput = f"; output throughput {r.chosen.speedup:.2f}×" if r.chosen.speedup is not None else ""
        return (
            f"Use {r.chosen.label} (trial {r.chosen.number}): it keeps the SLO ({r.slo.limits()}) up to "
            f"{chosen.slo.max_rate_rps:g} requests/s{ratio} {base_rate} of no speculation{tput}."
        )
    tail = ""
    feat = r.featured.metrics if r.featured is not None else None
    if r.featured is not None and feat is not None and feat.slo is not None:
        tail = (
            f" The best speculative configuration, {r.featured.label} (trial {r.featured.number}), kept it up to "
            f"{feat.slo.max_rate_rps:g} requests/s."
        )
    return (
        f"Serve without speculation: no speculative configuration kept the SLO ({r.slo.limits()}) at a higher "
        f"request rate than the baseline ({base_rate}, {r.baseline.label}).{tail}"
    )


def explain(r: StudyReport, config: StudyConfig | None) -> list[str]:
    """Plain sentences that answer "why": acceptance, k, batch sizes, other candidates, start-up, failures."""
    why: list[str] = []
    feat = r.featured
    if feat is not None and feat.metrics is not None and feat.spec is not None:
        why += _featured_sentences(r, feat, config)
    for c in r.candidates:
        if c.method == "none" or (feat is not None and feat.spec is not None and c.name == feat.spec.candidate):
            continue
        why.append(f"{c.name}: {c.verdict}.")
    why += _eager_sentences(r.rows)
    why += _outcome_sentences(r.rows)
    return why


def _featured_sentences(r: StudyReport, feat: TrialRow, config: StudyConfig | None) -> list[str]:
    """Why the featured (best speculative) trial performs as it does."""
    assert feat.metrics is not None and feat.spec is not None
    why: list[str] = []
    s = feat.metrics.spec
    k = feat.spec.num_speculative_tokens
    if s.acceptance_rate is not None and s.mean_acceptance_length is not None:
        why.append(
            f"{feat.label}: {s.acceptance_rate:.0%} of {s.draft_tokens} drafted tokens were accepted, so each "
            f"verification step that had a draft emitted {s.mean_acceptance_length:.2f} tokens on average "
            f"instead of 1 (mean acceptance length; k={k} drafted per step; steps without a draft not counted)."
        )
    rates = s.per_position_rate
    if len(rates) >= 2:
        text = ", ".join(f"{x:.0%}" for x in rates)
        sentence = f"Acceptance by draft position 1–{len(rates)}: {text}"
        weak = next((i for i, x in enumerate(rates) if x < 0.1), None)
        if weak is not None:
            sentence += (
                f"; from position {weak + 1} on drafts are rarely accepted, so a larger k mostly adds drafting cost"
            )
        why.append(sentence + ".")
    siblings = _per_k(r.rows, feat.spec.candidate)
    if len(siblings) >= 2:
        parts = [f"k={kk}: {sp:.2f}×" for kk, sp in siblings.items()]
        why.append(f"{feat.spec.candidate} at other num_speculative_tokens (best trial each): {', '.join(parts)}.")
    if len(r.levels) >= 2 and all(lv.speedup is not None for lv in r.levels):
        why.append(_batch_sentence(r, config))
    why += _slo_sentences(r, feat)
    lossless = [lv.lossless for lv in r.levels if lv.lossless is not None]
    if lossless and min(lossless) == 1.0:
        why.append(f"At temperature 0 {feat.label} produced exactly the baseline's tokens on every prompt.")
    elif lossless:
        why.append(
            f"Careful: at temperature 0 {feat.label}'s output differed from the baseline's on "
            f"{1 - min(lossless):.0%} of prompts."
        )
    return why


def _batch_sentence(r: StudyReport, config: StudyConfig | None) -> str:
    parts = [f"{r.level_name(lv.batch_size)}: {lv.speedup:.2f}×" for lv in r.levels]
    sentence = f"Speedup by {r.level_noun}: {', '.join(parts)}"
    ups = [lv.speedup for lv in r.levels if lv.speedup is not None]
    small, large = ("low concurrency", "high concurrency") if r.mode == "serve" else ("small batches", "large batches")
    if max(ups) > 1.0 > min(ups):
        sentence += (
            f"; speculation pays where the target is memory-bound ({small}) and costs throughput where "
            f"it is already compute-bound ({large})"
        )
    weights = ""
    if config is not None and config.workload.batch_weights:
        ws = ", ".join(
            f"{b}: {w:.2f}" for b, w in zip(config.workload.batch_sizes, config.workload.weights(), strict=True)
        )
        noun = "concurrency levels" if r.mode == "serve" else "batch sizes"
        weights = f" The score weights the {noun} as {ws}."
    return sentence + "." + weights


def _slo_sentences(r: StudyReport, feat: TrialRow) -> list[str]:
    """Serve mode with an SLO: the featured trial's rate against the baseline's, and truncated searches."""
    if r.slo is None:
        return []
    why = []
    m = feat.metrics
    if m is not None and m.slo is not None and r.slo.baseline_rate_rps is not None:
        ratio = f" ({m.slo_rate_speedup:.2f}×)" if m.slo_rate_speedup is not None else ""
        why.append(
            f"Under the SLO ({r.slo.limits()}), {feat.label} kept up to {m.slo.max_rate_rps:g} requests/s against "
            f"{r.slo.baseline_rate_rps:g} requests/s without speculation{ratio}."
        )
    cut = [t.row.number for t in r.slo.trials if t.truncated]
    if cut:
        why.append(
            f"The rate search of trial(s) {', '.join(map(str, cut))} reached rate_search.time_limit_s: their rate "
            "is the highest that held before the limit, a lower bound."
        )
    return why


def _outcome_sentences(rows: Sequence[TrialRow]) -> list[str]:
    """How many trials completed, were pruned or failed, and the failure classes."""
    counts = {s: sum(1 for row in rows if row.state == s) for s in ("COMPLETE", "PRUNED", "FAIL")}
    if not (counts["PRUNED"] or counts["FAIL"]):
        return []
    classes: dict[str, int] = {}
    for row in rows:
        if row.state == "FAIL":
            key = row.reason.split(":", 1)[0]
            classes[key] = classes.get(key, 0) + 1
    fails = ", ".join(f"{n}× {k}" for k, n in classes.items())
    return [
        f"{len(rows)} trials: {counts['COMPLETE']} completed, {counts['PRUNED']} pruned early, "
        f"{counts['FAIL']} failed" + (f" ({fails})" if fails else "") + "; the trials table gives each reason."
    ]


def _per_k(rows: Sequence[TrialRow], candidate: str) -> dict[int, float]:
    best: dict[int, float] = {}
    for r in rows:
        if (
            r.spec is None
            or r.spec.candidate != candidate
            or r.speedup is None
            or r.spec.num_speculative_tokens is None
        ):
            continue
        k = r.spec.num_speculative_tokens
        best[k] = max(r.speedup, best.get(k, -math.inf))
    return dict(sorted(best.items()))


def _eager_sentences(rows: Sequence[TrialRow]) -> list[str]:
    measured = [r for r in rows if r.measured and r.spec is not None and r.metrics is not None]
    starts = {
        eager: [r.metrics.engine_start_s for r in measured if r.spec and r.metrics and r.spec.enforce_eager == eager]
        for eager in (True, False)
    }
    if not starts[True] or not starts[False]:
        return []
    bases = {
        eager: max(
            (
                r.metrics.tokens_per_s
                for r in measured
                if r.spec and r.metrics and r.spec.is_baseline and r.spec.enforce_eager == eager
            ),
            default=None,
        )
        for eager in (True, False)
    }
    sentence = (
        f"Engine start: {median(starts[True]):.1f} s eager against {median(starts[False]):.1f} s compiled "
        "(enforce_eager=false captures graphs / compiles first)"
    )
    eager_base, compiled_base = bases[True], bases[False]
    if eager_base and compiled_base:
        sentence += f"; without speculation compiled mode ran at {compiled_base / eager_base:.2f}× eager's throughput"
    return [sentence + "."]


def settings(config: StudyConfig | None) -> dict[str, str]:
    if config is None:
        return {}
    w = config.workload
    serve = w.mode == "serve"
    weights = ", ".join(f"{b}: {x:.2f}" for b, x in zip(w.batch_sizes, w.weights(), strict=True))
    levels = "concurrency levels" if serve else "batch sizes"
    level = "concurrency level" if serve else "batch size"
    score = (
        f"weighted mean over {levels} of (median − {config.scoring.mad_penalty} × MAD of output tokens/s) "
        f"÷ the best no-speculation median at that {level}"
    )
    if serve and w.serve.objective == "goodput":
        score = "highest request rate keeping the SLO ÷ the best no-speculation rate; ties broken by the " + score
    return {
        "target model": config.target.model,
        "dtype": config.target.dtype,
        "candidates": ", ".join(f"{c.name} ({c.method})" for c in config.candidates),
        "enforce_eager": ", ".join(str(x).lower() for x in config.search.enforce_eager),
        "prompts": str(w.prompts.name),
        "measured as": (
            "served load: vllm serve + vllm bench serve (levels are --max-concurrency)"
            if serve
            else "offline batches: vllm.LLM.generate (levels are batch sizes)"
        ),
        "sampling": sampling(w),
        f"{levels} (score weights)": weights,
        f"repeats per {level}": str(w.repeats),
        "score": score,
        "sampler": f"{config.search.sampler} (seed {config.search.seed})",
        "budget": f"{config.budget.trials} trials, {config.budget.trial_timeout_s:.0f} s each at most",
    }
