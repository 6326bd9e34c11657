"""The report (HTML and Markdown), its plots, and what optimize leaves in MLflow for reviewing a study.

Studies come from the fake engine (tests/fake_engine.py): fast and deterministic — n-gram wins
(k=4 is best), the 4-layer draft model is hopeless (pruned), k=5 crashes.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import FAKE_ENGINE, ROOT, study_dict, write_study
from tuner.cli import main
from tuner.engine.preflight import REJECTED_ATTR
from tuner.outputs import plots
from tuner.outputs.report import build_report, collect_rows, param_importances, render_html, render_markdown
from tuner.results import store
from tuner.trial.acceptance_plot import ACCEPTANCE_ARTIFACT

PLOTS = ("history", "throughput", "acceptance", "importances", "engine_start")


@dataclass
class FakeStudy:
    dir: Path
    path: Path
    data: dict[str, Any]
    storage: str
    tracking_uri: str
    name: str

    def load(self) -> optuna.Study:
        return optuna.load_study(study_name=self.name, storage=self.storage)


def make_study(
    tmp: Path,
    name: str = "report-study",
    trials: int = 8,
    batch_sizes: tuple[int, ...] = (1, 4),
    eager: tuple[bool, ...] = (True, False),
    first_trials: list[dict[str, Any]] | None = None,
    tracking_uri: str | None = None,
    extra_args: tuple[str, ...] = (),
    workload: dict[str, Any] | None = None,
) -> FakeStudy:
    """Run a study with the fake engine in this process (env set only for the call)."""
    tmp.mkdir(parents=True, exist_ok=True)
    data = study_dict(tmp, name=name, budget={"trials": trials, "trial_timeout_s": 30})
    data["workload"]["batch_sizes"] = list(batch_sizes)
    data["workload"].update(workload or {})
    data["search"]["enforce_eager"] = list(eager)
    data["target"]["engine_args"]["fake_crash_k"] = 5
    data["target"]["engine_args"]["fake_repeat_s"] = 0.01
    data["search"]["first_trials"] = (
        first_trials
        if first_trials is not None
        else [
            {"candidate": "ngram", "num_speculative_tokens": 3},
            {"candidate": "draft-4l", "num_speculative_tokens": 2},
            {"candidate": "ngram", "num_speculative_tokens": 5},
            {"candidate": "ngram", "num_speculative_tokens": 4, "enforce_eager": False},
        ]
    )
    if tracking_uri:
        data["tracking"]["uri"] = tracking_uri
    path = write_study(tmp, data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_TUNER_ENGINE_MODULE", FAKE_ENGINE)
        mp.setenv("PYTHONPATH", str(ROOT))
        code = main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp / "runs"), *extra_args])
    assert code == 0
    return FakeStudy(tmp, path, data, data["storage"], data["tracking"]["uri"], name)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> FakeStudy:
    return make_study(tmp_path_factory.mktemp("report"))


def _report(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["report", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the HTML report -------------------------------------------------------------------------------------
def test_html_report_is_self_contained_and_answers_which_how_much_why(
    study: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "report.html"
    code, stdout, _ = _report(["--study", str(study.path), "--output", str(out)], capsys)
    assert code == 0 and "report written to" in stdout
    text = out.read_text()

    # offline: no script, nothing fetched from elsewhere
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text, re.I)
    assert "@import" not in text and "url(" not in text

    # which configuration, how much faster (overall and per batch size)
    verdict = re.search(r'<p class="verdict" id="verdict">(.*?)</p>', text, re.S)
    assert verdict is not None
    assert "Use ngram k=4" in verdict.group(1) and "1.48× the throughput of no speculation" in verdict.group(1)
    assert "Speedup per batch size" in text

    # how it was measured: offline batches, and the sampling (top_p unset: vLLM's default)
    measured = re.search(r'<ul id="measurement">(.*?)</ul>', text, re.S)
    assert measured is not None
    assert "<code>vllm.LLM</code>" in measured.group(1)
    how = unescape(re.sub(r"<[^>]+>", "", measured.group(1)))
    assert "Offline batches: each trial builds a vllm.LLM and times LLM.generate on batches of 1, 4 prompts" in how
    assert "Sampling: temperature 0 (greedy), top_p vLLM default 1.0, max_tokens 24 output tokens per request." in how
    assert "served" not in how.lower() and 'id="plot-latency"' not in text
    for bs in ('<td class="num">1</td>', '<td class="num">4</td>'):
        assert bs in text
    assert 'id="best-config"' in text and "speculative-config:" in text and "num_speculative_tokens: 4" in text

    # why: acceptance, per-position profile, other k, the losing candidates, failures
    why = re.search(r'<ul id="why">(.*?)</ul>', text, re.S)
    assert why is not None
    why_text = why.group(1)
    assert "60% of" in why_text and "3.40 tokens on average" in why_text
    assert "Acceptance by draft position 1–4" in why_text
    assert "k=3: 1.36×" in why_text and "k=4: 1.48×" in why_text
    assert re.search(r"draft-4l: no trial completed: \d+ pruned \(acceptance 1.0% below", why_text)
    assert re.search(r"\d+ failed \(\d+× engine_error\)", why_text)

    # all trials with state and reason
    trials = re.search(r'<div id="trials">(.*?)</div>', text, re.S)
    assert trials is not None
    rows = re.findall(r"<tr class=\"(\w+)( best)?\">", trials.group(1))
    assert len(rows) == len(study.load().get_trials())
    assert {state for state, _ in rows} == {"COMPLETE", "PRUNED", "FAIL"}
    assert sum(1 for _, best in rows if best) == 1
    assert "engine_error: RuntimeError: Engine core initialization failed" in text
    assert "pruned: acceptance 1.0% below pruning.min_acceptance_rate" in text

    # the five plots, as real PNGs
    for name in PLOTS:
        match = re.search(rf'<figure id="plot-{name}"><img alt="{name}" src="data:image/png;base64,([^"]+)"', text)
        assert match is not None, name
        png = base64.b64decode(match.group(1))
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000


def test_markdown_report_for_a_pull_request(study: FakeStudy, capsys: pytest.CaptureFixture[str]) -> None:
    code, md, _ = _report(["--study", str(study.path), "--format", "md"], capsys)
    assert code == 0
    assert md.startswith("### specdec-tuner: study `report-study`")
    assert "**Use ngram k=4 lookup" in md and "1.48×" in md
    assert "| batch size |" in md and "| 1 | " in md and "| 4 | " in md
    assert "**How it was measured**" in md and "- Offline batches: each trial builds a `vllm.LLM`" in md
    assert "- Sampling: temperature 0 (greedy), top_p vLLM default 1.0, max_tokens 24" in md
    assert "Latency per concurrency level" not in md and "SLO" not in md
    assert "**Why**" in md and "- ngram k=4" in md
    assert "```yaml" in md and "speculative-config:" in md
    assert "| trial | state | configuration |" in md
    assert "<img" not in md and "base64" not in md
    table_rows = [line for line in md.splitlines() if re.match(r"\| \d+ \| (COMPLETE|PRUNED|FAIL) \|", line)]
    assert len(table_rows) == len(study.load().get_trials())


def test_format_follows_the_output_suffix(study: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "summary.md"
    assert _report(["--study", str(study.path), "--output", str(out)], capsys)[0] == 0
    assert out.read_text().startswith("### specdec-tuner")
    html_out = tmp_path / "r.txt"
    assert _report(["--study", str(study.path), "--output", str(html_out), "--format", "html"], capsys)[0] == 0
    assert html_out.read_text().startswith("<!DOCTYPE html>")


def test_default_output_is_report_html(
    study: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _report(["--study", str(study.path)], capsys)[0] == 0
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--study", "missing.yaml"], "--study"),
        (["--study", "{study}", "--output", "{dir}"], "--output"),
        (["--study", "{study}", "--storage", "sqlite:///{dir}/empty.db"], "is not in storage"),
        (["--study", "{study}", "--storage", "not-a-url"], "storage:"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    study: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    filled = [a.format(study=study.path, dir=tmp_path) for a in args]
    code, _, err = _report(filled, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0] and "fix:" in lines[0]


def test_unknown_format_is_refused(study: FakeStudy, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", "--study", str(study.path), "--format", "pdf"])
    assert exc.value.code == 2
    assert "--format" in capsys.readouterr().err


# -- small and odd studies ---------------------------------------------------------------------------------
def test_baseline_only_study_explains_instead_of_crashing(tmp_path: Path) -> None:
    small = make_study(tmp_path, name="tiny", trials=1, batch_sizes=(1,), eager=(True,), first_trials=[])
    report = build_report(small.load())
    assert report.importances is None and "at least 4 distinct completed configurations" in report.importance_note
    assert report.headline.startswith("No speculative configuration completed yet")
    html = render_html(report)
    assert html.count("data:image/png;base64,") == len(PLOTS)
    assert "at least 4 distinct completed configurations" in html
    assert "| 0 | COMPLETE | no speculation eager |" in render_markdown(report)


def test_empty_study_and_failed_candidates(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    empty = optuna.create_study(study_name="empty", storage=storage)
    report = build_report(empty)
    assert "no trials yet" in report.headline and report.best_config is None
    assert "<!DOCTYPE html>" in render_html(report)

    failing = make_study(
        tmp_path / "failing",
        name="failing",
        trials=2,
        batch_sizes=(1,),
        eager=(True,),
        first_trials=[{"candidate": "ngram", "num_speculative_tokens": 5}],
    )
    report = build_report(failing.load())
    assert report.headline.startswith("No speculative configuration completed yet")
    ngram = next(c for c in report.candidates if c.name == "ngram")
    assert ngram.verdict == "no trial completed: 1 failed (engine_error)"
    assert "ngram: no trial completed: 1 failed (engine_error)." in report.why
    failed = [r for r in report.rows if r.state == "FAIL"]
    assert len(failed) == 1 and failed[0].reason.startswith("engine_error: RuntimeError")
    values, note = param_importances(failed)
    assert values is None and "at least 4 distinct" in note


def test_report_file_keeps_secrets_out(
    study: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODEL_API_KEY", "SmolLM2-135M-Instruct")  # pretend the model path were a credential
    out = tmp_path / "report.html"
    assert _report(["--study", str(study.path), "--output", str(out)], capsys)[0] == 0
    text = out.read_text()
    assert "SmolLM2-135M-Instruct" not in text and "***" in text


def test_param_importances_use_normalised_settings(study: FakeStudy) -> None:
    values, note = param_importances(collect_rows(study.load()))
    assert values is not None, note
    assert "candidate" in values and "num_speculative_tokens" in values
    assert not any("." in name for name in values)  # not Optuna's per-candidate names
    assert abs(sum(values.values()) - 1.0) < 1e-6


def test_plots_render_for_the_notebook(study: FakeStudy) -> None:
    rows = collect_rows(study.load())
    figures = [
        plots.history(rows),
        plots.throughput_vs_k(rows),
        plots.acceptance_per_position(rows),
        plots.engine_start_vs_eager(rows),
        plots.compare_studies({"a": rows, "b": rows[:3]}),
        plots.history([]),
        plots.throughput_vs_k([]),
        plots.acceptance_per_position([]),
        plots.engine_start_vs_eager([]),
        plots.compare_studies({}),
    ]
    for fig in figures:
        assert plots.png_bytes(fig).startswith(b"\x89PNG")
    panels = plots.throughput_vs_k(rows).axes
    assert [ax.get_title() for ax in panels] == ["batch size 1", "batch size 4"]


# -- what happened to each candidate, and what a small study can say ---------------------------------------
REJECTION = "vocabulary (token → id) differs (target 'Ġmeltdown' → 49140, draft 'Ġmeltdown' → 49150)"


@pytest.fixture(scope="module")
def draft_refused(tmp_path_factory: pytest.TempPathFactory) -> FakeStudy:
    """Pre-flight removes draft-4l; three distinct configurations complete (baseline, ngram k=3 and k=4)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            "tuner.engine.preflight.check_draft_pair", lambda t, d, *rest: REJECTION if d.endswith("-4L") else None
        )
        return make_study(
            tmp_path_factory.mktemp("refused"),
            name="refused",
            trials=3,
            batch_sizes=(1,),
            eager=(True,),
            first_trials=[
                {"candidate": "ngram", "num_speculative_tokens": 3},
                {"candidate": "ngram", "num_speculative_tokens": 4},
            ],
        )


