"""The report as Markdown: the same tables and explanation as the HTML, to paste into a pull request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.outputs.report.tables import candidate_table, level_table, trial_table

if TYPE_CHECKING:
    from tuner.outputs.report.model import StudyReport


def _md_table(header: list[str], body: list[list[str]]) -> str:
    def clean(value: str) -> str:
        return value.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(clean(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(clean(c) for c in cells) + " |" for cells in body]
    return "\n".join(lines)


def render_markdown(report: StudyReport) -> str:
    out = [f"### specdec-tuner: study `{report.study_name}`", "", f"**{report.headline}**", ""]
    if report.engine:
        out += [
            f"Measured on {report.engine.get('device', '?')}, vLLM {report.engine.get('vllm', '?')}, "
            f"torch {report.engine.get('torch', '?')}; report generated {report.generated}.",
            "",
        ]
    if report.levels:
        out += [_md_table(*level_table(report)), ""]
    if report.why:
        out += ["**Why**", ""] + [f"- {s}" for s in report.why] + [""]
    if report.confirmation:
        out += ["**Confirmation in fresh engines**", ""] + [f"- {s}" for s in report.confirmation] + [""]
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
