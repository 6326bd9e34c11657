"""An EAGLE-3 head as the study's answer, through the outputs: the exported file as vLLM 0.32's own
``vllm serve --config`` reads it (its parser, then its engine configuration, which loads the head's
config.json), the head named in the export, the reports and a batch-size schedule, and the schedule's k=0
note said of a head, not of a draft model.

The studies run with the stand-in engines (tests.fake_engine, tests.fake_schedule: no vLLM engine; the
real CPU engine runs a head in tests/test_heads_engine.py, where which configuration wins is the CPU's
noise). The head is a tiny random one shaped for the demo target (tests/tiny_heads.py); pre-flight checks
it for real."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

import optuna
import pytest
import yaml

from tests.conftest import ROOT, study_dict, write_study
from tests.tiny_heads import write_head
from tuner.cli import main
from tuner.outputs import schedule_plot
from tuner.outputs.export_schedule import caveat_lines
from tuner.outputs.report import build_report, render_html, render_markdown
from tuner.results import outcome
from tuner.results.schedule import Derivation, Schedule, ScheduleRange
from tuner.results.schedule_run import ScheduleRun

pytestmark = pytest.mark.usefixtures("demo_models")

HEAD_K0_NOTE = (
    "at k=0 the eagle3 head still runs its first pass each step on the target's hidden states "
    "(vLLM keeps the head's KV cache in sync); it drafts nothing"
)


def _head_study(tmp: Path, name: str, ks: list[int], engine_args: dict[str, Any]) -> tuple[dict[str, Any], Path]:
    head = write_head(tmp / "smol-eagle3")
    data = study_dict(
        tmp,
        name=name,
        candidates=[
            {"name": "none", "method": "none"},
            {"name": "smol-head", "method": "eagle3", "model": str(head), "num_speculative_tokens": [1, 4]},
        ],
        budget={"trials": 1 + len(ks), "trial_timeout_s": 60},
    )
    data["pruning"] = {"enabled": False}
    data["search"]["first_trials"] = [{"candidate": "smol-head", "num_speculative_tokens": k} for k in ks]
    data["target"]["engine_args"].update(engine_args)
    return data, head


def _optimize(tmp: Path, data: dict[str, Any]) -> str:
    path = write_study(tmp, data)
    args = ["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp / "runs")]
    assert main([*args, "--export", str(tmp / "best.yaml")]) == 0
    return (tmp / "best.yaml").read_text()


def served_config(text: str, tmp: Path) -> tuple[Any, Any]:
    """The file as ``vllm serve --config FILE`` reads it: its parser and checks, then the engine configuration
    its entry point builds (vllm/entrypoints/cli/serve.py); no server or engine is started. The stand-in
    engine's fake-* keys are not vLLM's: left out. vLLM's CPU platform sets environment variables
    (LD_PRELOAD among them) while it configures: they are put back for the tests that follow."""
    from vllm import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tuner.engine.server import serve_args

    served = {k: v for k, v in yaml.safe_load(text).items() if not k.startswith("fake-")}
    path = tmp / "served.yaml"
    path.write_text(yaml.safe_dump(served, sort_keys=False))
    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(serve_args(path, 8000))
    command.validate(args)
    with mock.patch.dict(os.environ):
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return args, config


def test_an_exported_head_is_read_back_by_vllms_serve_parser(tmp_path: Path, fake_engine: str) -> None:
    data, head = _head_study(tmp_path, "head-export", [3], {"fake_spec_gain": 1.5})
    data["workload"]["batch_sizes"] = [1]
    text = _optimize(tmp_path, data)
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    out = outcome.read(study)
    assert out.paid and out.exported is not None and out.exported.trial == 1
    assert "# configuration: eagle3 smol-head k=3 eager\n" in text

    args, config = served_config(text, tmp_path)
    assert args.speculative_config == {"method": "eagle3", "num_speculative_tokens": 3, "model": str(head)}
    spec = config.speculative_config
    assert spec is not None
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("eagle3", str(head), 3)
    # vLLM read the head's own config.json: the EAGLE-3 architecture, not a plain draft model's
    assert spec.draft_model_config is not None and spec.draft_model_config.model == str(head)
    assert spec.draft_model_config.hf_config.architectures == ["LlamaForCausalLMEagle3"]

    report = build_report(study)
    md = render_markdown(report)
    assert "**Use eagle3 smol-head k=3 eager (trial 1): 1.50× the throughput of no speculation" in md
    assert "| smol-head | eagle3 | 1 (1 / 0 / 0) | eagle3 smol-head k=3 eager (trial 1) |" in md
    html = render_html(report)
    assert "Use eagle3 smol-head k=3 eager (trial 1)" in html and "# configuration: eagle3 smol-head k=3 eager" in html


def test_a_heads_schedule_names_the_head_and_says_what_runs_at_k0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k=3 pays at batch 1, nothing does at batch 4: the schedule 1: k=3; 2-: k=0 is validated and served."""
    monkeypatch.setenv("SPECDEC_TUNER_ENGINE_MODULE", "tests.fake_schedule")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    gains = {"3@1": 1.4, "1@1": 1.2, "3@4": 0.85, "1@4": 0.95, "0@4": 1.0}
    data, head = _head_study(tmp_path, "head-sched", [3, 1], {"fake_gain": gains, "fake_engine_factors": [1.0]})
    data["workload"]["batch_sizes"] = [1, 4]
    data["schedule"] = {"enabled": True}
    data["confirm"] = {"enabled": True, "rounds": 2, "repeats": 1}
    text = _optimize(tmp_path, data)
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    run = outcome.read(study).schedule
    assert run is not None and run.exported and run.schedule is not None
    assert run.schedule.vllm_value() == [[1, 1, 3], [2, 1024, 0]]

    header = "# configuration: eagle3 smol-head eager, num_speculative_tokens by batch size: 1: k=3; 2-1024: k=0"
    assert header in text
    assert f"# note: {HEAD_K0_NOTE}\n" in text and "draft model" not in text
    _, config = served_config(text, tmp_path)
    spec = config.speculative_config
    assert (spec.method, spec.model) == ("eagle3", str(head))
    assert [list(r) for r in spec.num_speculative_tokens_per_batch_size] == [[1, 1, 3], [2, 1024, 0]]

    report = build_report(study)
    assert report.schedule is not None and report.schedule.caveats == [HEAD_K0_NOTE]
    assert report.schedule.outcome.startswith("batch-size schedule of eagle3 smol-head eager (1: k=3; 2-1024: k=0")
    md = render_markdown(report)
    assert f"- note: {HEAD_K0_NOTE}" in md and "draft model" not in md
    html = render_html(report)
    assert f'<p class="note">note: {HEAD_K0_NOTE.replace(chr(39), "&#x27;")}</p>' in html
    # the plot: the head's panel first with the schedule drawn over it, also for a schedule stored before
    # heads were named with their method ("smol-head eager")
    older = run.model_copy(deep=True)
    assert older.derivation.schedule is not None
    older.derivation.schedule.drafter = "smol-head eager"
    for stored in (run, older):
        ax = schedule_plot.speedup_vs_level(report.rows, stored, report.mode).axes[0]
        assert ax.get_title() == "eagle3 smol-head eager"
        assert "schedule: chosen k (trials)" in {line.get_label() for line in ax.get_lines()}


