"""The demo head's plumbing without training: the missing training environment, and the exported head's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuner.errors import UserError
from tuner.models.eagle3 import TRAIN_PYTHON_ENV, export_head, train_python


def test_missing_training_environment_is_one_line_naming_the_fix(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRAIN_PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(UserError) as err:
        train_python()
    msg = str(err.value)
    assert "\n" not in msg and "--eagle3" in msg and "requirements/eagle3-train.txt" in msg


def test_exported_head_leaves_the_embeddings_to_the_target(tmp_path: Path) -> None:
    """vLLM shares the target's embed_tokens with a head that has none (the widened target's are padded)."""
    from safetensors.torch import load_file, save_file

    ckpt, dst = tmp_path / "0", tmp_path / "head"
    ckpt.mkdir()
    weights = {"embed_tokens.weight": torch.ones(10, 4), "fc.weight": torch.ones(4, 12), "d2t": torch.zeros(5).long()}
    save_file(weights, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    (ckpt / "optimizer_state_dict.pt").write_text("x")
    export_head(ckpt, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(load_file(str(dst / "model.safetensors"))) == ["d2t", "fc.weight"]


def test_cpu_recipe_and_train_flags_are_the_cached_heads() -> None:
    """--device cpu (the default) keeps the recipe and speculators flags the cached head was trained with."""
    from tuner.models.eagle3 import HeadRecipe, recipe_for, train_args

    assert recipe_for("cpu") == HeadRecipe()
    args = train_args(Path("/t"), Path("/d"), Path("/c"), recipe_for("cpu"))
    assert args[9:] == [
        "--draft-attn-impl=sdpa",
        "--loss-implementation=eager",
        "--optimizer=adamw",
        "--hidden-states-dtype=float32",
        "--num-workers=0",
        "--full-attention-indices",
        "0",
        "--train-data-ratio=0.95",
    ]


def test_gpu_recipe_trains_on_all_its_sequences_in_bfloat16_with_a_step_cap(tmp_path: Path) -> None:
    from tuner.models.eagle3 import GPU_RECIPE, extract_args, recipe_for, train_args, work_dir

    recipe = recipe_for("cuda")
    assert recipe is GPU_RECIPE and recipe.device == "cuda" and recipe.dtype == "bfloat16"
    assert recipe.sequences == recipe.prompts > 600 and recipe.max_steps
    args = train_args(Path("/t"), Path("/d"), Path("/c"), recipe)
    assert "--draft-attn-impl=sdpa" not in args and "--loss-implementation=eager" not in args
    assert "--hidden-states-dtype=bfloat16" in args and f"--max-steps={recipe.max_steps}" in args
    assert f"--total-seq-len={recipe.total_seq_len}" in args and "--num-workers=0" not in args
    assert extract_args(Path("/t"), tmp_path, recipe)[-3:] == ["32", "cuda", "bfloat16"]
    assert work_dir(tmp_path, recipe) != work_dir(tmp_path, recipe_for("cpu")) == tmp_path / "eagle3-work"
    with pytest.raises(ValueError):
        recipe_for("tpu")


def test_prepare_demo_takes_the_device(monkeypatch) -> None:
    from tuner.cli import build_parser

    args = build_parser().parse_args(["models", "prepare-demo", "--eagle3", "--device", "cuda"])
    assert args.device == "cuda" and args.eagle3
    assert build_parser().parse_args(["models", "prepare-demo"]).device is None


def test_training_steps_keep_the_callers_pythonpath() -> None:
    """On the GPU hosts torch, vLLM and speculators live in a PYTHONPATH folder (/tmp/site): the training
    steps must see it behind the tuner's root, not instead of it."""
    from tuner.models.eagle3 import train_env

    root = str(Path(__file__).resolve().parents[1])
    assert train_env({"PYTHONPATH": "/tmp/site"})["PYTHONPATH"].split(":") == [root, "/tmp/site"]
    assert train_env({})["PYTHONPATH"] == root
    assert train_env({"PYTHONPATH": "/tmp/site"})["OMP_NUM_THREADS"] == "1"