def test_candidate_removed_by_preflight_is_reported_with_its_reason(draft_refused: FakeStudy) -> None:
    study = draft_refused.load()
    assert study.user_attrs[REJECTED_ATTR] == {"draft-4l": REJECTION}
    report = build_report(study)
    draft = next(c for c in report.candidates if c.name == "draft-4l")
    assert draft.trials == 0
    assert draft.verdict == f"removed by pre-flight before any trial, never measured: {REJECTION}"
    assert f"draft-4l: removed by pre-flight before any trial, never measured: {REJECTION}." in report.why
    for text in (render_markdown(report), unescape(render_html(report))):
        assert "sampler never chose" not in text
        assert f"removed by pre-flight before any trial, never measured: {REJECTION}" in text


def test_importances_wait_for_enough_distinct_configurations(draft_refused: FakeStudy, study: FakeStudy) -> None:
    rows = collect_rows(draft_refused.load())
    assert sum(1 for r in rows if r.measured) == 3
    values, note = param_importances(rows)
    assert values is None
    assert note.startswith("Too few trials for parameter importances") and "at least 4 distinct" in note
    assert "this study has 3 distinct completed configurations" in note
    assert note in unescape(render_html(build_report(draft_refused.load())))
    big, _ = param_importances(collect_rows(study.load()))
    assert big is not None  # the 8-trial study has enough


