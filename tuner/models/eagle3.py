"""The demo EAGLE-3 head: trained for SmolLM2-135M on CPU, widened for the 7B-class wide target.

``prepare-demo --eagle3`` builds ``SmolLM2-135M-Instruct-eagle3`` from a seed: prompts from the Python
standard library (tuner.models.eagle3_prompts), the target's greedy answers through vLLM, its hidden
states (tuner.models.eagle3_data), then speculators 0.9.0's EAGLE-3 trainer in its own environment
(requirements/eagle3-train.txt; tuner.models.eagle3_train). ``--device cuda`` runs the three steps on a GPU
with a larger recipe (GPU_RECIPE; on the offline GPU hosts the training Python is the bundle's: speculators
0.9.0, hs-connectors 0.9.0, datasets 5.1.0 and multiprocess 0.70.19 installed beside it with --no-deps,
requirements/eagle3-train-gpu.txt, and $SPECDEC_TUNER_TRAIN_PYTHON pointing at that python3). ``--wide --eagle3`` widens that head for the
wide target (tuner.models.eagle3_wide): no GPU training, the wide target computes the 135M's function.
Both are cached beside the other demo models; weights are never committed. Each of the three steps runs as a
process group of its own with a wall-clock limit (STEP_TIMEOUT_S), and the head's marker keeps its training
record (build_head; ``benchmarks/eagle3_head.py record`` writes it as training.json).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

TRAIN_PYTHON_ENV = "SPECDEC_TUNER_TRAIN_PYTHON"
TRAIN_VENV = ".venv-train"


@dataclass(frozen=True)
class HeadRecipe:
    """Everything that decides the head; recorded in its marker file."""

    seed: int = 0
    prompts: int = 600
    max_tokens: int = 192
    sequences: int = 400  # the shortest of the generated sequences that are trained on (CPU budget)
    draft_vocab_size: int = 8192
    epochs: int = 2
    lr: float = 1e-3
    total_seq_len: int = 2048
    device: str = "cpu"  # where generation, extraction and training run: "cpu" or "cuda"
    dtype: str = "float32"  # the target's dtype for generation and extraction
    max_steps: int | None = None  # a cap on optimizer steps (the GPU recipe's time guard)
    prompt_mix: str = "stdlib"  # tuner.models.eagle3_prompts.PROMPT_MIXES


# One H200, about 10-12 minutes for the three steps (docs/benchmarks.md, "The GPU recipe"):
# 4,000 prompts of the broad mix (stdlib code tasks, other code tasks and chat: eagle3_prompts_broad)
# answered to 256 tokens, all trained on, 6 epochs of 8,192-token packs in bfloat16, as the H200 studies run
# the target. A 32,768-token draft vocabulary: with 8,192 only 90% of the study prompts' answer tokens (74% of
# 3-token windows) can be drafted at all; the head's lm_head is the target's, frozen, so a larger one costs
# no training.
GPU_RECIPE = HeadRecipe(
    prompts=4000,
    max_tokens=256,
    sequences=4000,
    draft_vocab_size=32768,
    epochs=6,
    total_seq_len=8192,
    device="cuda",
    dtype="bfloat16",
    max_steps=1500,
    prompt_mix="broad",
)
DEVICES = ("cpu", "cuda")


def recipe_for(device: str) -> HeadRecipe:
    """The CPU recipe (the cached head's, unchanged) or the GPU one."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: one of {', '.join(DEVICES)}")
    return GPU_RECIPE if device == "cuda" else HeadRecipe()


def work_dir(root: Path, recipe: HeadRecipe) -> Path:
    """The resumable work files' folder: one per recipe device, so that a GPU build never resumes from the
    CPU recipe's answers and hidden states (each step keeps a file that is already there)."""
    name = "eagle3-work" if recipe.device == "cpu" else f"eagle3-work-{recipe.device}"
    return root / (name if recipe.prompt_mix == "stdlib" else f"{name}-{recipe.prompt_mix}")


def train_python() -> Path:
    """The training environment's interpreter: $SPECDEC_TUNER_TRAIN_PYTHON, else .venv-train beside the tuner."""
    from tuner.errors import UserError

    env = os.environ.get(TRAIN_PYTHON_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[2] / TRAIN_VENV / "bin" / "python"
    if not path.is_file():
        raise UserError(
            f"--eagle3: no training environment at {path}; fix: python -m venv {TRAIN_VENV} && "
            f"{TRAIN_VENV}/bin/pip install --no-deps -r requirements/eagle3-train.txt "
            f"(or set {TRAIN_PYTHON_ENV} to a Python with speculators 0.9.0)"
        )
    return path


def tuner_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A step's environment: the tuner's root first on PYTHONPATH, the caller's entries kept (the GPU hosts'
    offline bundle is a PYTHONPATH folder, /tmp/site, holding torch, vLLM and speculators)."""
    environ = dict(os.environ if environ is None else environ)
    paths = [str(Path(__file__).resolve().parents[2]), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(environ, PYTHONPATH=os.pathsep.join(paths))


def train_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The training steps' environment: tuner_env's, one OpenMP thread (the steps' own workers parallelise;
    generation keeps the caller's: vLLM's CPU engine sizes its own thread pool)."""
    return dict(tuner_env(environ), OMP_NUM_THREADS="1")


# Wall-clock limit of each of the three steps (generation, extraction, training), per recipe device: several
# times what they took (the CPU recipe on 2 cores: 651 / 218 / 546 s, eagle3-head-cpu-broad-20261206/training.json;
# the GPU recipe's whole prepare step, all three and the widening: 419 s on an H100). A step that hangs (the GPU
# generation engine did, three sessions running, before it was spawned) then ends in an error naming it, not
# with the machine's lease.
STEP_TIMEOUT_S = {"cpu": 4 * 3600, "cuda": 1200}


class StepTimeout(RuntimeError):
    """A head-building step ran past its limit; its process group was killed."""


def run_step(
    cmd: list[str],
    env: dict[str, str],
    log: Callable[[str], object],
    transcript: Path | None = None,
    timeout_s: float | None = None,
) -> None:
    """Run one head-building step in its own process group (vLLM's engine core and the trainer's data-loader
    workers included), its output passed through and, with ``transcript``, kept there (the trainer's validation
    lines go into the head's training record). Past ``timeout_s`` the whole group is killed: StepTimeout."""
    log(" ".join([Path(cmd[0]).name, *cmd[1:]]))
    kept = transcript.open("w") if transcript is not None else None
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    expired = threading.Event()

    def kill_group() -> None:
        expired.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, kill_group) if timeout_s else None
    try:
        if timer:
            timer.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if kept:
                kept.write(line)
        proc.wait()
    finally:
        if timer:
            timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the step left behind
        if kept:
            kept.close()
    if expired.is_set():
        raise StepTimeout(
            f"{Path(cmd[0]).name} {' '.join(cmd[1:3])} ran past {timeout_s:.0f} s; its processes were killed"
        )
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def run_training_step(
    python: Path,
    args: list[str],
    log: Callable[[str], object],
    transcript: Path | None = None,
    timeout_s: float | None = None,
) -> None:
    """A step in the training environment; rich wraps its log lines at the terminal's width (80 when piped), so
    it is told a width at which no metric is cut."""
    run_step([str(python), *args], dict(train_env(), COLUMNS="200"), log, transcript, timeout_s)