def test_a_cached_head_is_kept_only_for_its_own_recipe(monkeypatch, tmp_path: Path) -> None:
    """`prepare-demo --eagle3 --device cuda` after a CPU build must train the GPU recipe's head (and widen that
    one), not hand back the CPU head; without --device, or with the same device, the cached head is kept."""
    import tuner.models.eagle3 as eagle3
    import tuner.models.eagle3_wide as eagle3_wide
    from tuner.models import demo

    monkeypatch.setenv("SPECDEC_TUNER_CACHE", str(tmp_path))
    for name in [demo.TARGET_NAME, *(demo.draft_name(n) for n in demo.DRAFT_LAYERS)]:
        demo.demo_path(name).mkdir(parents=True)
        (demo.demo_path(name) / demo.MARKER).write_text("{}")
    built: list[str] = []
    widened: list[str] = []

    def fake_build(target, dst, work, recipe, log):
        dst.mkdir(parents=True)
        built.append(recipe.device)
        return {"recipe": {"device": recipe.device}}

    def fake_widen(src, dst, shape):
        dst.mkdir(parents=True)
        widened.append(demo.head_recipe_device(src) or "")
        return 1

    monkeypatch.setattr(eagle3, "build_head", fake_build)
    monkeypatch.setattr(eagle3_wide, "widen_head", fake_widen)
    monkeypatch.setattr(demo, "_prepare_wide", lambda target, force, log: {})
    quiet = dict(log=lambda m: None, eagle3=True, wide=True)

    demo.prepare_demo(**quiet)  # nothing cached: the CPU recipe
    demo.prepare_demo(**quiet)  # kept
    demo.prepare_demo(**quiet, device="cpu")  # kept
    assert built == ["cpu"] and widened == ["cpu"]
    demo.prepare_demo(**quiet, device="cuda")  # a CPU head cached: trained again with the GPU recipe, widened again
    assert built == ["cpu", "cuda"] and widened == ["cpu", "cuda"]
    demo.prepare_demo(**quiet)
    demo.prepare_demo(**quiet, device="cuda")
    assert built == ["cpu", "cuda"] and widened == ["cpu", "cuda"]
    assert demo.head_recipe_device(demo.demo_path(demo.WIDE_EAGLE3_NAME)) == "cuda"


class _EngineStart(Exception):
    """Raised by the stand-in engine once it has read how vLLM would start its engine core."""


def test_the_head_generation_engine_core_is_spawned_not_forked(monkeypatch, tmp_path: Path) -> None:
    """prepare-demo --wide runs torch's OpenMP pool (the widened target) before it generates the head's text;
    vLLM forks its engine core on a GPU host by default, and a child forked after that hangs in its first
    parallel torch op. The start method is vLLM's own decision (``get_mp_context``), read where vLLM reads it;
    only the engine behind it is a stand-in (the CPU platform spawns whatever is asked)."""
    import vllm
    from vllm.utils.system_utils import get_mp_context

    from tuner.models.eagle3_data import generate

    seen: list[str] = []

    def engine(**_: object) -> None:
        seen.append(get_mp_context().get_start_method())
        raise _EngineStart

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(vllm, "LLM", engine)
    prompts = [[{"role": "user", "content": "hi"}]]
    with pytest.raises(_EngineStart):
        generate(tmp_path / "target", prompts, tmp_path, max_tokens=4, seed=0, device="cuda", dtype="bfloat16")
    assert seen == ["spawn"]


TRAINER_LOG = (
    Path(__file__).resolve().parents[1] / "benchmarks/results/eagle3-wide-h100-20261207/background-filtered.log"
)


def test_the_training_record_reads_speculators_validation_and_steps_from_its_log() -> None:
    """The GPU head's record (2026-12-07, H100) was assembled by hand from this log: 6 epochs, 713 steps, the last
    epoch's validation accuracies 0.765 / 0.601 / 0.486; the record written by build_head must say the same."""
    from tuner.models.eagle3 import train_steps, validation_metrics

    text = TRAINER_LOG.read_text()
    metrics = validation_metrics(text)
    assert sorted(metrics) == [0, 1, 2, 3, 4, 5]
    assert [metrics[5][f"full_acc_{i}_epoch"] for i in range(3)] == [0.765, 0.601, 0.486]
    assert metrics[0]["loss_epoch"] == 8.467 and len(metrics[0]) == 10
    steps = train_steps(text)
    assert steps[0] == 119 and steps[1] == 118 and sum(steps.values()) == 713


