"""The docs' generated tables match their results files, and the generator follows the results folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from benchmarks import docs_tables as dt

DOC = dt.ROOT / "docs" / "benchmarks.md"


def test_every_generated_table_matches_its_results_files() -> None:
    stale = dt.stale()
    assert stale == [], f"regenerate with `python -m benchmarks.docs_tables --write`: {stale}"


def _names(doc: str) -> set[str]:
    return {m.group("name") for m in dt.BLOCK.finditer((dt.ROOT / doc).read_text())}


def test_docs_hold_the_tables_the_issue_asks_for() -> None:
    names = {m.group("name") for doc in dt.DOCS for m in dt.BLOCK.finditer(doc.read_text())}
    assert {"pays", "versions", "tuner-vs-grid", "noise-engines", "noise-confirmation", "time-gpu", "ci"} <= names
    assert {"readme-results", "readme-demo-time"} <= _names("README.md")
    assert "serve-cpu-example" in _names("docs/guide.md")
    log = {"log-demo-trials", "log-comparison", "log-cross-engine", "log-draft-profile", "trials-wide-026"}
    assert log <= _names("docs/measurement-log.md")


# A measured figure typed by hand: tokens per second, a speedup (1.37x, 2.2×) or a duration (17 min 07 s).
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?tok/s|(?<![\w.])\d+(?:\.\d+)?[x×](?!\w)|\b\d+ min \d+ s\b")


def test_no_measured_figure_outside_the_generated_tables() -> None:
    hits = []
    for doc in [dt.ROOT / "README.md", *sorted((dt.ROOT / "docs").glob("**/*.md"))]:
        text = dt.BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), doc.read_text())
        for n, line in enumerate(text.splitlines(), 1):
            hits += [f"{doc.relative_to(dt.ROOT)}:{n}: {m.group(0)!r}" for m in MEASURED.finditer(line)]
    assert hits == [], "put measured figures in a generated table (benchmarks/docs_tables.py) or drop them"


def test_a_hand_edited_number_is_reported_by_its_table() -> None:
    text = DOC.read_text()
    block = next(m for m in dt.BLOCK.finditer(text) if m.group("name") == "noise-engines")
    edited = block.group(0).replace("1.3%", "1.2%", 1)
    assert edited != block.group(0)
    assert dt.stale_tables(text.replace(block.group(0), edited), DOC) == ["noise-engines"]


def test_check_exits_1_and_names_the_stale_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text("# x\n<!-- generated: noise-engines -->\nold\n<!-- /generated -->\n")
    monkeypatch.setattr(dt, "DOCS", (doc,))
    monkeypatch.setattr(dt, "ROOT", tmp_path)
    assert dt.main(["--check"]) == 1
    assert "noise-engines" in capsys.readouterr().err
    assert dt.main(["--write"]) == 0
    assert "old" not in doc.read_text() and "1.3%" in doc.read_text()
    assert dt.main(["--check"]) == 0


def _results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(dt, "RESULTS", results)
    return results


def test_new_demo_and_ci_runs_are_picked_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(tmp_path, monkeypatch)
    run = results / "demo-20261204-a"
    shutil.copytree(dt.ROOT / "benchmarks" / "results" / "demo-20261201-c", run)
    summary = json.loads((run / "summary.json").read_text())
    summary["phases"] = {"install_s": 200.0}
    (run / "summary.json").write_text(json.dumps(summary))
    ci = results / "ci-20261204-abcdef0"
    ci.mkdir()
    (ci / "summary.json").write_text(
        json.dumps(
            {
                "started": "2026-12-04T17:00:00Z",
                "commit": "abcdef0123",
                "command": "CI=true bash .ci/run",
                "machine": {"cores": 2, "cpu": "AMD EPYC"},
                "exit_code": 0,
                "wall_s": 937.0,
                "passed": 333,
                "failed": 0,
                "errors": 0,
                "peak_rss_kb": 3900000,
            }
        )
    )
    demo = dt.t_time_demo(DOC)
    assert "demo-20261204-a" in demo and "2026-12-04" in demo and "install 3 min 20 s" in demo
    assert "**15 min 45 s**" in demo  # the copied console.txt's `time -v` wall
    assert "demo-20261204-a" in dt.t_readme_demo_time(DOC) and "**15 min 45 s**" in dt.t_readme_demo_time(DOC)
    assert "demo-20261204-a" in dt.t_log_demo_trials(DOC)
    ci_table = dt.t_ci(DOC)
    assert "abcdef0" in ci_table and "333 passed" in ci_table and "**15 min 37 s**" in ci_table


def test_missing_results_render_without_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _results(tmp_path, monkeypatch)
    for name, make in dt.TABLES.items():
        assert isinstance(make(DOC), str), name
    assert "no results file yet" in dt.t_pays(DOC)


def test_each_drafter_is_compared_with_the_fastest_baseline_of_its_level() -> None:
    rows: list[dict[str, Any]] = [
        {"id": "trial 0", "label": "no speculation eager", "drafter": "no speculation", "levels": {1: 50.0, 8: 400.0}},
        {
            "id": "trial 1",
            "label": "no speculation compiled",
            "drafter": "no speculation",
            "levels": {1: 100.0, 8: 300.0},
        },
        {
            "id": "trial 2",
            "label": "ngram k=2 lookup 2-4 compiled",
            "drafter": "n-gram",
            "levels": {1: 150.0, 8: 200.0},
            "accepted": 0.4,
        },
        {
            "id": "trial 3",
            "label": "ngram k=4 lookup 2-4 compiled",
            "drafter": "n-gram",
            "levels": {1: 120.0, 8: 360.0},
        },
    ]
    table = dt.pays_table(rows, "batch")
    assert (
        "| batch 1 | 100 (trial 1: compiled) | 150, 1.50x (trial 2: k=2 lookup 2–4 compiled, 40% accepted) |" in table
    )
    assert "| batch 8 | 400 (trial 0: eager) | 360, 0.90x (trial 3: k=4 lookup 2–4 compiled) |" in table


def test_a_grid_added_to_a_study_folder_enters_the_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(tmp_path, monkeypatch)
    folder = results / "wide-h200-v032-20261204"
    folder.mkdir()
    real = dt.ROOT / "benchmarks" / "results"
    shutil.copy(real / "wide-h200-v032-20261204" / "study_summary.json", folder)
    assert "vLLM 0.32.0" not in dt.t_tuner_vs_grid(DOC)
    shutil.copy(real / "wide-h200-20261201" / "grid.json", folder)  # stands in for the 0.32 grid to come
    table = dt.t_tuner_vs_grid(DOC)
    assert (
        "| `studies/wide-h200.yaml`, vLLM 0.32.0 | batch 16 | no speculation compiled (trial 1, 2,610 tok/s)" in table
    )
    assert "42 of 42 configurations: 4,861 s" in table
    assert "0.26.0 grid" in dt.t_versions(DOC)


def test_a_grid_without_its_study_is_shown_with_its_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = _results(tmp_path, monkeypatch)
    folder = "eagle3-wide-h100-20261207"
    (results / folder).mkdir()
    for name in ["grid.json", "machine.json"]:  # the grid without the study beside it
        shutil.copy(dt.ROOT / "benchmarks" / "results" / folder / name, results / folder / name)
    pays = dt.t_pays(DOC)
    part = pays[pays.index("trained EAGLE-3 head") :]
    assert "no results file yet" in part.split("\n")[0]
    grid = json.loads((results / folder / "grid.json").read_text())  # grows as the grid resumes
    assert f"**The same space by brute force** ({len(grid['runs'])} of {grid['configs_total']} configurations" in part
    assert "NVIDIA H100 80GB HBM3" in part and "#3: k=3 compiled" in part


def test_tables_of_studies_from_two_cards_name_each_card_with_its_studies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wide studies ran on the H200, the EAGLE-3 study on an H100: a source line naming one card for all is wrong."""
    results = _results(tmp_path, monkeypatch)
    for folder in ["eagle3-wide-h100-20261207", "wide-h200-v032-20261204"]:
        shutil.copytree(dt.ROOT / "benchmarks" / "results" / folder, results / folder)
    source = dt.t_tuner_vs_grid(DOC).split("Source: ")[-1]
    h200, h100 = source.index("1× NVIDIA H200 ("), source.index("1× NVIDIA H100 80GB HBM3 (")
    assert h200 < source.index("`studies/wide-h200.yaml`") < h100 < source.index("`studies/wide-h200-eagle3.yaml`")


def test_an_unfinished_confirmation_shows_its_engines_and_the_schedule_its_validation() -> None:
    """The head's H100 study (2026-12-07): the machine went back during round 2, after 4 of its 6 engines
    (its first four engines, whatever later sessions add)."""
    st = next(s for s in dt.STUDIES if s.key == "wide-eagle3-h100")
    out = dt.outcome(st)
    assert out is not None
    conf = {**out["confirmation"], "engines": out["confirmation"]["engines"][:4]}
    labels = {0: "no speculation compiled", 1: "eagle3 trained-head k=3 compiled"}
    text = dt._confirmation(conf, {}, labels, "batch")
    assert "| 1 | no speculation compiled (trial 0) | 172 | 526 | 2,015 | 6,816 | – |" in text
    assert text.endswith("Unfinished: 4 of 6 engines measured, no verdict yet.")
    block = dt.t_trials("wide-eagle3-h100")(dt.ROOT / "docs" / "measurement-log.md")
    assert "Its validation in fresh engines: " in block
