"""The report's tables as string cells (shared by HTML, Markdown and the notebook) and as DataFrames."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.outputs.report.model import StudyReport, TrialRow


def _f(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f} ms"


def runner_cell(engine: dict[str, Any]) -> str:
    """The model runner and CUDA-graph mode the trial's engine logged (``V2 FULL_AND_PIECEWISE``); ``–`` where
    the engine did not say (tuner.engine.runner_log)."""
    said = [str(engine[k]) for k in ("model_runner", "cudagraph_mode") if engine.get(k)]
    return " ".join(said) or "–"


def trial_table(rows: Sequence[TrialRow]) -> tuple[list[str], list[list[str]]]:
    """The all-trials table as header and string cells (shared by HTML, Markdown and the notebook)."""
    from tuner.outputs.report.model import rows_mode

    batch_sizes = sorted({lv.batch_size for r in rows if r.metrics for lv in r.metrics.levels})
    header = ["trial", "state", "configuration", "tokens/s", "speedup"]
    serve = rows_mode(rows) == "serve"
    header += [f"tokens/s concurrency {b}" if serve else f"tokens/s bs{b}" for b in batch_sizes]
    header += ["acceptance", "mean acc. length", "engine start", "runner", "notes"]
    body = []
    for r in rows:
        m = r.metrics
        tps = _f(m.tokens_per_s) if m else ("partial " + _f(r.partial_tokens_per_s) if r.partial_tokens_per_s else "–")
        cells = [str(r.number), r.state, r.label, tps, _x(r.speedup)]
        for b in batch_sizes:
            lv = m.level(b) if m else None
            cells.append(_f(lv.tokens_per_s) if lv else "–")
        cells += [
            _pct(m.spec.acceptance_rate) if m else "–",
            _f(m.spec.mean_acceptance_length, ".2f") if m else "–",
            _f(m.engine_start_s, ".1f", " s") if m else "–",
            runner_cell(r.engine),
            r.reason,
        ]
        body.append(cells)
    return header, body


def trials_frame(rows: Sequence[TrialRow]) -> Any:
    """The trials as a pandas DataFrame (for the notebook): one row per trial, numbers as numbers."""
    import pandas as pd

    records = []
    for r in rows:
        m = r.metrics
        rec: dict[str, Any] = {
            "trial": r.number,
            "state": r.state,
            "candidate": r.candidate,
            "method": r.spec.method if r.spec else None,
            "k": r.spec.num_speculative_tokens if r.spec else None,
            "enforce_eager": r.spec.enforce_eager if r.spec else None,
            "configuration": r.label,
            "tokens_per_s": m.tokens_per_s if m else None,
            "score": m.score if m else None,
            "speedup": r.speedup,
            "acceptance_rate": m.spec.acceptance_rate if m else None,
            "mean_acceptance_length": m.spec.mean_acceptance_length if m else None,
            "engine_start_s": m.engine_start_s if m else None,
            "model_runner": r.engine.get("model_runner"),
            "cudagraph_mode": r.engine.get("cudagraph_mode"),
            "notes": r.reason,
        }
        for lv in m.levels if m else []:
            rec[f"tokens_per_s_bs{lv.batch_size}"] = lv.tokens_per_s
        records.append(rec)
    return pd.DataFrame.from_records(records)


def compare_frame(reports: dict[str, StudyReport]) -> Any:
    """Best trial of each candidate in several studies, side by side (pandas DataFrame, one row per pair)."""
    import pandas as pd

    records = []
    for name, rep in reports.items():
        for c in rep.candidates:
            b = c.best
            m = b.metrics if b is not None else None
            records.append(
                {
                    "study": name,
                    "device": (b.engine.get("device") if b is not None else None) or rep.engine.get("device"),
                    "candidate": c.name,
                    "best configuration": b.label if b is not None else None,
                    "tokens_per_s": m.tokens_per_s if m else None,
                    "speedup": b.speedup if b is not None else None,
                    "acceptance_rate": m.spec.acceptance_rate if m else None,
                    "mean_acceptance_length": m.spec.mean_acceptance_length if m else None,
                    "engine_start_s": m.engine_start_s if m else None,
                    "verdict": c.verdict,
                }
            )
    return pd.DataFrame.from_records(records)


def level_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    who = r.featured.label if r.featured else "best"
    # served windows have no token ids to compare; TTFT and TPOT are then the windows' p50
    same = r.mode != "serve" or any(lv.lossless is not None for lv in r.levels)
    latency = ["TTFT p50", "TPOT p50"] if r.mode == "serve" else ["TTFT", "TPOT"]
    header = [r.level_noun, f"{who} tokens/s", "no speculation tokens/s", "speedup", *latency]
    header += ["same tokens"] if same else []
    body = []
    for lv in r.levels:
        cells = [
            str(lv.batch_size),
            _f(lv.tokens_per_s),
            _f(lv.baseline_tokens_per_s),
            _x(lv.speedup),
            f"{_ms(lv.ttft_s)} (baseline {_ms(lv.baseline_ttft_s)})",
            f"{_ms(lv.tpot_s)} (baseline {_ms(lv.baseline_tpot_s)})",
        ]
        body.append(cells + ([_pct(lv.lossless) if lv.lossless is not None else "–"] if same else []))
    return header, body


_LATENCY_COLUMNS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def served_level_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    """Serve mode: each finalist's latencies (p50 / p90 / p99, ms), throughput and acceptance per level."""
    header = ["level", "configuration"]
    header += [f"{name} p50 / p90 / p99 (ms)" for _, name in _LATENCY_COLUMNS]
    header += ["requests/s", "output tokens/s", "acceptance", "mean acc. length", "SLO held"]
    body = []
    for s in r.served:
        cells = [r.level_name(s.level), f"{s.role}: {s.row.label} (trial {s.row.number})"]
        for key, _ in _LATENCY_COLUMNS:
            cells.append(" / ".join(_f(s.latency_ms.get(f"{key}_p{p}")) for p in (50, 90, 99)))
        cells += [
            _f(s.request_throughput, ".2f"),
            _f(s.tokens_per_s),
            _pct(s.acceptance_rate),
            _f(s.mean_acceptance_length, ".2f"),
            _yes(s.slo_held),
        ]
        body.append(cells)
    return header, body