def test_a_training_step_keeps_its_output_and_fails_loudly(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tuner.models.eagle3 import run_training_step

    kept = tmp_path / "train.log"
    run_training_step(Path(sys.executable), ["-c", "print('val/loss_epoch=1.5, epoch=0')"], lambda m: None, kept)
    assert kept.read_text() == "val/loss_epoch=1.5, epoch=0\n"
    with pytest.raises(subprocess.CalledProcessError):
        run_training_step(Path(sys.executable), ["-c", "import sys; print('x'); sys.exit(3)"], lambda m: None, kept)
    assert kept.read_text() == "x\n"


def test_the_training_data_record_counts_what_the_trainer_was_given(tmp_path: Path) -> None:
    from dataclasses import replace

    from tuner.models.eagle3 import GPU_RECIPE, training_data

    rows = [{"prompt_ids": [1] * p, "answer_ids": [2] * a} for p, a in [(3, 10), (2, 4), (5, 1)]]
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert training_data(responses, replace(GPU_RECIPE, sequences=2)) == {
        "prompts": 3,
        "answer_tokens": 15,
        "sequences": 2,
        "trained_answer_tokens": 5,
    }


def test_the_training_record_file_is_the_one_the_docs_table_reads(tmp_path: Path) -> None:
    """benchmarks/docs_tables.py renders training.json (t_eagle3_head); the record written from build_head's marker
    must carry what that table reads, epochs counted from the validation that ran (a step cap can end early)."""
    from dataclasses import asdict

    from benchmarks.eagle3_head import training_record
    from tuner.models.eagle3 import GPU_RECIPE, train_steps, validation_metrics

    text = TRAINER_LOG.read_text()
    marker = json.loads(
        json.dumps(  # through JSON, as the marker is read back: epoch keys become strings
            {
                "result": {
                    "recipe": asdict(GPU_RECIPE),
                    "epoch": 5,
                    "data": {
                        "prompts": 4000,
                        "answer_tokens": 584978,
                        "sequences": 4000,
                        "trained_answer_tokens": 584978,
                    },
                    "seconds": {"generate": 120.5, "extract": 60.0, "train": 173.0},
                    "steps_per_epoch": train_steps(text),
                    "validation": validation_metrics(text),
                }
            }
        )
    )
    rec = training_record(marker, "2026-12-07T12:10:38", {"cpu": "x", "speculators": "0.9.0"})
    assert rec is not None
    tr = rec["training"]
    assert tr["epochs"] == 6 and tr["steps"] == 713 and tr["speculators"] == "0.9.0"
    assert tr["val_metrics_per_epoch"][str(tr["epochs"] - 1)]["full_acc_2_epoch"] == 0.486
    assert rec["generation"] == {"prompts": 4000, "answer_tokens": 584978, "max_tokens": 256, "wall_s": 120.5}
    assert rec["training_data"]["answer_tokens_with_loss"] == 584978
    assert training_record({"result": {"recipe": {}, "epoch": 1}}, "d", {}) is None


def test_the_gpu_scripts_bring_back_the_head_the_tuner_caches(tmp_path: Path) -> None:
    """gpu_background.sh's `wait` sends the trained head back in pieces from the folder prepare-demo writes
    (tuner.models.demo.EAGLE3_NAME); shell spells that name in benchmarks/gpu_names.sh."""
    import os
    import subprocess

    from tuner.models.demo import EAGLE3_NAME

    root = Path(__file__).resolve().parents[1]
    results, out, cache = tmp_path / "results", tmp_path / "out", tmp_path / "cache"
    head = cache / "models" / EAGLE3_NAME
    head.mkdir(parents=True)
    (head / "specdec-tuner.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"w" * 1000)
    results.mkdir()
    out.mkdir()
    (results / "background.log").write_text("done\n")
    env = dict(os.environ, OUT=str(out), SPECDEC_TUNER_CACHE=str(cache))

    def wait() -> str:
        command = ["bash", "benchmarks/gpu_background.sh", "wait", str(results), "0"]
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, check=True).stdout

    assert "head: 1 piece(s)" in wait()
    listed = subprocess.run(["tar", "tf", str(out / "head.tar.00")], capture_output=True, text=True, check=True)
    assert f"{EAGLE3_NAME}/model.safetensors" in listed.stdout.split()
    # once sent (or brought from HEAD_FROM: gpu_study.sh's prepare marks it so), never again
    for piece in out.glob("head.tar.*"):
        piece.unlink()
    assert "head:" not in wait() and not list(out.glob("head.tar.*"))


def test_a_step_past_its_limit_is_killed_with_the_processes_it_started(tmp_path: Path) -> None:
    """A hung step (vLLM's engine core is a child of the generation step; the trainer's loader workers are
    children too) ends in StepTimeout, and nothing it started outlives it."""
    import sys
    import time

    from tuner.models.eagle3 import StepTimeout, run_step

    kept = tmp_path / "step.log"
    child = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    started = time.monotonic()
    with pytest.raises(StepTimeout, match="ran past 2 s"):
        run_step([sys.executable, "-c", child], {}, lambda m: None, kept, timeout_s=2)
    assert time.monotonic() - started < 30
    grandchild = Path(f"/proc/{int(kept.read_text().split()[0])}/status")
    deadline = time.monotonic() + 10
    while grandchild.exists() and "State:\tZ" not in grandchild.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not grandchild.exists() or "State:\tZ" in grandchild.read_text()