_METRIC = re.compile(r"(val/\w+|(?<![\w/])epoch)=([-+0-9.eE]+)")


def validation_metrics(transcript: str) -> dict[int, dict[str, float]]:
    """speculators' per-epoch validation metrics (``val/full_acc_0_epoch=0.455, ... epoch=0``) from its log."""
    epochs: dict[int, dict[str, float]] = {}
    pending: dict[str, float] = {}
    for name, value in _METRIC.findall(transcript):
        if name == "epoch":
            if pending:
                epochs[int(value)] = pending
            pending = {}
        else:
            pending[name.removeprefix("val/")] = float(value.rstrip(".,"))
    return epochs


def train_steps(transcript: str) -> dict[int, int]:
    """Optimizer steps per epoch: each epoch's first finished progress bar (the second is its validation)."""
    steps: dict[int, int] = {}
    for line in transcript.splitlines():
        m = re.match(r"Epoch (\d+) +100% .*? (\d+)/(\d+)", line)
        if m and int(m.group(1)) not in steps:
            steps[int(m.group(1))] = int(m.group(3))
    return steps


def training_data(responses: Path, recipe: HeadRecipe) -> dict[str, int]:
    """What the trainer was given: prompts answered, sequences trained on and their answer tokens."""
    from tuner.models.eagle3_data import read_responses, select_shortest

    rows = read_responses(responses)
    kept = select_shortest(rows, recipe.sequences)
    return {
        "prompts": len(rows),
        "answer_tokens": sum(len(r["answer_ids"]) for r in rows),
        "sequences": len(kept),
        "trained_answer_tokens": sum(len(r["answer_ids"]) for r in kept),
    }


