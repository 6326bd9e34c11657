"""Acceptance of an EAGLE-3 head on vLLM: per k, acceptance length and per-position acceptance.

    python -m benchmarks.eagle3_head measure --head DIR [--target DIR] [--k 2 3 4 5 6] [--prompts F ...]
    python -m benchmarks.eagle3_head widen-check --head DIR [--hidden 1024 --intermediate 2048 --kv-heads 16]
    python -m benchmarks.eagle3_head record --head DIR --out FILE

``measure`` runs the study prompts (chat, greedy, as the studies do) through vLLM with
``method: eagle3`` once per k and reads vLLM's spec-decode counters (tuner.engine.vllm_metrics):
acceptance length = 1 + accepted / drafts, per-position rate = accepted at position i / drafts.
``widen-check`` builds a small widened target (tuner/models/wide.py with a smaller WideShape) and the
widened head (tuner/models/eagle3_wide.py), and measures the pair against the 135M and the small head at
one k: the same function, so the same greedy tokens and the same acceptance, float32 on CPU.
``--train-heldout N`` adds a prompt set from the head's own training prompt builder
(tuner.models.eagle3_prompts.build_prompts, the recipe's seed): the first N unique prompts after the
recipe's ``prompts`` (never generated, so never trained on); ``--train-seen N`` adds the first N of the
generated ones (about two thirds of them trained on). Acceptance there, against the trainer's
validation accuracy, tells a distribution shift from a loading bug. ``--trainer-val RESPONSES`` adds the
trainer's own validation prompts: the last (1 - train ratio) of the recipe's ``sequences`` shortest rows of
that run's responses.jsonl (tuner.models.eagle3_data.select_shortest, speculators' split).
``record`` writes the head's training record (``training.json``, docs/benchmarks.md's training table) from
the record ``build_head`` kept in the head's marker: the data, each step's seconds, speculators' steps and
validation metrics per epoch. Prints a table and writes JSON under benchmarks/results/<--out-dir>/.
Measuring on the study prompts is fine; training on them is not (tuner/models/eagle3_prompts.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import git_revision, machine, print_table, small_engine

RESULTS = Path(__file__).resolve().parent / "results"
OUT_DIR = RESULTS / "eagle3-head-20261204"
PROMPTS = ["studies/prompts/smollm2-demo.jsonl", "studies/prompts/wide-h200.jsonl"]


def load_prompts(files: list[str]) -> list[list[dict[str, str]]]:
    root = Path(__file__).resolve().parent.parent
    out = []
    for f in files:
        for line in (root / f).read_text().splitlines():
            if line.strip():
                out.append(json.loads(line)["messages"])
    return out


def training_prompts(seed: int, skip: int, n: int, mix: str = "stdlib") -> list[list[dict[str, str]]]:
    """Unique prompts ``skip`` to ``skip + n`` of the training builder's stream (the stream is prefix-stable,
    so the first ``prompts`` of a recipe are the generated ones)."""
    from tuner.models.eagle3_prompts import unique_prompts

    return unique_prompts(skip + n, seed, mix)[skip:]


def builder_prompt_sets(recipe: dict[str, Any], heldout: int, seen: int) -> dict[str, list[Any]]:
    """``train-heldout`` (the first prompts after the recipe's generated ones) and ``train-seen`` (the first
    generated ones), each only when asked for."""
    n_generated, seed = int(recipe.get("prompts", 600)), int(recipe.get("seed", 0))
    mix = str(recipe.get("prompt_mix", "stdlib"))
    sets: dict[str, list[Any]] = {}
    if heldout:
        sets["train-heldout"] = training_prompts(seed, n_generated, heldout, mix)
    if seen:
        sets["train-seen"] = training_prompts(seed, 0, seen, mix)
    return sets


def trainer_val_prompts(responses: Path, n_generated: int, seed: int, sequences: int, ratio: float = 0.95) -> list:
    """The prompts of speculators' validation split for a run whose answers are in ``responses``."""
    from tuner.models.eagle3_data import read_responses, seq_len

    rows = read_responses(responses)
    keep = sorted(sorted(range(len(rows)), key=lambda i: (seq_len(rows[i]), i))[:sequences])
    prompts = training_prompts(seed, 0, n_generated)
    return [prompts[i] for i in keep[int(len(keep) * ratio) :]]


