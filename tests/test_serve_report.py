"""The report of a serve-mode study (``workload.mode: serve``), end to end with the stand-in engine.

The fake engine's served latency model (tests/fake_engine.py): TPOT follows the per-stream throughput,
TTFT grows with concurrency and with the request rate, and speculation that raises throughput lowers
TPOT and raises the rate the server saturates at. With the SLO below (p90 TTFT ≤ 100 ms, p90 TPOT ≤ 30 ms)
the baseline keeps it up to 5 requests/s and ngram k=4 (1.48× the throughput) up to 8 requests/s.
"""

from __future__ import annotations

import base64
import re
from html import unescape
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mlflow.tracking import MlflowClient

from tests import fake_engine
from tests.test_report import FakeStudy, make_study
from tuner.cli import main
from tuner.engine.request import EngineResult, ProgressEvent, TrialRequest
from tuner.outputs import latency_plots, plots
from tuner.outputs.report import build_report, render_html, render_markdown
from tuner.outputs.report.model import SloSummary, SloTrialRow, StudyReport, TrialRow
from tuner.outputs.report.tables import slo_table
from tuner.results import store
from tuner.study.config import ServeConfig
from tuner.study.prompts import Prompt

SERVE = {
    "objective": "goodput",
    "slo": {"percentile": 90, "ttft_ms": 100, "tpot_ms": 30},
    "rate_search": {"start_rps": 1, "max_rps": 16, "bisect_steps": 2},
}


