"""The demo EAGLE-3 head: trained for SmolLM2-135M on CPU, widened for the 7B-class wide target.

``prepare-demo --eagle3`` builds ``SmolLM2-135M-Instruct-eagle3`` from a seed: prompts from the Python
standard library (tuner.models.eagle3_prompts), the target's greedy answers through vLLM, its hidden
states (tuner.models.eagle3_data), then speculators 0.9.0's EAGLE-3 trainer in its own environment
(requirements/eagle3-train.txt; tuner.models.eagle3_train). ``--wide --eagle3`` widens that head for the
wide target (tuner.models.eagle3_wide): no GPU training, the wide target computes the 135M's function.
Both are cached beside the other demo models; weights are never committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def _in_train_env(python: Path, args: list[str], log: Callable[[str], object]) -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    log(" ".join([python.name, *args]))
    subprocess.run([str(python), *args], check=True, env=env)


def build_head(target: Path, dst: Path, work: Path, recipe: HeadRecipe, log: Callable[[str], object]) -> dict[str, object]:
    """Generate, extract and train in ``work`` (each step resumable); copy the last epoch's head to ``dst``."""
    from tuner.models.eagle3_data import generate
    from tuner.models.eagle3_prompts import unique_prompts

    python = train_python()
    work.mkdir(parents=True, exist_ok=True)
    prompts = unique_prompts(recipe.prompts, seed=recipe.seed)
    generate(target, prompts, work, recipe.max_tokens, recipe.seed, log)
    data = work / "data"
    _in_train_env(
        python,
        [
            "-c",
            "import sys; from pathlib import Path; from tuner.models.eagle3_data import extract, token_frequencies; "
            "w, t, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]); "
            "extract(t, w / 'responses.jsonl', w / 'data', batch=4, limit=n); "
            "token_frequencies(w / 'responses.jsonl', 49152, w / 'data' / 'token_freq.pt', limit=n)",
            str(work),
            str(target),
            str(recipe.sequences),
        ],
        log,
    )
    ckpt = work / "checkpoints"
    _in_train_env(python, ["-m", "tuner.models.eagle3_train", *train_args(target, data, ckpt, recipe)], log)
    last = max((p for p in ckpt.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    export_head(last, dst)
    return {"recipe": asdict(recipe), "epoch": int(last.name)}


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
    """speculators 0.9.0 train flags; the CPU-only ones: sdpa attention, eager loss (no Triton), AdamW and
    float32 (Muon's Newton-Schulz and autocast run in bfloat16, which CPUs without bf16 units emulate slowly),
    no data-loader workers, one full-attention layer (vLLM's CPU attention runs it without a window)."""
    return [
        f"--verifier-name-or-path={target}",
        f"--data-path={data}",
        f"--save-path={ckpt}",
        f"--log-dir={ckpt / 'logs'}",
        f"--draft-vocab-size={recipe.draft_vocab_size}",
        f"--epochs={recipe.epochs}",
        f"--lr={recipe.lr}",
        f"--seed={recipe.seed}",
        f"--total-seq-len={recipe.total_seq_len}",
        "--draft-attn-impl=sdpa",
        "--loss-implementation=eager",
        "--optimizer=adamw",
        "--hidden-states-dtype=float32",
        "--num-workers=0",
        "--full-attention-indices",
        "0",
        "--train-data-ratio=0.95",
    ]
