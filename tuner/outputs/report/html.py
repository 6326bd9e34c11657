"""The report as one self-contained HTML file: inline CSS, plots as base64 PNG, no JavaScript, nothing fetched."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

from tuner.outputs.report.importances import MIN_IMPORTANCE_CONFIGS
from tuner.outputs.report.schedule_section import schedule_table
from tuner.outputs.report.tables import candidate_table, level_table, served_level_table, slo_table, trial_table

if TYPE_CHECKING:
    from tuner.outputs.report.model import StudyReport


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em}
.verdict{font-size:1.25em;padding:.8em 1em;border-radius:6px;background:#eef6ee;border-left:6px solid #2ca02c}
.verdict.no{background:#fbf3e6;border-left-color:#ff7f0e}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
th,td{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.COMPLETE td:nth-child(2){color:#2a7a2a} tr.PRUNED td:nth-child(2){color:#a66a00}
tr.FAIL td:nth-child(2){color:#c62828;font-weight:600} tr.best{background:#f0f8ff}
pre{background:#f7f7f7;padding:.8em;border-radius:4px;overflow-x:auto;font-size:.85em}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eee} figcaption{color:#555;font-size:.9em}
.note{color:#666;font-style:italic}
"""

_PLOT_CAPTIONS = {
    "history": "Each trial's score (its weighted speedup over no speculation, less the MAD penalty); the line is "
    "the best so far. Crosses are pruned trials (grey: their last partial throughput over no speculation's at that "
    "batch size; orange on the axis: pruned before reporting one, e.g. for low acceptance), red triangles failed "
    "trials.",
    "throughput": "Throughput of every speculative trial against num_speculative_tokens, per batch size; the dashed "
    "line is no speculation. Above the line, speculation pays.",
    "latency": "Served latency of the chosen configuration, the best baseline and the best speculative one: TTFT "
    "and TPOT at the SLO's percentile (p90 without an SLO) per max-concurrency level (top) and, where an SLO search "
    "ran, per request rate it probed (bottom). Crosses missed the SLO; dashed lines are its limits.",
    "acceptance": "Share of drafts whose token at each position was accepted. Speculation pays when the early "
    "positions are accepted often; positions that are rarely accepted only cost drafting time.",
    "importances": "How much of the score's variation each setting explains (fANOVA over the completed trials; "
    f"shown once at least {MIN_IMPORTANCE_CONFIGS} distinct configurations completed).",
    "schedule": "Speedup over no speculation per batch size, a panel per drafter (method, draft model, "
    "enforce_eager) and a line per k (its best trial). The dashed line is no speculation. On the schedule's drafter: "
    "the chosen k per level (black rings at the speedup of the trial that chose it) and, once validated, the "
    "validation engine's speedup per level (red stars).",
    "engine_start": "Engine start time per trial: compiled mode (enforce_eager=false) starts slower but may run faster.",
}