def _pruned_crosses(fig: Any) -> dict[int, float]:
    ax = fig.axes[0]
    return {int(x): float(y) for c in ax.collections if c.get_label().startswith("pruned") for x, y in c.get_offsets()}


def test_history_draws_every_pruned_trial_as_a_cross(study: FakeStudy) -> None:
    rows = collect_rows(study.load())
    pruned = {r.number for r in rows if r.state == "PRUNED"}
    assert pruned  # draft-4l is pruned for its acceptance before any throughput was reported
    assert set(_pruned_crosses(plots.history(rows))) == pruned


def test_pruned_cross_sits_at_the_last_partial_value_also_for_a_reused_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from tuner.outputs.report import model as report

    # One batch size, two repeats; no speculation ran 10 tok/s there: a partial 7.5 tok/s is 0.75x.
    workload = SimpleNamespace(batch_sizes=[1], repeats=2)
    monkeypatch.setattr(report, "config_from_study", lambda study: SimpleNamespace(workload=workload))
    monkeypatch.setattr(store, "reference", lambda study: {1: 10.0})
    mem = optuna.create_study(direction="maximize")
    mem.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, intermediate_values={0: 9.0, 1: 7.5}))
    mem.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs={store.DUPLICATE_OF: 0}))
    rows = collect_rows(mem)
    assert [r.partial_tokens_per_s for r in rows] == [7.5, 7.5]
    assert _pruned_crosses(plots.history(rows)) == {0: 0.75, 1: 0.75}