def run_engine(
    target: str, head: str | None, k: int, prompt_sets: dict[str, list], max_tokens: int, dtype: str
) -> list[dict[str, Any]]:
    """One engine per k: per prompt set, greedy answers and the spec-decode counters over them alone."""
    from vllm import SamplingParams

    from tuner.engine.vllm_metrics import diff, snapshot
    from tuner.environment import spawn_engine_cores

    spawn_engine_cores()  # widen-check widens in this process first: a forked engine core would hang on a GPU
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": k} if head else None
    llm = small_engine(target, dtype, spec, disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    out = []
    for name, prompts in prompt_sets.items():
        before = snapshot(llm.get_metrics())
        start = time.perf_counter()
        outputs = llm.chat(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        stats = diff(before, snapshot(llm.get_metrics()))
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        out.append(
            {
                "prompts": name,
                "k": k,
                "seconds": seconds,
                "output_tokens": sum(map(len, tokens)),
                "stats": stats.summary(),
                "tokens": tokens,
            }
        )
    del llm
    return out


def _row(name: str, r: dict[str, Any]) -> list[Any]:
    s = r["stats"]
    rates = " ".join(f"{x:.2f}" for x in s["per_position_rate"])
    return [name, r["k"], s["drafts"], s["mean_acceptance_length"], s["acceptance_rate"], rates]


STARTED = dt.datetime.now().strftime("%Y%m%d-%H%M%S")  # one file per run, rewritten after every k


def _write(kind: str, payload: dict[str, Any], out_dir: Path = OUT_DIR) -> Path:
    import vllm

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{kind}-{STARTED}.json"
    payload = {
        "benchmark": f"eagle3-head {kind}",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]),
        "git": git_revision(),
        "machine": {**machine(), "vllm": vllm.__version__},
        **payload,
    }
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def measure(args: argparse.Namespace) -> None:
    from tuner.models.demo import TARGET_NAME, demo_path

    target = args.target or str(demo_path(TARGET_NAME))
    marker = Path(args.head) / "specdec-tuner.json"
    head_info = json.loads(marker.read_text()) if marker.is_file() else {}
    prompt_sets = {Path(f).stem: load_prompts([f]) for f in args.prompts}
    recipe = head_info.get("result", {}).get("recipe", {})
    label = Path(args.head).name
    if recipe:  # two heads of one name (CPU and GPU recipes) stay apart in the tables
        label += f" ({recipe.get('device', 'cpu')} recipe, {recipe.get('prompt_mix', 'stdlib')} prompts)"
    n_generated, seed = int(recipe.get("prompts", 600)), int(recipe.get("seed", 0))
    prompt_sets.update(builder_prompt_sets(recipe, args.train_heldout, args.train_seen))
    if args.trainer_val:
        prompt_sets["trainer-val"] = trainer_val_prompts(
            Path(args.trainer_val), n_generated, seed, int(recipe.get("sequences", 400))
        )
    headers = ["prompts", "k", "drafts", "acceptance length", "acceptance rate", "per position"]
    results = []
    for k in args.k:
        for r in run_engine(target, args.head, k, prompt_sets, args.max_tokens, args.dtype):
            r.pop("tokens")
            results.append(r)
            print_table(headers, [[r["prompts"], *_row("", r)[1:]]])
            payload = {
                "target": target,
                "head": args.head,
                "head_label": label,
                "head_info": head_info,
                "max_tokens": args.max_tokens,
                "dtype": args.dtype,
                "prompt_counts": {k: len(v) for k, v in prompt_sets.items()},
                "results": results,
            }
            # after every k: a cut-short run keeps what it measured
            path = _write("measure", payload, RESULTS / args.out_dir)
    print()
    print_table(headers, [[r["prompts"], *_row("", r)[1:]] for r in results])
    print(f"wrote {path}")


def widen_check(args: argparse.Namespace) -> None:
    from tuner.models.demo import TARGET_NAME, demo_path
    from tuner.models.eagle3_wide import widen_head
    from tuner.models.wide import WideShape, build_wide

    shape = WideShape(hidden=args.hidden, intermediate=args.intermediate, kv_heads=args.kv_heads)
    small_target = str(demo_path(TARGET_NAME))
    prompts = {"prompts": load_prompts(args.prompts)}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        wide_target, wide_head = Path(tmp) / "target", Path(tmp) / "head"
        build_wide(Path(small_target), wide_target, shape, "float32")
        widen_head(Path(args.head), wide_head, shape, "float32")
        small = run_engine(small_target, args.head, args.k, prompts, args.max_tokens, "float32")[0]
        wide = run_engine(str(wide_target), str(wide_head), args.k, prompts, args.max_tokens, "float32")[0]
    same = sum(a == b for a, b in zip(small["tokens"], wide["tokens"], strict=True))
    print_table(
        ["pair", "k", "drafts", "acceptance length", "acceptance rate", "per position"],
        [_row("135M + head", small), _row(f"wide {shape.hidden} + widened head", wide)],
    )
    print(f"identical greedy outputs: {same}/{len(small['tokens'])}")
    n = len(small.pop("tokens"))
    wide.pop("tokens")
    path = _write(
        "widen-check",
        {
            "head": args.head,
            "shape": shape.__dict__,
            "k": args.k,
            "max_tokens": args.max_tokens,
            "identical_outputs": same,
            "prompts_n": n,
            "small": small,
            "wide": wide,
        },
        RESULTS / args.out_dir,
    )
    print(f"wrote {path}")


