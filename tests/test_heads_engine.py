"""An EAGLE-3 head in a real CPU-vLLM study: vLLM CPU 0.32 runs eagle3 (vllm/v1/worker/cpu_model_runner.py
loads the drafter and sets the target's auxiliary hidden-state layers; vllm/platforms/cpu.py registers
C++ versions of the EAGLE and rejection-sampling kernels). Its CPU rejection sampler has no synthetic mode
(vllm/utils/cpu_triton_utils.py, _rejection_greedy_sample_kernel_impl: "Synthetic acceptance not supported
with CPU sampling"), so the tiny random head is measured with standard rejection sampling and accepts
(almost) nothing: the path is what is tested here, not a speedup."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import CliResult, one_wave, run_cli, study_dict, write_study
from tests.test_heads_outputs import served_config
from tests.tiny_heads import write_head
from tuner.results import store

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def head_study(
    tmp_path_factory: pytest.TempPathFactory, demo_models: None
) -> tuple[Path, dict[str, object], CliResult]:
    tmp = tmp_path_factory.mktemp("head-study")
    head = write_head(tmp / "smol-eagle3")
    data = study_dict(
        tmp,
        name="head-study",
        candidates=[
            {"name": "none", "method": "none"},
            {"name": "smol-head", "method": "eagle3", "model": str(head), "num_speculative_tokens": 2},
        ],
        budget={"trials": 2, "trial_timeout_s": 400},
    )
    one_wave(data)
    data["workload"].update(batch_sizes=[1], repeats=1, warmup_prompts=1, max_tokens=8)
    data["pruning"] = {"enabled": False}  # a random head accepts nothing: it must still complete
    export = tmp / "best.yaml"
    result = run_cli(["optimize", "--study", str(write_study(tmp, data)), "--export", str(export)], cwd=tmp)
    return tmp, data, result


def test_a_head_trial_runs_in_a_real_cpu_engine(head_study: tuple[Path, dict[str, object], CliResult]) -> None:
    tmp, data, result = head_study
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="head-study", storage=str(data["storage"]))
    by_method = {s.method: (t, s) for t in study.get_trials() if (s := store.trial_spec(t))}
    trial, spec = by_method["eagle3"]
    assert trial.state == optuna.trial.TrialState.COMPLETE, trial.user_attrs
    assert spec.label() == "eagle3 smol-head k=2 eager"
    metrics = store.trial_metrics(trial)
    assert metrics is not None and metrics.tokens_per_s > 0
    # vLLM's own counters: the head drafted (two tokens a step), whatever it got accepted
    assert metrics.spec.drafts > 0 and metrics.spec.draft_tokens == 2 * metrics.spec.drafts
    # Which one is served is the CPU's noise (no confirmation here; the random head accepts nothing): either
    # the plain target, or the head exactly as measured; vLLM's own `vllm serve --config` reads it so.
    text = (tmp / "best.yaml").read_text()
    exported = yaml.safe_load(text)
    served = served_config(text, tmp)[1].speculative_config
    if "speculative-config" in exported:
        assert exported["speculative-config"] == {
            "method": "eagle3",
            "num_speculative_tokens": 2,
            "model": spec.draft_model,
        }
        assert "# configuration: eagle3 smol-head k=2 eager\n" in text
        assert served is not None and (served.method, served.model) == ("eagle3", spec.draft_model)
    else:
        assert served is None
    report = run_cli(["report", "--study", str(tmp / "head-study.yaml"), "--format", "md"], cwd=tmp)
    assert report.returncode == 0, report.stderr
    assert "eagle3 smol-head k=2" in report.stdout
    html = run_cli(["report", "--study", str(tmp / "head-study.yaml"), "--output", str(tmp / "report.html")], cwd=tmp)
    assert html.returncode == 0, html.stderr
    assert "eagle3 smol-head k=2 eager" in (tmp / "report.html").read_text()