def _run_with(method: str, model: str | None, ks: list[int]) -> ScheduleRun:
    ranges = [ScheduleRange(start=1 + 3 * i, end=3 + 3 * i, k=k) for i, k in enumerate(ks)]
    schedule = Schedule(drafter="d eager", trial=1, levels=[], ranges=ranges, cap=ranges[-1].end)
    spec: dict[str, Any] = {"method": method, "num_speculative_tokens": max(ks)}
    if model is not None:
        spec["model"] = model
    return ScheduleRun(
        basis=[0, 1],
        derivation=Derivation(drafter="d eager", schedule=schedule),
        llm_kwargs={"enforce_eager": True, "speculative_config": spec},
    )


@pytest.mark.parametrize(
    ("method", "model", "ks", "note"),
    [
        ("eagle3", "/heads/h", [3, 0], HEAD_K0_NOTE),
        ("eagle", "/heads/h", [2, 0], HEAD_K0_NOTE.replace("eagle3", "eagle")),
        (
            "draft_model",
            "/drafts/d",
            [3, 0],
            "at k=0 a draft model still runs its first pass each step (vLLM keeps its KV cache)",
        ),
        ("ngram", None, [3, 0], None),  # nothing runs at k=0: n-gram lookup has no model
        ("eagle3", "/heads/h", [3, 1], None),  # no level runs k=0
    ],
)
def test_the_k0_note_names_what_still_runs(method: str, model: str | None, ks: list[int], note: str | None) -> None:
    assert caveat_lines(_run_with(method, model, ks)) == ([f"# note: {note}"] if note else [])


@pytest.mark.parametrize(
    ("engine", "note"),
    [
        # vLLM 0.32's V2 runner keeps full graphs under a schedule (the H100 study's schedule engine, 2026-12-07)
        ({"model_runner": "V2", "cudagraph_mode": "FULL_AND_PIECEWISE"}, None),
        (
            {"model_runner": "V1", "cudagraph_mode": "PIECEWISE"},
            "with the schedule vLLM's V1 model runner captured the target's CUDA graphs PIECEWISE, not FULL "
            "(validation engine)",
        ),
        ({}, "with a schedule vLLM's V1 model runner captures the target's CUDA graphs PIECEWISE, not FULL"),
    ],
)
def test_the_graph_note_says_what_the_schedules_engine_ran(engine: dict[str, str], note: str | None) -> None:
    run = _run_with("eagle3", "/heads/h", [3, 1])
    run.llm_kwargs = {**(run.llm_kwargs or {}), "enforce_eager": False}
    run.engine = engine
    assert caveat_lines(run) == ([f"# note: {note}"] if note else [])
