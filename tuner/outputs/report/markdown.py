"""The report as Markdown: the same tables and explanation as the HTML, to paste into a pull request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.outputs.report.schedule_section import schedule_table
from tuner.outputs.report.tables import candidate_table, level_table, served_level_table, slo_table, trial_table

if TYPE_CHECKING:
    from tuner.outputs.report.model import StudyReport


def _md_table(header: list[str], body: list[list[str]]) -> str:
    def clean(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(clean(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(clean(c) for c in cells) + " |" for cells in body]
    return "\n".join(lines)


def _schedule(report: StudyReport) -> list[str]:
    section = report.schedule
    if section is None:
        return []
    out = ["**Batch-size schedule**", "", f"- {section.outcome}"]
    if section.ranges:
        out.append(f"- ranges (`num_speculative_tokens_per_batch_size`): {'; '.join(section.ranges)}")
    out += [f"- note: {c}" for c in section.caveats]
    if section.static_answer:
        out += [f"- {section.static_answer[0]}"] + [f"  - {line}" for line in section.static_answer[1:]]
    out.append("")
    header, body = schedule_table(section, report.level_noun)
    if body:
        out += [_md_table(header, body), ""]
    if section.rules:
        out += [f"Rules: {section.rules}.", ""]
    if section.run is not None and section.run.schedule is not None:
        out += ["Speedup against load per drafter, the schedule over it: in report.html.", ""]
    return out


def render_markdown(report: StudyReport) -> str:
    out = [f"### specdec-tuner: study `{report.study_name}`", "", f"**{report.headline}**", ""]
    if report.engine:
        out += [
            f"Measured on {report.engine.get('device', '?')}, vLLM {report.engine.get('vllm', '?')}, "
            f"torch {report.engine.get('torch', '?')}; report generated {report.generated}.",
            "",
        ]
    if report.measurement:
        out += ["**How it was measured**", ""] + [f"- {s}" for s in report.measurement] + [""]
    if report.levels:
        out += [_md_table(*level_table(report)), ""]
    if report.served:
        out += ["**Latency per concurrency level**", "", _md_table(*served_level_table(report)), ""]
    if report.slo is not None:
        base = report.slo.baseline_rate_rps
        out += [
            f"**SLO: highest request rate** ({report.slo.limits()}; objective {report.slo.objective}"
            + (f"; no speculation: {base:g} requests/s" if base is not None else "")
            + ")",
            "",
            _md_table(*slo_table(report)),
            "",
        ]
    if report.mode == "serve":
        out += [
            "Latency against load (p50/p90/p99 per level above; plotted per level and per probed rate): "
            "in report.html, and `latency_vs_load.png` on the study's MLflow run.",
            "",
        ]
    if report.why:
        out += ["**Why**", ""] + [f"- {s}" for s in report.why] + [""]
    if report.decided:
        out += ["**How it was decided**", ""] + [f"- {s}" for s in report.decided] + [""]
    if report.confirmation:
        out += ["**Confirmation in fresh engines**", ""] + [f"- {s}" for s in report.confirmation] + [""]
    out += _schedule(report)
    if report.candidates:
        out += [_md_table(*candidate_table(report)), ""]
    if report.best_config:
        out += [
            "<details><summary>Best configuration (<code>vllm serve --config best.yaml</code>)</summary>",
            "",
            "```yaml",
            report.best_config.rstrip(),
            "```",
            "",
            "</details>",
            "",
        ]
    header, body = trial_table(report.rows)
    out += [f"<details><summary>All {len(report.rows)} trials</summary>", "", _md_table(header, body), "", "</details>"]
    return "\n".join(out) + "\n"
