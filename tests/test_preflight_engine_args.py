"""Pre-flight checks the target's engine arguments the way a trial's engine takes them, with the installed
vLLM (no engine): a typo in ``target.engine_args`` is a one-line error before any engine starts, not one
failed trial after another."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli, study_dict, write_study
from tuner.engine.vllm_checks import LLM_KWARGS, SERVE_FILE, validate

GOOD_FILE = "model: /m\ndtype: float32\nno-enforce-eager: true\nmax-model-len: 512\nkv-cache-memory-bytes: 536870912\n"


def test_vllm_judges_engine_arguments_as_each_engine_takes_them() -> None:
    errors = validate(
        [
            {LLM_KWARGS: ["model", "dtype", "enforce_eager", "gpu_memory_utilization", "seed", "chat_template"]},
            {LLM_KWARGS: ["model", "gpu_memory_utilisation"]},
            {SERVE_FILE: GOOD_FILE},
            {SERVE_FILE: GOOD_FILE + "gpu-memory-utilisation: 0.3\n"},
            {SERVE_FILE: GOOD_FILE + "max-num-seqs: lots\n"},
        ]
    )
    assert errors[0] is None and errors[2] is None, errors
    assert errors[1] == "vLLM has no engine argument gpu_memory_utilisation"
    assert errors[3] is not None and "unrecognized arguments: --gpu-memory-utilisation" in errors[3]
    assert errors[4] is not None and "--max-num-seqs" in errors[4] and "lots" in errors[4]


def test_a_misspelt_engine_argument_stops_the_study_before_any_engine(tmp_path: Path, demo_models: None) -> None:
    data = study_dict(tmp_path, name="typo", budget={"trials": 1, "trial_timeout_s": 120})
    data["workload"]["mode"] = "serve"
    data["target"]["engine_args"]["gpu_memory_utilisation"] = 0.5  # vLLM spells it utilization
    result = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "target.engine_args" in line]
    assert len(lines) == 1 and "--gpu-memory-utilisation" in lines[0] and "fix:" in lines[0], result.stderr[-2000:]
    assert not list((tmp_path / "tuner-runs").glob("*/trial-*"))
