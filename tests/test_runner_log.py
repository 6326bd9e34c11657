"""The model runner and CUDA-graph mode an engine ran with, read from its log: real lines of vLLM 0.26 and 0.32
(H200 and CPU), every engine log of the 0.32 H200 study against the grep in its runners.txt, and the recording
of both per trial (MLflow tags, trial record, report column) in a fake-engine study."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import study_dict, write_study
from tuner.cli import main
from tuner.engine.offline import engine_runner
from tuner.engine.runner_log import parse_runner, parse_runner_log, runner_from_config, workdir_runner
from tuner.outputs.report import build_report, render_markdown, trial_table
from tuner.results import store

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
V032_H200 = RESULTS / "wide-h200-v032-20261204"

# Copied from benchmarks/results/wide-h200-v032-20261204/runs/wide-h200/trial-001/engine.log (vLLM 0.32.0, H200,
# compiled; the config line cut around its cudagraph_mode)
H200_032_COMPILED = """\
(EngineCore pid=2352) INFO 12-04 03:06:54 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/root ... 'benchmark_combo_kernel': True}, 'inductor_passes': {}, 'cudagraph_mode': \
<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_num_of_warmups': 1
(EngineCore pid=2352) INFO 12-04 03:06:57 [gpu_worker.py:518] Using V2 Model Runner
(EngineCore pid=2352) INFO 12-04 03:07:39 [model_runner.py:1127] Graph capturing finished in 5 secs, took 0.60 GiB
"""
# trial-002/engine.log (n-gram k=5, eager): the eager warning names cudagraph_mode=none before the config line
H200_032_EAGER = """\
(MainProcess pid=2684) WARNING 12-04 03:10:12 [vllm.py:1703] Enforce eager set, disabling torch.compile, \
CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and \
--kernel_config.enable_jit_warmup=False
(EngineCore pid=2779) INFO 12-04 03:10:13 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/root/wide-v032/cache/models/SmolLM2-135M-Instruct-wide', \
speculative_config=SpeculativeConfig(method='ngram', model=None, num_spec_tokens=5), ... \
'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 1
(EngineCore pid=2779) INFO 12-04 03:10:15 [gpu_worker.py:518] Using V2 Model Runner
"""
# benchmarks/results/wide-h200-20261201/study/runs/wide-h200/trial-020/engine.log (vLLM 0.26.0, H200, a draft)
H200_026_DRAFT = """\
WARNING 12-02 19:08:15 [vllm.py:584] Model Runner V2 does not yet support speculative method 'draft_model'; \
using the V1 model runner instead.
(EngineCore pid=1185) INFO 12-02 19:08:16 [core.py:116] Initializing a V1 LLM engine ... '_kernel': True}, \
'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_num_of_warmups': 1
"""
# benchmarks/results/wide-h200-20261201/study/runs/wide-h200/confirm-r1-trial-001/engine.log (0.26.0, H200, no
# speculation, compiled)
H200_026_BASELINE = """\
(EngineCore pid=2193) INFO 12-02 19:14:15 [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: mo... \
mark_combo_kernel': True}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, \
'cudagraph_num_of_warmups': 1
(EngineCore pid=2193) INFO 12-02 19:14:16 [gpu_worker.py:378] Using V2 Model Runner
"""
# A real CPU engine of the tests' study (vLLM CPU 0.32.0, n-gram k=2, enforce_eager false; 2026-12-04): no
# Triton, so the V1 runner, and no CUDA graphs on a CPU
CPU_032 = """\
(MainProcess pid=27594) WARNING 12-04 03:35:58 [vllm.py:725] Model Runner V2 requires Triton; using the V1 \
model runner instead.
(EngineCore pid=27615) INFO 12-04 03:36:09 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: \
model='/root/.cache/specdec-tuner/models/SmolLM2-135M-Instruct', speculative_config=SpeculativeConfig(\
method='ngram', model=None, num_spec_tokens=2), ... 'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, ... \
'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0
(VllmWorker-0 pid=27648) WARNING 12-04 03:36:20 [vllm.py:725] Model Runner V2 requires Triton; using the V1 \
model runner instead.
"""
# vLLM's later resolutions of the mode, from the format strings in vllm/config/vllm.py (0.26.0 and 0.32.0:
# a num_speculative_tokens_per_batch_size engine on the V1 runner) and vllm/config/compilation.py (0.32.0)
SCHEDULE_OVERRIDE = (
    H200_026_DRAFT
    + "WARNING 12-02 19:08:16 [vllm.py:1049] Dynamic speculative decoding changes the target verification length "
    "at runtime. Overriding cudagraph_mode from FULL_AND_PIECEWISE to PIECEWISE for reliability. Use "
    "VLLM_USE_V2_MODEL_RUNNER=1 if you want to use full CUDA graphs.\n"
)
BACKEND_OVERRIDE = (
    H200_032_COMPILED + "WARNING 12-04 03:07:00 [compilation.py:1450] CUDAGraphMode.FULL_AND_PIECEWISE is not "
    "supported with spec-decode for attention backend FLEX_ATTENTION (support: AttentionCGSupport.NEVER); "
    "setting cudagraph_mode=PIECEWISE\n"
)
CAPTURE_OVERRIDE = (
    H200_032_COMPILED + "WARNING 12-04 03:07:00 [compilation.py:1466] Cudagraph mode CUDAGraphMode.FULL_AND_PIECEWISE "
    "requires piecewise capture, but the loaded model provides neither a compiled submodule nor breakable CUDA "
    "graphs. Overriding to CUDAGraphMode.FULL.\n"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (H200_032_COMPILED, {"model_runner": "V2", "cudagraph_mode": "FULL_AND_PIECEWISE"}),
        (H200_032_EAGER, {"model_runner": "V2", "cudagraph_mode": "NONE"}),
        (H200_026_DRAFT, {"model_runner": "V1", "cudagraph_mode": "FULL_AND_PIECEWISE"}),
        (H200_026_BASELINE, {"model_runner": "V2", "cudagraph_mode": "FULL_AND_PIECEWISE"}),
        (CPU_032, {"model_runner": "V1", "cudagraph_mode": "NONE"}),
        (SCHEDULE_OVERRIDE, {"model_runner": "V1", "cudagraph_mode": "PIECEWISE"}),
        (BACKEND_OVERRIDE, {"model_runner": "V2", "cudagraph_mode": "PIECEWISE"}),
        (CAPTURE_OVERRIDE, {"model_runner": "V2", "cudagraph_mode": "FULL"}),
        # an engine that died before its config line; a log at WARNING without the V2 line
        ("fake engine starting\nTraceback (most recent call last):\n", {}),
        (H200_032_EAGER.replace("Using V2 Model Runner", "Graph capturing skipped"), {"cudagraph_mode": "NONE"}),
    ],
)
def test_runner_and_graph_mode_read_from_real_log_lines(text: str, expected: dict[str, str]) -> None:
    assert parse_runner(text) == expected


def _grepped(runners_txt: Path) -> dict[str, dict[str, str]]:
    """runners.txt (a grep of the same logs, made on the device): trial -> what it says."""
    out: dict[str, dict[str, str]] = {}
    for line in runners_txt.read_text().splitlines():
        if not line.startswith("trial-"):
            continue
        trial, runner, mode = (cell.strip() for cell in line.split("|")[:3])
        said: dict[str, str] = {}
        if "Using V2 Model Runner" in runner:
            said["model_runner"] = "V2"
        if found := re.fullmatch(r"cudagraph_mode: ([A-Z_]+);", mode):
            said["cudagraph_mode"] = found.group(1)
        out[trial] = said
    return out


def test_every_engine_log_of_the_032_h200_study_reads_as_its_grep() -> None:
    runs = V032_H200 / "runs" / "wide-h200"
    expected = _grepped(V032_H200 / "runners.txt")
    assert len(expected) == 14 and sum(1 for e in expected.values() if e.get("model_runner") == "V2") == 13
    assert {t: workdir_runner(runs / t) for t in expected} == expected


def test_every_026_engine_that_speculated_ran_on_v1() -> None:
    logs = [
        *(RESULTS / "wide-h200-20261201").rglob("engine.log"),
        *(RESULTS / "wide-h200-serve-20261202").rglob("server.log"),
    ]
    fallbacks = [p for p in logs if "using the V1 model runner instead" in p.read_text(errors="replace")]
    assert fallbacks, logs
    assert {parse_runner_log(p).get("model_runner") for p in fallbacks} == {"V1"}


class _Mode(enum.Enum):  # vLLM's CUDAGraphMode, as far as its name goes
    FULL_AND_PIECEWISE = (2, 1)


def test_runner_from_the_engine_config_and_the_log_before_it(tmp_path: Path) -> None:
    config = SimpleNamespace(use_v2_model_runner=True, compilation_config=SimpleNamespace(cudagraph_mode=_Mode((2, 1))))
    assert runner_from_config(config) == {"model_runner": "V2", "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert runner_from_config(SimpleNamespace()) == {} == runner_from_config(None)

    llm, log = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config)), tmp_path / "engine.log"
    assert engine_runner(llm, log) == {"model_runner": "V2", "cudagraph_mode": "FULL_AND_PIECEWISE"}  # no log yet
    assert engine_runner(llm, None) == engine_runner(llm, log)
    log.write_text(SCHEDULE_OVERRIDE)
    assert engine_runner(llm, log) == {"model_runner": "V1", "cudagraph_mode": "PIECEWISE"}  # the log says what ran
    log.write_text(H200_032_EAGER.replace("Using V2 Model Runner", ""))
    assert engine_runner(llm, log) == {"model_runner": "V2", "cudagraph_mode": "NONE"}


def test_the_runner_is_a_tag_a_record_entry_and_a_report_column(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 4, "trial_timeout_s": 60})
    data["search"]["enforce_eager"] = [True, False]
    data["target"]["engine_args"]["fake_crash_k"] = 3
    data["candidates"] = [{"name": "none", "method": "none"}, {"name": "ngram", "method": "ngram"}]
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 2, "enforce_eager": False},
        {"candidate": "ngram", "num_speculative_tokens": 3, "enforce_eager": False},
    ]
    path = write_study(tmp_path, data)
    assert main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs")]) == 0
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    client = MlflowClient(data["tracking"]["uri"])
    seen = {}
    for t in study.get_trials(states=[optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]):
        rec = store.trial_record(t)
        assert rec.spec is not None and rec.mlflow_run_id is not None
        expected = {"model_runner": "V2", "cudagraph_mode": "NONE" if rec.spec.enforce_eager else "FULL_AND_PIECEWISE"}
        tags = client.get_run(rec.mlflow_run_id).data.tags
        assert {k: tags.get(k) for k in expected} == expected, (t.number, tags)
        assert {k: (rec.engine or {}).get(k) for k in expected} == expected, (t.number, rec.engine)
        seen[t.number] = (t.state, expected["cudagraph_mode"])
    assert optuna.trial.TrialState.FAIL in {s for s, _ in seen.values()}  # the failed engine's log says it too

    report = build_report(study)
    header, body = trial_table(report.rows)
    column = header.index("runner")
    assert {int(row[0]): row[column] for row in body} == {n: f"V2 {mode}" for n, (_, mode) in seen.items()}
    assert "| runner |" in render_markdown(report)
