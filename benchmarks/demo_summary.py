"""Keep what a demo run measured: its trials, its confirmation, its export and its timing.

    python -m benchmarks.demo_summary --run-dir /tmp/demo-a --log /tmp/demo-a.log --out benchmarks/results/demo-X

``--run-dir`` is the clone where ``bash scripts/demo.sh`` ran (its ``optuna.db``, ``best.yaml`` and the engines'
``tuner-runs/`` folders); ``--log`` the console output of ``/usr/bin/time -v bash scripts/demo.sh``, kept as
``console.txt``. ``bash benchmarks/demo_fresh.sh TAG`` does the whole run and calls this.

Where the time went (fields added after demo-20261201-c; the older fields keep their meaning):
``wall_s`` (time -v), ``phases_s`` (the demo's "demo: PHASE took N s" lines), ``split_s`` (install, model
build, trials, after the trials: confirmation + conclusion + export, report, the rest), and per engine
``start_s`` (process launch to engine ready: Python, torch and vLLM imports, vLLM's engine core, model load)
and ``measure_s`` (engine ready to its last measured repeat: warm-up and repeats), from each engine's
``progress.jsonl``; ``engines`` lists the confirmation's too; ``load_average`` (with ``--load``) the machine's
1-minute load average sampled every 30 s (the demo itself makes about 2 on 2 cores; more is other work).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna

from tuner.engine.request import PROGRESS_FILE, ProgressEvent
from tuner.results import confirmation as confirm
from tuner.results import store

PHASE = re.compile(r"^demo: (.+?) took (\d+) s", re.M)
ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):(\d+(?:\.\d+)?)")


def engine_split(workdir: Path, wall_s: float | None) -> dict[str, float | None]:
    """An engine's start (launch to ready) and measurement (ready to its last repeat) from its progress file."""
    path = workdir / PROGRESS_FILE
    events = (
        [ProgressEvent.model_validate_json(line) for line in path.read_text().splitlines()] if path.exists() else []
    )
    ready = next((e.elapsed_s for e in events if e.event == "engine_ready"), None)
    if ready is None or wall_s is None:
        return {"start_s": None, "measure_s": None}
    last = max(e.elapsed_s for e in events)
    # The progress clock starts inside the engine process: what precedes it (interpreter and tuner imports)
    # and follows its last event (result, kill) is counted with the start.
    return {"start_s": round(wall_s - (last - ready), 1), "measure_s": round(last - ready, 1)}


def phases(console: str) -> dict[str, int]:
    return {name.split(" (")[0]: int(seconds) for name, seconds in PHASE.findall(console)}


def wall_clock(console: str) -> float | None:
    m = ELAPSED.search(console)
    return None if m is None else int(m[1] or 0) * 3600 + int(m[2]) * 60 + float(m[3])


def load_average(path: Path) -> dict[str, float | int] | None:
    """The machine's 1-minute load average during the run: the demo itself makes about 2 on 2 cores."""
    samples = [float(x) for x in path.read_text().split()] if path.exists() else []
    if not samples:
        return None
    return {"samples": len(samples), "mean": round(sum(samples) / len(samples), 2), "max": max(samples)}


def summarise(run_dir: Path, study_name: str, console: str = "") -> dict[str, Any]:
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    workdir = run_dir / "tuner-runs" / study_name
    trials = []
    engines = []
    for t in study.get_trials():
        spec, metrics = store.trial_spec(t), store.trial_metrics(t)
        wall = store.record_value(t, "engine_wall_s")
        split = engine_split(workdir / f"trial-{t.number:03d}", wall)
        engines.append({"engine": f"trial {t.number}", "wall_s": wall, **split})
        trials.append(
            {
                "number": t.number,
                "label": spec.label() if spec else None,
                "state": t.state.name,
                "score": metrics.score if metrics else None,
                "tokens_per_s": metrics.tokens_per_s if metrics else None,
                "levels": {lv.batch_size: lv.tokens_per_s for lv in metrics.levels} if metrics else None,
                "pruned_reason": store.record_value(t, "pruned_reason"),
                "engine_wall_s": wall,
                **split,
            }
        )
    conf = confirm.load(study)
    for e in conf.engines if conf else []:
        name = f"trial-{e.trial:03d}" if e.trial is not None and not e.schedule else "schedule"
        split = engine_split(workdir / f"confirm-r{e.round + 1}-{name}", e.wall_s)
        engines.append({"engine": f"confirm round {e.round + 1} {name}", "wall_s": e.wall_s, **split})
    commit = subprocess.run(["git", "-C", str(run_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    steps = phases(console)
    study_wall = study.user_attrs.get("last_run_wall_s")
    known = [steps.get("install"), steps.get("model build"), steps.get("study"), steps.get("report")]
    wall = wall_clock(console)
    split_s = {
        "install": steps.get("install"),
        "model_build": steps.get("model build"),
        "trials": round(study_wall, 1) if study_wall is not None else None,
        # confirmation engines, conclusion, MLflow artifacts, export, and the optimize command's start-up
        "after_trials": round(steps["study"] - study_wall, 1) if "study" in steps and study_wall else None,
        "report": steps.get("report"),
        "rest": round(wall - sum(k for k in known if k is not None), 1)
        if wall is not None and None not in known
        else None,
    }
    return {
        "study": study_name,
        "commit": commit.stdout.strip(),
        "study_wall_s": study.user_attrs.get("last_run_wall_s"),
        "trials": trials,
        "confirmation": conf.model_dump(mode="json") if conf else None,
        "confirmation_engine_wall_s": sum(e.wall_s for e in conf.engines) if conf else None,
        "decision": conf.decide().model_dump(mode="json") if conf and conf.complete else None,
        "hardware_class": study.user_attrs.get(store.HARDWARE_CLASS),
        "wall_s": wall,
        "phases_s": steps,
        "split_s": split_s,
        "engines": engines,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--study", default="smollm2-cpu")
    parser.add_argument("--load", type=Path, help="1-minute load averages sampled during the run, one a line")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary = summarise(args.run_dir, args.study, args.log.read_text(errors="replace"))
    if args.load is not None:
        summary["load_average"] = load_average(args.load)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.copy(args.run_dir / "best.yaml", args.out / "best.yaml")
    shutil.copy(args.log, args.out / "console.txt")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
