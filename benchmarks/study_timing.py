"""Overhead and pruning benchmarks: run the tuner on a study and split its wall time.

    python -m benchmarks.study_timing overhead --study studies/smollm2-cpu.yaml
    python -m benchmarks.study_timing pruning --study studies/smollm2-cpu.yaml --trials 6

overhead: where the study's wall time goes: engine start, warm-up, measured generation, engines of
          pruned or failed trials, engine process spawn and shutdown, and the tuner's own overhead
          (time when no engine process exists: Optuna, MLflow, pre-flight; target: under 5%).
pruning:  the same study (same sampler seed) with and without pruning: engine time of each and
          whether the best configuration changed.
workers:  the same fixed set of trials (baseline + ``search.first_trials``, pruning off) run by one
          worker and by ``optimize --workers N``: wall time of each and each trial's throughput.

    python -m benchmarks.study_timing workers --study studies/smollm2-cpu.yaml --workers 1,2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from benchmarks.common import load_with_overrides, print_table, write_result
from tuner.cli import quiet_libraries
from tuner.engine.process import env_with_project
from tuner.results import store
from tuner.trial.optimize import OptimizeOptions, optimize


def run_study(study: Path, overrides: list[str], workdir: Path, name: str) -> dict[str, Any]:
    path = load_with_overrides(study, overrides, workdir, name)
    started = time.monotonic()
    runner = optimize(path, OptimizeOptions(workdir=workdir / "runs", show_progress=False))
    wall = time.monotonic() - started
    assert runner.study is not None
    return summarise(runner.study, wall)


def summarise(study: optuna.Study, wall: float) -> dict[str, Any]:
    trials = []
    for t in study.get_trials():
        spec = store.trial_spec(t)
        metrics = store.trial_metrics(t)
        trials.append(
            {
                "number": t.number,
                "state": t.state.name,
                "label": spec.label() if spec else "",
                "wall_s": (
                    (t.datetime_complete - t.datetime_start).total_seconds()
                    if t.datetime_complete and t.datetime_start
                    else None
                ),
                "engine_start_s": metrics.engine_start_s if metrics else None,
                "warmup_s": metrics.warmup_s if metrics else None,
                "measured_s": metrics.measured_s if metrics else None,
                "tokens_per_s": metrics.tokens_per_s if metrics else None,
                "score": metrics.score if metrics else None,
                "pruned_reason": store.record_value(t, "pruned_reason"),
                "pruning_saved_s": store.record_value(t, "pruning_saved_s"),
                "engine_wall_s": store.record_value(t, "engine_wall_s"),
            }
        )
    best = store.best_trial(study)
    best_spec = store.trial_spec(best) if best else None
    return {"wall_s": wall, "trials": trials, "best": best_spec.label() if best_spec else None}


def overhead(args: argparse.Namespace) -> None:
    if args.storage:  # a study already run, e.g. by scripts/demo.sh: its last run's wall time
        from tuner.study.loader import load_study

        study = optuna.load_study(study_name=load_study(args.study).name, storage=args.storage)
        result = summarise(study, float(study.user_attrs["last_run_wall_s"]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_study(args.study, [*args.set, f"budget.trials={args.trials}"], Path(tmp), "overhead")
    wall = result["wall_s"]
    engine = {k: sum(t[k] or 0.0 for t in result["trials"]) for k in ("engine_start_s", "warmup_s", "measured_s")}
    # Pruned and failed trials have no metrics: their engine time is their whole engine window.
    partial = sum(t["engine_wall_s"] or 0.0 for t in result["trials"] if t["state"] != "COMPLETE")
    engine_wall = sum(t["engine_wall_s"] or 0.0 for t in result["trials"])
    lifecycle = engine_wall - partial - sum(engine.values())
    outside = wall - engine_wall
    rows = [
        ["study wall time", wall, 1.0],
        ["engine start (vLLM import + LLM())", engine["engine_start_s"], engine["engine_start_s"] / wall],
        ["warm-up generation", engine["warmup_s"], engine["warmup_s"] / wall],
        ["measured generation", engine["measured_s"], engine["measured_s"] / wall],
        ["pruned/failed trials' engines", partial, partial / wall],
        ["engine process spawn + shutdown", lifecycle, lifecycle / wall],
        ["tuner overhead (no engine running)", outside, outside / wall],
    ]
    print_table(["part", "seconds", "share"], rows)
    out = write_result(
        "overhead",
        {
            **result,
            "split": {r[0]: r[1] for r in rows},
            "overrides": args.set,
            "overhead_share": outside / result["wall_s"],
        },
    )
    print(f"\nwritten {out}")


def pruning(args: argparse.Namespace) -> None:
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for enabled in (True, False):
            name = f"pruning-{'on' if enabled else 'off'}"
            runs[name] = run_study(
                args.study,
                [*args.set, f"budget.trials={args.trials}", f"pruning.enabled={str(enabled).lower()}"],
                Path(tmp) / name,
                name,
            )
    rows = []
    for name, result in runs.items():
        engine_s = sum(t["wall_s"] or 0.0 for t in result["trials"])
        pruned = sum(1 for t in result["trials"] if t["state"] == "PRUNED")
        rows.append([name, result["wall_s"], engine_s, pruned, result["best"]])
    print_table(["study", "wall s", "trial time s", "pruned", "best configuration"], rows)
    same = runs["pruning-on"]["best"] == runs["pruning-off"]["best"]
    print(f"\nbest configuration unchanged by pruning: {same}")
    out = write_result("pruning", {"runs": runs, "best_unchanged": same, "overrides": args.set})
    print(f"written {out}")


WORKER_TRIALS = [
    {"candidate": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo, "prompt_lookup_max": 4}
    for k, lo in ((2, 2), (3, 2), (4, 3), (5, 2), (6, 3))
]


def workers(args: argparse.Namespace) -> None:
    counts = [int(n) for n in args.workers.split(",")]
    first = WORKER_TRIALS[: max(args.trials - 1, 0)]
    fixed = [f"search.first_trials={first}", "pruning.enabled=false", "search.enforce_eager=[true]"]
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            name = f"workers-{n}"
            workdir = Path(tmp) / name
            path = load_with_overrides(
                args.study, [*args.set, *fixed, f"budget.trials={len(first) + 1}"], workdir, name
            )
            cmd = [sys.executable, "-m", "tuner", "optimize", "--study", str(path), "--no-progress"]
            cmd += ["--workdir", str(workdir / "runs")]
            if n > 1:
                cmd += ["--workers", str(n)]
            started = time.monotonic()
            done = subprocess.run(
                cmd, cwd=workdir, env=env_with_project(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            wall = time.monotonic() - started
            if done.returncode != 0:
                raise SystemExit(f"{name}: optimize failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
            study = optuna.load_study(study_name=name, storage=f"sqlite:///{workdir / 'optuna.db'}")
            runs[name] = summarise(study, wall)
    first_run = runs[f"workers-{counts[0]}"]
    base = first_run["wall_s"]
    rows = [
        [name, r["wall_s"], base / r["wall_s"], sum(t["wall_s"] or 0.0 for t in r["trials"]), r["best"]]
        for name, r in runs.items()
    ]
    print_table(["study", "wall s", "speed-up", "sum of trial walls s", "best configuration"], rows)
    labels = [t["label"] for t in first_run["trials"]]
    per_trial = []
    for label in labels:
        row: list[Any] = [label]
        for r in runs.values():
            match = [t for t in r["trials"] if t["label"] == label]
            row.append(match[0]["tokens_per_s"] if match else None)
        per_trial.append(row)
    print()
    print_table(["configuration", *(f"tok/s {n}" for n in runs)], per_trial)
    out = write_result("workers", {"runs": runs, "overrides": args.set})
    print(f"\nwritten {out}")


def main() -> None:
    quiet_libraries()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["overhead", "pruning", "workers"])
    parser.add_argument("--study", type=Path, default=Path("studies/smollm2-cpu.yaml"))
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--workers", default="1,2", help="workers: worker counts to compare")
    parser.add_argument("--storage", help="overhead: analyse this study's last run instead of running one")
    parser.add_argument("--set", action="append", default=[], help="override, e.g. workload.max_tokens=32")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    {"overhead": overhead, "pruning": pruning, "workers": workers}[args.which](args)


if __name__ == "__main__":
    main()