def _html_table(header: list[str], body: list[list[str]], row_classes: list[str] | None = None) -> str:
    def cell(value: str, tag: str) -> str:
        numeric = value[:1].isdigit() or value.startswith("–") or value.endswith("×")
        cls = ' class="num"' if tag == "td" and numeric and len(value) < 24 else ""
        return f"<{tag}{cls}>{html.escape(value)}</{tag}>"

    head = "".join(cell(h, "th") for h in header)
    lines = []
    for i, cells in enumerate(body):
        cls = f' class="{row_classes[i]}"' if row_classes else ""
        lines.append(f"<tr{cls}>" + "".join(cell(c, "td") for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _captions(report: StudyReport) -> dict[str, str]:
    if report.mode != "serve":
        return _PLOT_CAPTIONS
    out = {k: v.replace("batch size", "concurrency level") for k, v in _PLOT_CAPTIONS.items()}
    if report.slo is not None and report.slo.objective == "goodput":
        out["history"] = out["history"].replace(
            "its weighted speedup over no speculation, less the MAD penalty",
            "its highest request rate keeping the SLO over no speculation's",
        )
    return out


def figures(report: StudyReport) -> dict[str, Any]:
    """The report's plots, by name (matplotlib Figures); serve mode adds the finalists' latency against load."""
    from tuner.outputs import latency_plots, plots

    out = {
        "history": plots.history(report.rows),
        "throughput": plots.throughput_vs_k(report.rows),
        "acceptance": plots.acceptance_per_position(report.rows),
        "importances": plots.importances(report.importances, report.importance_note),
        "engine_start": plots.engine_start_vs_eager(report.rows),
    }
    if report.mode == "serve":
        out["latency"] = latency_plots.latency_vs_load(report.finalists, report.slo)
    if report.schedule is not None:
        from tuner.outputs import schedule_plot

        out["schedule"] = schedule_plot.speedup_vs_level(report.rows, report.schedule.run, report.mode)
    return out


def render_html(report: StudyReport, figs: dict[str, Any] | None = None) -> str:
    """The whole page; ``figs``: the report's plots when the caller drew them already (``figures``)."""
    parts = _header(report)
    parts += _measured(report)
    parts += _findings(report)
    parts += _schedule(report)
    parts += _best_config(report)
    if report.candidates:
        parts.append("<h2>Candidates</h2>")
        parts.append(_html_table(*candidate_table(report)))
    parts += _plots(report, figures(report) if figs is None else figs)
    parts += _trials_and_settings(report)
    noun = "concurrency level" if report.mode == "serve" else "batch size"
    parts.append(
        f'<p class="meta">Speedups are output tokens/s over the study\'s best no-speculation median at each {noun}, '
        f"averaged over the levels with the score's weights; per {noun} in the first table. "
        "Every figure is the median of the measured repeats.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _header(report: StudyReport) -> list[str]:
    """From the doctype to the verdict: title, when and where it was measured."""
    esc = html.escape
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>specdec-tuner report: {esc(report.study_name)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>specdec-tuner report: {esc(report.study_name)}</h1>",
        f'<p class="meta">generated {esc(report.generated)}'
        + (f" from {esc(report.storage)}" if report.storage else "")
        + (
            f" · measured on {esc(str(report.engine.get('device', '?')))}, vLLM {esc(str(report.engine.get('vllm', '?')))}, "
            f"torch {esc(str(report.engine.get('torch', '?')))}"
            if report.engine
            else ""
        )
        + "</p>",
        f'<p class="verdict{"" if report.paid else " no"}" id="verdict">{esc(report.headline)}</p>',
    ]


def _measured(report: StudyReport) -> list[str]:
    """How the trials were measured (mode, levels, sampling, SLO)."""
    if not report.measurement:
        return []
    code = re.compile(r"`([^`]+)`")
    items = "".join("<li>" + code.sub(r"<code>\1</code>", html.escape(s)) + "</li>" for s in report.measurement)
    return [f'<h2>How it was measured</h2><ul id="measurement">{items}</ul>']


def _served(report: StudyReport) -> list[str]:
    """Serve mode: the finalists' latencies per concurrency level, and the SLO rate of every trial."""
    esc = html.escape
    parts = []
    if report.served:
        parts.append("<h2>Latency per concurrency level</h2>")
        parts.append('<div id="served-levels">' + _html_table(*served_level_table(report)) + "</div>")
    if report.slo is not None:
        base = report.slo.baseline_rate_rps
        parts.append("<h2>SLO: highest request rate</h2>")
        parts.append(
            f'<p id="slo-limits">Limits: {esc(report.slo.limits())}. Objective: {esc(report.slo.objective)}. '
            + (f"No speculation kept the SLO up to {base:g} requests/s." if base is not None else "")
            + "</p>"
        )
        parts.append('<div id="slo">' + _html_table(*slo_table(report)) + "</div>")
    return parts


def _findings(report: StudyReport) -> list[str]:
    """Speedup per level, serve mode's latency and SLO tables, the "why" sentences and the confirmation."""
    esc = html.escape
    parts = []
    if report.levels:
        parts.append(f"<h2>Speedup per {'concurrency level' if report.mode == 'serve' else 'batch size'}</h2>")
        parts.append(_html_table(*level_table(report)))
    parts += _served(report)
    if report.why:
        parts.append('<h2>Why</h2><ul id="why">' + "".join(f"<li>{esc(s)}</li>" for s in report.why) + "</ul>")
    if report.decided:
        parts.append(
            '<h2>How it was decided</h2><ul id="decided">'
            + "".join(f"<li>{esc(s)}</li>" for s in report.decided)
            + "</ul>"
        )
    if report.confirmation:
        parts.append(
            '<h2>Confirmation in fresh engines</h2><ul id="confirmation">'
            + "".join(f"<li>{esc(s)}</li>" for s in report.confirmation)
            + "</ul>"
        )
    return parts


def _schedule(report: StudyReport) -> list[str]:
    """What became of the batch-size schedule: the export's outcome line, ranges and per-level table."""
    section = report.schedule
    if section is None:
        return []
    esc = html.escape
    parts = ["<h2>Batch-size schedule</h2>", f'<p id="schedule-outcome">{esc(section.outcome)}</p>']
    if section.ranges:
        parts.append(
            "<p>Ranges (<code>num_speculative_tokens_per_batch_size</code>): "
            f'<span id="schedule-ranges">{esc("; ".join(section.ranges))}</span></p>'
        )
    header, body = schedule_table(section, report.level_noun)
    if body:
        parts.append('<div id="schedule">' + _html_table(header, body) + "</div>")
    parts += [f'<p class="note">note: {esc(c)}</p>' for c in section.caveats]
    if section.static_answer:
        items = "".join(f"<li>{esc(line)}</li>" for line in section.static_answer[1:])
        parts.append(f'<p>{esc(section.static_answer[0])}</p><ul id="schedule-static">{items}</ul>')
    if section.rules:
        parts.append(f'<p class="meta">Rules: {esc(section.rules)}.</p>')
    return parts


def _best_config(report: StudyReport) -> list[str]:
    esc = html.escape
    parts = ["<h2>Best configuration</h2>"]
    if report.best_config:
        parts.append(
            "<p>Start it with <code>vllm serve --config best.yaml --host 127.0.0.1</code> "
            "(the same file <code>python -m tuner export</code> writes):</p>"
        )
        parts.append(f'<pre id="best-config">{esc(report.best_config)}</pre>')
    else:
        parts.append(f'<p class="note">{esc(report.best_config_note or "no completed trial")}</p>')
    return parts


def _plots(report: StudyReport, figs: dict[str, Any]) -> list[str]:
    from tuner.outputs import plots

    esc = html.escape
    parts = ["<h2>Plots</h2>"]
    captions = _captions(report)
    for name, fig in figs.items():
        data = plots.png_base64(fig)
        parts.append(
            f'<figure id="plot-{name}"><img alt="{esc(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(captions[name])}</figcaption></figure>"
        )
    if report.importance_note:
        parts.append(f'<p class="note">{esc(report.importance_note)}</p>')
    return parts


def _trials_and_settings(report: StudyReport) -> list[str]:
    parts = ["<h2>All trials</h2>"]
    header, body = trial_table(report.rows)
    chosen = report.chosen.number if report.chosen else None
    classes = [r.state + (" best" if r.number == chosen else "") for r in report.rows]
    parts.append('<div id="trials">' + _html_table(header, body, classes) + "</div>")
    if report.settings:
        parts.append("<h2>Study settings</h2>")
        parts.append(_html_table(["setting", "value"], [[k, v] for k, v in report.settings.items()]))
    return parts
