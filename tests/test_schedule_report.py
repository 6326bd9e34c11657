"""The report's "Batch-size schedule" section and its plot, on studies run with the schedule stand-in
engine (tests.fake_schedule, as in tests/test_schedule_flow.py): the section agrees with best.yaml's header."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT
from tests.test_schedule_flow import GAINS, _run, _study
from tuner.outputs import schedule_plot
from tuner.outputs.report import build_report, render_html, render_markdown
from tuner.outputs.report.model import StudyReport
from tuner.outputs.report.prose import headline
from tuner.outputs.report.schedule_section import schedule_table
from tuner.results import outcome, schedule_run, store


def _optimize(tmp: Path, gains: dict[str, float]) -> dict[str, Any]:
    data = _study(tmp, gains)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_TUNER_ENGINE_MODULE", "tests.fake_schedule")
        mp.setenv("PYTHONPATH", str(ROOT))
        assert _run(tmp, data) == 0
    return data


def _load(data: dict[str, Any]) -> optuna.Study:
    return optuna.load_study(study_name=data["name"], storage=data["storage"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sched-exported")
    return tmp, _optimize(tmp, GAINS)


@pytest.fixture(scope="module")
def kept_static(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sched-static")
    return tmp, _optimize(tmp, {**GAINS, "schedule": 0.9})  # the schedule's engine runs 10% slow


LEVEL_LINE = re.compile(
    r"#   batch (\d+): (k=\d+(?: \(no speculation\))?) \(trial (\d+): ([\d.]+) tok/s, ([\d.]+)x\); "
    r"validation ([\d.]+) tok/s = ([\d.]+)x vs best static ([\d.]+) \((.+?), trial (\d+)\): ((?:NOT )?within) noise"
)


def _level_lines_agree(report: StudyReport, best_yaml: str, study: optuna.Study) -> list[list[str]]:
    """Each per-level line of best.yaml carries the study's own measurements (the trial whose figure chose k, the
    schedule's confirmation engine, the fastest static trial there), and the report's row says the same."""
    out = outcome.read(study)
    assert report.schedule is not None and out.confirmation is not None
    engine = schedule_run.representative(out.confirmation)
    assert engine is not None and engine.failure is None
    _, body = schedule_table(report.schedule, report.level_noun)
    rows = {int(r[0]): r for r in body}
    found = list(LEVEL_LINE.finditer(best_yaml))
    assert [int(m[1]) for m in found] == sorted(rows) == [1, 4]
    done = store.completed(study)
    for m in found:
        level = int(m[1])
        chose = store.scored_metrics(study, study.trials[int(m[3])])
        assert chose is not None and (lv := chose.level(level)) is not None and lv.speedup is not None
        assert float(m[4]) == pytest.approx(lv.tokens_per_s, abs=0.05)
        assert float(m[5]) == pytest.approx(lv.speedup, abs=0.005)
        assert float(m[6]) == pytest.approx(engine.levels[level], abs=0.05)
        assert float(m[7]) == pytest.approx(engine.levels[level] / out.reference[level], abs=0.005)
        fastest = max(done, key=lambda t: store.trial_metrics(t).level(level).tokens_per_s)  # type: ignore[union-attr]
        assert int(m[10]) == fastest.number
        assert float(m[8]) == pytest.approx(store.trial_metrics(fastest).level(level).tokens_per_s, abs=0.05)  # type: ignore[union-attr]
        row = rows[level]
        assert row[1] == m[2] and f"{m[4]} tok/s" in row[2] and row[3].startswith(m[8]) and row[4].startswith(m[6])
        assert row[5].startswith(m[11])
    return body


def _plot_png(html: str) -> bytes:
    match = re.search(r'<figure id="plot-schedule"><img alt="schedule" src="data:image/png;base64,([^"]+)"', html)
    assert match is not None
    return base64.b64decode(match.group(1))


def test_an_exported_schedule_is_reported_as_the_export_states_it(exported: tuple[Path, dict[str, Any]]) -> None:
    tmp, data = exported
    study = _load(data)
    run = outcome.read(study).schedule
    assert run is not None and run.exported and run.verdict is not None
    report = build_report(study)
    best_yaml = (tmp / "best.yaml").read_text()
    section = report.schedule
    assert section is not None and section.exported
    head = "batch-size schedule of ngram lookup 1-3 eager (1: k=3; 2-1024: k=0; k=0: no speculation) exported: "
    assert section.outcome.startswith(head + "its engines ") and "beat the baseline engines up to" in section.outcome
    assert section.ranges == ["1: k=3", "2-1024: k=0"]
    body = _level_lines_agree(report, best_yaml, study)
    assert [(row[0], row[1]) for row in body] == [("1", "k=3"), ("4", "k=0 (no speculation)")]
    assert all(row[5].startswith("within noise") for row in body)
    assert f"# validation in fresh engines: {run.verdict.reason}: the schedule is exported" in best_yaml
    assert section.outcome.endswith(f"exported: {run.verdict.reason}")

    md = render_markdown(report)
    assert "**Batch-size schedule**" in md and f"- {head}" in md
    assert headline(report).startswith(f"Use the {head}")  # what best.yaml serves, not the static winner
    assert "`num_speculative_tokens_per_batch_size`): 1: k=3; 2-1024: k=0" in md
    assert "| 1 | k=3 | trial 1: " in md and "| 4 | k=0 (no speculation) | trial 0: " in md
    html = render_html(report)
    assert "<h2>Batch-size schedule</h2>" in html and 'id="schedule-outcome"' in html
    assert _plot_png(html).startswith(b"\x89PNG\r\n\x1a\n")

    # the plot: the schedule's drafter first, a line per k, no speculation at 1.0, the schedule over it
    fig = schedule_plot.speedup_vs_level(report.rows, run, report.mode)
    ax = fig.axes[0]
    assert run.schedule is not None and ax.get_title() == run.schedule.drafter
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert {"k=1", "k=3", "no speculation (1.0)", "schedule: chosen k (trials)"} <= set(lines)
    assert list(lines["no speculation (1.0)"].get_ydata()) == [1.0, 1.0]
    chosen = lines["schedule: chosen k (trials)"]
    assert list(chosen.get_xdata()) == [1, 4]
    assert list(chosen.get_ydata()) == [c.speedup for c in run.schedule.levels]
    stars = lines["schedule: validation engine (exported)"]
    assert run.metrics is not None
    assert list(stars.get_ydata()) == [lv.speedup for lv in sorted(run.metrics.levels, key=lambda lv: lv.batch_size)]
    assert [t.get_text() for t in ax.texts] == ["k=3", "k=0"]

    # on the study's MLflow parent run, like the latency plot
    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`specdec.role` = 'study'")
    assert parents, "no parent run"
    parent = parents[0].info.run_id
    assert schedule_plot.SCHEDULE_ARTIFACT in {a.path for a in client.list_artifacts(parent)}
    png = Path(client.download_artifacts(parent, schedule_plot.SCHEDULE_ARTIFACT)).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_a_schedule_kept_out_says_why_and_the_disabled_one_is_not_reported(
    kept_static: tuple[Path, dict[str, Any]],
) -> None:
    tmp, data = kept_static
    study = _load(data)
    run = outcome.read(study).schedule
    assert run is not None and run.schedule is not None and not run.exported
    report = build_report(study)
    best_yaml = (tmp / "best.yaml").read_text()
    assert report.schedule is not None and not report.schedule.exported
    assert f"# {report.schedule.outcome}\n" in best_yaml and "NOT exported: at level 1" in report.schedule.outcome
    body = _level_lines_agree(report, best_yaml, study)
    assert body[0][5].startswith("NOT within noise")
    md = render_markdown(report)
    assert "NOT exported: at level 1 the schedule ran" in md and "| 1 | k=3 |" in md
    assert not headline(report).startswith("Use the batch-size schedule")  # the static winner is served

    # pre-flight's reason, when it skipped the schedule: one line, no table
    note = "skipped before any engine started: data_parallel_size 2: vLLM ignores the schedule"
    study.set_user_attr(schedule_run.SCHEDULE_ATTR, schedule_run.ScheduleRun(basis=run.basis, note=note).model_dump())
    report = build_report(study)
    md = render_markdown(report)
    assert f"- no batch-size schedule: {note}" in md and "| 1 | k=3 |" not in md
    assert "<h2>Batch-size schedule</h2>" in render_html(report)

    # no speculation at every level: the export and the report give per level the numbers k=0 won by
    from tuner.outputs.export import render_export
    from tuner.results.schedule import Option, derive

    options = [
        Option(k=0, trial=0, tokens_per_s={1: 50.0, 4: 100.0}, speedup={1: 1.0, 4: 1.0}),
        Option(k=3, trial=1, tokens_per_s={1: 40.0, 4: 80.0}, speedup={1: 0.8, 4: 0.8}),
    ]
    derivation = derive("ngram lookup 1-3 eager", 1, options, [1, 4], {1: 0.05, 4: 0.05})
    static = schedule_run.ScheduleRun(basis=run.basis, derivation=derivation)
    study.set_user_attr(schedule_run.SCHEDULE_ATTR, static.model_dump())
    line = "batch 1: k=0 (no speculation) (trial 0: 50.0 tok/s, 1.00x); fastest k=3: 40.0 tok/s = 0.80x; noise 5%"
    exported = render_export(_load(data))
    assert "# per batch size, the k chosen against ngram lookup 1-3 eager's fastest k there:" in exported
    assert f"#   {line}\n" in exported
    report = build_report(_load(data))
    assert f"  - {line}" in render_markdown(report) and 'id="schedule-static"' in render_html(report)

    # switched off: the report has no section and no plot (what was measured stays stored)
    data["schedule"] = {"enabled": False}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_TUNER_ENGINE_MODULE", "tests.fake_schedule")
        mp.setenv("PYTHONPATH", str(ROOT))
        assert _run(tmp, data) == 0
    report = build_report(_load(data))
    assert report.schedule is None
    assert "Batch-size schedule" not in render_markdown(report)
    html = render_html(report)
    assert "Batch-size schedule" not in html and 'id="plot-schedule"' not in html