def build_head(
    target: Path, dst: Path, work: Path, recipe: HeadRecipe, log: Callable[[str], object]
) -> dict[str, object]:
    """Generate, extract and train in ``work`` (each step resumable); copy the last epoch's head to ``dst``.

    Returns the head's training record (kept in its marker): the recipe, the data, each step's seconds (a step
    whose file was already there took about none) and speculators' validation metrics and steps per epoch."""
    from tuner.models.eagle3_prompts import unique_prompts

    python = train_python()
    work.mkdir(parents=True, exist_ok=True)
    limit = STEP_TIMEOUT_S[recipe.device]
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    responses = work / "responses.jsonl"
    if not responses.is_file():
        prompts = work / "prompts.jsonl"
        prompts.write_text(
            "".join(
                json.dumps(p) + "\n" for p in unique_prompts(recipe.prompts, seed=recipe.seed, mix=recipe.prompt_mix)
            )
        )
        run_step(generate_command(target, prompts, work, recipe), tuner_env(), log, timeout_s=limit)
    seconds["generate"] = round(time.perf_counter() - start, 1)
    data = work / "data"
    start = time.perf_counter()
    run_training_step(python, extract_args(target, work, recipe), log, timeout_s=limit)
    seconds["extract"] = round(time.perf_counter() - start, 1)
    ckpt = work / "checkpoints"
    transcript = work / "train.log"
    start = time.perf_counter()
    train = ["-m", "tuner.models.eagle3_train", *train_args(target, data, ckpt, recipe)]
    run_training_step(python, train, log, transcript, timeout_s=limit)
    seconds["train"] = round(time.perf_counter() - start, 1)
    last = max((p for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    export_head(last, dst)
    text = transcript.read_text(errors="replace")
    return {
        "recipe": asdict(recipe),
        "epoch": int(last.name),
        "data": training_data(responses, recipe),
        "seconds": seconds,
        "steps_per_epoch": train_steps(text),
        "validation": validation_metrics(text),
    }


def generate_command(target: Path, prompts: Path, work: Path, recipe: HeadRecipe) -> list[str]:
    """The generation step: vLLM in this interpreter, in a process of its own (tuner.models.eagle3_data's main),
    so that it can be timed out and nothing this process did before (widening the target with torch's OpenMP
    pool) is inherited by vLLM's engine core."""
    return [
        sys.executable,
        "-m",
        "tuner.models.eagle3_data",
        str(target),
        str(prompts),
        str(work),
        str(recipe.max_tokens),
        str(recipe.seed),
        recipe.device,
        recipe.dtype,
    ]


def extract_args(target: Path, work: Path, recipe: HeadRecipe) -> list[str]:
    """The extraction step, run in the training environment (transformers; batch 4 on CPU, 32 on a GPU)."""
    batch = 32 if recipe.device == "cuda" else 4
    return [
        "-c",
        "import sys; from pathlib import Path; from tuner.models.eagle3_data import extract, token_frequencies; "
        "w, t, n, b, d, dt = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), "
        "sys.argv[5], sys.argv[6]; "
        "extract(t, w / 'responses.jsonl', w / 'data', batch=b, limit=n, device=d, dtype=dt); "
        "token_frequencies(w / 'responses.jsonl', 49152, w / 'data' / 'token_freq.pt', limit=n)",
        str(work),
        str(target),
        str(recipe.sequences),
        str(batch),
        recipe.device,
        recipe.dtype,
    ]


def export_head(checkpoint: Path, dst: Path) -> None:
    """config.json and the weights without ``embed_tokens``: speculators saves a frozen bfloat16 copy of the
    target's embeddings (56 MB of the head's 76), which vLLM would keep as distinct weights; without it vLLM
    shares the target's own (llm_base_proposer._maybe_share_embeddings), exact and, for the wide target,
    already widened. The head is then small enough to travel to a GPU host in the working tree."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(checkpoint / "config.json", dst / "config.json")
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys() if k != "embed_tokens.weight"}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def train_args(target: Path, data: Path, ckpt: Path, recipe: HeadRecipe) -> list[str]:
    """speculators 0.9.0 train flags. On CPU: sdpa attention, eager loss (no Triton), AdamW and float32 (Muon's
    Newton-Schulz and autocast run in bfloat16, which CPUs without bf16 units emulate slowly), no data-loader
    workers. On a GPU: speculators' own flex attention and fused loss, bfloat16, 8 loader workers, AdamW
    (the CPU head's optimizer, so the two recipes differ in data and steps only). Both: one full-attention
    layer (vLLM's attention runs the head without a window), a 5% validation split."""
    args = [
        f"--verifier-name-or-path={target}",
        f"--data-path={data}",
        f"--save-path={ckpt}",
        f"--log-dir={ckpt / 'logs'}",
        f"--draft-vocab-size={recipe.draft_vocab_size}",
        f"--epochs={recipe.epochs}",
        f"--lr={recipe.lr}",
        f"--seed={recipe.seed}",
        f"--total-seq-len={recipe.total_seq_len}",
    ]
    if recipe.device == "cpu":
        args += [
            "--draft-attn-impl=sdpa",
            "--loss-implementation=eager",
            "--optimizer=adamw",
            "--hidden-states-dtype=float32",
            "--num-workers=0",
        ]
    else:
        args += ["--optimizer=adamw", "--hidden-states-dtype=bfloat16", "--num-workers=8"]
    if recipe.max_steps is not None:
        args.append(f"--max-steps={recipe.max_steps}")
    return [*args, "--full-attention-indices", "0", "--train-data-ratio=0.95"]