# -- MLflow: artifacts, plots, tags for the UI's search ------------------------------------------------------
def test_mlflow_parent_run_carries_report_and_best_config(study: FakeStudy) -> None:
    client = MlflowClient(study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    parent_id = study.load().user_attrs[store.PARENT_RUN]
    artifacts = {a.path for a in client.list_artifacts(parent_id)}
    assert {"report.html", "report.md", "best_config.yaml", "study.yaml"} <= artifacts
    html = Path(client.download_artifacts(parent_id, "report.html")).read_text()
    assert "Use ngram k=4" in html and html.count("data:image/png;base64,") == len(PLOTS)
    best_config = Path(client.download_artifacts(parent_id, "best_config.yaml")).read_text()
    assert "num_speculative_tokens: 4" in best_config
    parent = client.get_run(parent_id)
    assert parent.data.tags["best_config"].startswith("ngram k=4")
    assert exp is not None


def test_each_speculative_trial_run_carries_its_acceptance_plot(study: FakeStudy) -> None:
    client = MlflowClient(study.tracking_uri)
    for t in study.load().get_trials():
        run_id = store.trial_record(t).mlflow_run_id
        names = {a.path for a in client.list_artifacts(run_id)}
        spec = store.trial_spec(t)
        measured = t.state.name == "COMPLETE" and store.trial_record(t).duplicate_of is None
        has_profile = measured and spec is not None and not spec.is_baseline
        assert (ACCEPTANCE_ARTIFACT in names) == has_profile, (t.number, names)
        if has_profile:
            png = Path(client.download_artifacts(run_id, ACCEPTANCE_ARTIFACT)).read_bytes()
            assert png.startswith(b"\x89PNG")


def test_ui_search_queries_find_what_the_readme_promises(study: FakeStudy) -> None:
    client = MlflowClient(study.tracking_uri)
    exp = client.get_experiment_by_name(study.name)
    assert exp is not None
    trials = {store.trial_record(t).mlflow_run_id: t for t in study.load().get_trials()}

    def search(query: str) -> set[str]:
        return {r.info.run_id for r in client.search_runs([exp.experiment_id], filter_string=query)}

    ngram = search("params.method = 'ngram'")
    assert ngram == {rid for rid, t in trials.items() if (s := store.trial_spec(t)) and s.method == "ngram"}
    faster = search("metrics.speedup > 1")
    assert faster and all(trials[rid].state.name == "COMPLETE" for rid in faster)
    assert faster == {
        rid
        for rid, t in trials.items()
        if (m := store.trial_metrics(t))
        and m.speedup is not None
        and m.speedup > 1
        and store.trial_record(t).duplicate_of is None
    }
    assert search("params.method = 'ngram' and metrics.speedup > 1") == faster & ngram
    assert search("tags.state = 'FAIL'") == {rid for rid, t in trials.items() if t.state.name == "FAIL"}
    assert search("tags.failure_class = 'engine_error'") == search("tags.state = 'FAIL'")
    assert search("tags.state = 'PRUNED'") == {rid for rid, t in trials.items() if t.state.name == "PRUNED"}
    assert search("params.num_speculative_tokens = '4'") <= ngram
    compiled = {rid for rid, t in trials.items() if (s := store.trial_spec(t)) and not s.enforce_eager}
    assert compiled and search("params.enforce_eager = 'False'") == compiled
    lossless = {
        rid
        for rid, t in trials.items()
        if t.state.name == "COMPLETE"
        and store.trial_record(t).duplicate_of is None
        and (s := store.trial_spec(t))
        and not s.is_baseline
    }
    assert lossless and search("tags.lossless = 'exact'") == lossless
    best = search("tags.best = 'true'")
    assert len(best) == 1
    best_spec = store.trial_spec(trials[best.pop()])
    assert best_spec is not None and best_spec.label().startswith("ngram k=4")
    assert len(search("tags.`specdec.role` = 'trial'")) == len(trials)


def test_best_tag_moves_when_a_resumed_study_finds_a_better_trial(tmp_path: Path) -> None:
    first = [
        {"candidate": "draft-4l", "num_speculative_tokens": 2},
        {"candidate": "ngram", "num_speculative_tokens": 4},
    ]
    resumed = make_study(tmp_path, name="moving", trials=2, batch_sizes=(1,), eager=(True,), first_trials=first)
    client = MlflowClient(resumed.tracking_uri)
    exp = client.get_experiment_by_name("moving")
    assert exp is not None

    def best_names() -> list[str]:
        runs = client.search_runs([exp.experiment_id], filter_string="tags.best = 'true'")
        return [r.info.run_name for r in runs]

    assert [n.split(" ", 1)[1] for n in best_names()] == ["no speculation eager"]
    make_study(tmp_path, name="moving", trials=3, batch_sizes=(1,), eager=(True,), first_trials=first)
    names = best_names()
    assert len(names) == 1 and names[0].split(" ", 1)[1].startswith("ngram k=4")