def slo_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    """Each completed trial's highest request rate keeping the SLO, and how the search got there."""
    header = ["trial", "configuration", "highest rate keeping the SLO", "over no speculation"]
    header += ["rates probed (✓ held, ✗ missed)", "search time", "truncated"]
    body = []
    for t in r.slo.trials if r.slo is not None else []:
        probes = ", ".join(f"{rate:g} {'✓' if held else '✗'}" for rate, held in t.probes)
        body.append(
            [
                str(t.row.number),
                t.row.label,
                f"{t.max_rate_rps:g} requests/s",
                _x(t.rate_speedup),
                probes or "–",
                _f(t.elapsed_s, ".1f", " s"),
                "yes (rate_search.time_limit_s)" if t.truncated else "no",
            ]
        )
    return header, body


def candidate_table(r: StudyReport) -> tuple[list[str], list[list[str]]]:
    header = ["candidate", "method", "trials (done / pruned / failed)", "best", "speedup", "acceptance", "verdict"]
    body = []
    for c in r.candidates:
        b = c.best
        body.append(
            [
                c.name,
                c.method,
                f"{c.trials} ({c.completed} / {c.pruned} / {c.failed})",
                f"{b.label} (trial {b.number})" if b else "–",
                _x(b.speedup) if b else "–",
                _pct(b.metrics.spec.acceptance_rate) if b and b.metrics else "–",
                c.verdict,
            ]
        )
    return header, body