def training_record(marker: dict[str, Any], date: str, machine_info: dict[str, Any]) -> dict[str, Any] | None:
    """``training.json`` from a head's marker; None for a head trained before build_head kept its record."""
    result = marker.get("result", {})
    if "validation" not in result:
        return None
    recipe, data, seconds = result["recipe"], result["data"], result["seconds"]
    validation = {str(k): v for k, v in result["validation"].items()}
    return {
        "benchmark": "eagle3-head training",
        "date": date,
        "machine": machine_info,
        "recipe": recipe,
        "generation": {
            "prompts": data["prompts"],
            "answer_tokens": data["answer_tokens"],
            "max_tokens": recipe["max_tokens"],
            "wall_s": seconds["generate"],
        },
        "training_data": {
            "sequences": data["sequences"],
            "answer_tokens_with_loss": data["trained_answer_tokens"],
            "train_ratio": 0.95,
            "extract_wall_s": seconds["extract"],
        },
        "training": {
            "speculators": machine_info.get("speculators", "?"),
            # the epochs that ran: a step cap (recipe max_steps) can end training before the recipe's epochs
            "epochs": max(map(int, validation)) + 1 if validation else 0,
            "steps": sum(result["steps_per_epoch"].values()),
            "wall_s": seconds["train"],
            "val_metrics_per_epoch": validation,
        },
    }


def record(args: argparse.Namespace) -> None:
    from importlib.metadata import PackageNotFoundError, version

    marker_path = Path(args.head) / "specdec-tuner.json"
    info = machine()
    try:
        info["speculators"] = version("speculators")
    except PackageNotFoundError:
        pass
    date = dt.datetime.fromtimestamp(marker_path.stat().st_mtime).isoformat(timespec="seconds")
    rec = training_record(json.loads(marker_path.read_text()), date, info)
    if rec is None:
        print(f"{marker_path}: no training record (a head trained before build_head kept one)")
        return
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": " ".join(["python", *sys.argv]), **rec}, indent=1) + "\n")
    tr = rec["training"]
    print_table(
        ["prompts", "answer tokens", "generate s", "extract s", "train s", "epochs", "steps"],
        [
            [
                rec["generation"]["prompts"],
                rec["generation"]["answer_tokens"],
                rec["generation"]["wall_s"],
                rec["training_data"]["extract_wall_s"],
                tr["wall_s"],
                tr["epochs"],
                tr["steps"],
            ]
        ],
    )
    print(f"wrote {args.out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--head", required=True)
    m.add_argument("--target")
    m.add_argument("--k", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    m.add_argument("--prompts", nargs="*", default=PROMPTS)
    m.add_argument("--max-tokens", type=int, default=96)
    m.add_argument("--dtype", default="float32")
    m.add_argument("--train-heldout", type=int, default=0, help="held-out prompts of the training builder")
    m.add_argument("--train-seen", type=int, default=0, help="generated (mostly trained-on) prompts")
    m.add_argument("--trainer-val", help="a training run's responses.jsonl: add its validation split's prompts")
    m.add_argument("--out-dir", default=OUT_DIR.name, help="folder under benchmarks/results")
    w = sub.add_parser("widen-check")
    w.add_argument("--head", required=True)
    w.add_argument("--k", type=int, default=3)
    w.add_argument("--prompts", nargs="+", default=PROMPTS[:1])
    w.add_argument("--max-tokens", type=int, default=48)
    w.add_argument("--hidden", type=int, default=1024)
    w.add_argument("--intermediate", type=int, default=2048)
    w.add_argument("--kv-heads", type=int, default=16)
    w.add_argument("--workdir", default=None)
    w.add_argument("--out-dir", default=OUT_DIR.name, help="folder under benchmarks/results")
    r = sub.add_parser("record")
    r.add_argument("--head", required=True)
    r.add_argument("--out", required=True, help="the training.json to write")
    args = p.parse_args()
    {"measure": measure, "widen-check": widen_check, "record": record}[args.cmd](args)


if __name__ == "__main__":
    main()