def _served_study(tmp: Path, name: str, first_trials: list[dict[str, Any]], workload: dict[str, Any]) -> FakeStudy:
    with pytest.MonkeyPatch.context() as mp:
        # The pre-flight (a vLLM subprocess and tokenizer loads, ~20 s) has its own tests (test_methods,
        # test_pair_check); here every candidate passes it.
        mp.setattr("tuner.engine.preflight.check_with_vllm", lambda config, names: {})
        mp.setattr("tuner.engine.preflight.check_draft_pair", lambda target, draft, *rest: None)
        return make_study(
            tmp, name=name, trials=len(first_trials) + 1, eager=(True,), first_trials=first_trials, workload=workload
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> FakeStudy:
    """Baseline, ngram k=4 (chosen), ngram k=2, draft-4l k=2 (pruned: its drafts are almost never accepted)."""
    first = [
        {"candidate": "ngram", "num_speculative_tokens": 4},
        {"candidate": "ngram", "num_speculative_tokens": 2},
        {"candidate": "draft-4l", "num_speculative_tokens": 2},
    ]
    workload = {"mode": "serve", "top_p": 0.95, "serve": SERVE}
    return _served_study(tmp_path_factory.mktemp("serve-report"), "serve-report", first, workload)


def test_fake_engine_serves_windows_and_searches_the_slo_rate(tmp_path: Path) -> None:
    prompts = [Prompt(id=f"p{i}", messages=[{"role": "user", "content": "hi"}]) for i in range(4)]
    results = {}
    for name, spec in (("base", None), ("ngram", {"method": "ngram", "num_speculative_tokens": 4})):
        out = tmp_path / name
        out.mkdir()
        kwargs: dict[str, Any] = {"model": "m", "fake_repeat_s": 0.0, **({"speculative_config": spec} if spec else {})}
        request = TrialRequest(
            llm_kwargs=kwargs,
            prompts=prompts,
            max_tokens=24,
            temperature=0.0,
            batch_sizes=[1, 4],
            repeats=2,
            warmup_prompts=0,
            mode="serve",
            serve=ServeConfig.model_validate(SERVE),
        )
        (out / "request.json").write_text(request.model_dump_json())
        assert fake_engine.main([str(out / "request.json"), str(out)]) == 0
        result = EngineResult.model_validate_json((out / "result.json").read_text())
        events = [ProgressEvent.model_validate_json(line) for line in (out / "progress.jsonl").read_text().splitlines()]
        assert result.mode == "serve" and result.slo is not None and not result.token_ids
        assert [e.probe for e in events if e.event == "slo_probe"] == result.slo.probes
        for m in result.repeats:
            w = m.served
            assert w is not None and w.max_concurrency == m.batch_size and w.completed == max(4, 2 * m.batch_size)
            for metric in ("ttft", "tpot", "itl", "e2el"):
                values = [w.latency_ms[f"{metric}_{s}"] for s in ("p50", "p90", "p99")]
                assert values == sorted(values) and f"{metric}_mean" in w.latency_ms
            assert w.request_throughput == pytest.approx(w.completed / w.duration_s)
        results[name] = result
    base, ngram = results["base"], results["ngram"]
    assert base.slo is not None and ngram.slo is not None
    assert (base.slo.max_rate_rps, ngram.slo.max_rate_rps) == (5.0, 8.0)
    assert [p.rate_rps for p in base.slo.probes] == [1, 2, 4, 8, 6, 5]
    tpot = {name: r.repeats[0].served.latency("tpot", 90) for name, r in results.items() if r.repeats[0].served}
    assert tpot["ngram"] < tpot["base"]  # speculation with a gain lowers TPOT


def test_fake_rate_search_stops_at_its_time_limit() -> None:
    prompts = [Prompt(id="p0", messages=[{"role": "user", "content": "hi"}])]
    serve = ServeConfig.model_validate({**SERVE, "rate_search": {"start_rps": 1, "time_limit_s": 0.5}})
    request = TrialRequest(
        llm_kwargs={}, prompts=prompts, max_tokens=8, temperature=0.0, batch_sizes=[1], repeats=1,
        warmup_prompts=0, mode="serve", serve=serve,
    )  # fmt: skip
    probes: list[Any] = []
    search = fake_engine.slo_search(request, 1.0, fake_engine.SpecStats(), {"fake_probe_s": 0.3}, probes.append)
    assert search.truncated and search.probes == probes and [p.rate_rps for p in probes] == [1, 2]
    assert search.max_rate_rps == 2.0  # the best rate that held before the limit


def test_serve_report_html(served: FakeStudy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--study", str(served.path), "--output", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    plain = unescape(re.sub(r"<[^>]+>", " ", text))

    verdict = re.search(r'<p class="verdict" id="verdict">(.*?)</p>', text, re.S)
    assert verdict is not None
    assert unescape(verdict.group(1)).startswith(
        "Use ngram k=4 lookup 2-3 eager (trial 1): it keeps the SLO (p90 TTFT ≤ 100 ms and p90 TPOT ≤ 30 ms) "
        "up to 8 requests/s, 1.60× the 5 requests/s of no speculation"
    )
    measured = re.search(r'<ul id="measurement">(.*?)</ul>', text, re.S)
    assert measured is not None
    assert "<code>vllm bench serve</code>" in measured.group(1)
    how = unescape(re.sub(r"<[^>]+>", "", measured.group(1)))
    assert "Served load: each trial starts a real vllm serve" in how and "loads it with vllm bench serve" in how
    assert "levels are max concurrency 1, 4" in how
    assert "Sampling: temperature 0 (greedy), top_p 0.95, max_tokens 24 output tokens per request." in how
    assert "objective goodput" in how and "doubling up to 16" in how

    assert "Speedup per concurrency level" in plain and "Latency per concurrency level" in plain
    levels = re.search(r'<div id="served-levels">(.*?)</div>', text, re.S)
    assert levels is not None
    rows = re.findall(r"<tr>(.*?)</tr>", levels.group(1), re.S)
    cells = [[unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)] for row in rows]
    assert cells[0][:3] == ["level", "configuration", "TTFT p50 / p90 / p99 (ms)"]
    assert cells[0][-5:] == ["requests/s", "output tokens/s", "acceptance", "mean acc. length", "SLO held"]
    by_level = {(c[0], c[1].split(":")[0]): c for c in cells[1:]}
    assert set(by_level) == {(f"concurrency {n}", role) for n in (1, 4) for role in ("chosen", "baseline")}
    chosen_1, base_1 = by_level[("concurrency 1", "chosen")], by_level[("concurrency 1", "baseline")]
    # TPOT p50 / p90 / p99 without speculation: 100 tokens/s per stream (±1% between repeats)
    assert [float(x) for x in base_1[3].split(" / ")] == pytest.approx([10.0, 12.5, 15.0], rel=0.02)
    assert chosen_1[-3:] == ["60%", "3.40", "yes"] and base_1[-3:] == ["–", "–", "yes"]
    assert by_level[("concurrency 4", "baseline")][-1] == "yes"  # p90 TTFT 46.9 ms, TPOT 25 ms
    slo = re.search(r'<div id="slo">(.*?)</div>', text, re.S)
    assert slo is not None
    slo_text = unescape(slo.group(1))
    assert "highest rate keeping the SLO" in slo_text and "8 requests/s" in slo_text and "1.60×" in slo_text
    assert "1 ✓, 2 ✓, 4 ✓, 8 ✗, 6 ✗, 5 ✓" in slo_text
    assert "Limits: p90 TTFT ≤ 100 ms and p90 TPOT ≤ 30 ms. Objective: goodput." in plain
    assert "tokens/s concurrency 4" in plain and "tokens/s bs" not in plain
    # the report's own text names levels by concurrency (best_config's header comes from tuner.outputs.export)
    own = unescape(re.sub(r"<[^>]+>", " ", re.sub(r'<pre id="best-config">.*?</pre>', "", text, flags=re.S)))
    assert not re.search(r"batch \d|batch size", own), re.findall(r".{60}batch.{60}", own)

    match = re.search(r'<figure id="plot-latency"><img alt="latency" src="data:image/png;base64,([^"]+)"', text)
    assert match is not None
    assert base64.b64decode(match.group(1)).startswith(b"\x89PNG")
    assert text.count("data:image/png;base64,") == 6


def test_serve_report_markdown(served: FakeStudy, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--study", str(served.path), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert "**How it was measured**" in md and "- Served load: each trial starts a real `vllm serve`" in md
    assert "top_p 0.95, max_tokens 24" in md
    assert "| concurrency | ngram k=4" in md  # the speedup table names its levels by concurrency
    assert "**Latency per concurrency level**" in md
    assert re.search(r"\| concurrency 1 \| chosen: ngram k=4 .*\| yes \|", md)
    assert "**SLO: highest request rate** (p90 TTFT ≤ 100 ms and p90 TPOT ≤ 30 ms; objective goodput" in md
    assert "| 1 | ngram k=4 lookup 2-3 eager | 8 requests/s | 1.60× |" in md
    assert "`latency_vs_load.png`" in md and "base64" not in md


def test_serve_report_model_and_mlflow(served: FakeStudy) -> None:
    study = served.load()
    report = build_report(study)
    assert report.mode == "serve" and report.slo is not None
    assert [(role, row.number) for role, row in report.finalists] == [("chosen", 1), ("baseline", 0)]
    rates = {t.row.number: (t.max_rate_rps, t.truncated) for t in report.slo.trials}
    assert rates[0] == (5.0, False) and rates[1] == (8.0, False)
    assert any(
        "), ngram k=4 lookup 2-3 eager kept up to 8 requests/s against 5 requests/s without speculation (1.60×)" in s
        for s in report.why
    )
    fig = latency_plots.latency_vs_load(report.finalists, report.slo)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [
        "p90 TTFT against concurrency",
        "p90 TPOT against concurrency",
        "p90 TTFT against request rate",
        "p90 TPOT against request rate",
    ]
    limits = [line.get_label() for ax in fig.axes for line in ax.get_lines() if line.get_label().startswith("SLO")]
    assert limits == ["SLO: p90 TTFT ≤ 100 ms", "SLO: p90 TPOT ≤ 30 ms"] * 2
    assert [ax.get_title() for ax in plots.throughput_vs_k(report.rows).axes] == ["concurrency 1", "concurrency 4"]

    client = MlflowClient(served.tracking_uri)
    parent = study.user_attrs[store.PARENT_RUN]
    assert latency_plots.LATENCY_ARTIFACT in {a.path for a in client.list_artifacts(parent)}
    png = Path(client.download_artifacts(parent, latency_plots.LATENCY_ARTIFACT)).read_bytes()
    assert png.startswith(b"\x89PNG")


def test_truncated_rate_search_is_said(served: FakeStudy) -> None:
    report = build_report(served.load())
    assert report.slo is not None
    row = report.slo.trials[0].row
    cut = SloSummary(
        90, 100.0, None, "goodput", 5.0, [SloTrialRow(row, 2.0, 0.4, [(1.0, True), (2.0, True)], True, 30.0)]
    )
    _, body = slo_table(cast(StudyReport, SimpleNamespace(slo=cut)))
    assert body == [["0", row.label, "2 requests/s", "0.40×", "1 ✓, 2 ✓", "30.0 s", "yes (rate_search.time_limit_s)"]]
    assert cut.limits() == "p90 TTFT ≤ 100 ms"
    assert isinstance(row, TrialRow)
    report.slo = cut
    assert "yes (rate_search.time_limit_s)" in render_markdown(report)
    assert "yes (rate_search.time_limit_s)" in unescape(render_html(report))


@pytest.fixture(scope="module")
def served_without_slo(tmp_path_factory: pytest.TempPathFactory) -> FakeStudy:
    """A served study with no SLO: throughput per concurrency level decides, no rate search runs."""
    first = [{"candidate": "ngram", "num_speculative_tokens": 4}]
    workload = {"mode": "serve", "serve": {"objective": "throughput"}}
    return _served_study(tmp_path_factory.mktemp("serve-no-slo"), "serve-no-slo", first, workload)


def test_serve_report_without_an_slo(served_without_slo: FakeStudy) -> None:
    """Serve mode with no SLO: the latency table says '–' for it, no SLO section, a one-row latency plot."""
    report = build_report(served_without_slo.load())
    assert report.mode == "serve" and report.slo is None and report.served
    assert all(row.metrics is not None and row.metrics.slo is None for _, row in report.finalists)
    assert {s.slo_held for s in report.served} == {None}
    md, html = render_markdown(report), unescape(render_html(report))
    assert "**Latency per concurrency level**" in md and "SLO: highest request rate" not in md
    assert re.search(r"\| concurrency 4 \| baseline: .*\| – \|$", md, re.M)
    assert 'id="slo"' not in html and 'id="plot-latency"' in html
    fig = latency_plots.latency_vs_load(report.finalists, None)
    assert [ax.get_title() for ax in fig.axes] == ["p90 TTFT against concurrency", "p90 TPOT against concurrency"]
    assert not [line for ax in fig.axes for line in ax.get_lines() if line.get_label().startswith("SLO")]
