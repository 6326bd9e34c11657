"""Keep what a demo run measured: its trials, its confirmation, its export and its timing.

    python -m benchmarks.demo_summary --run-dir /tmp/demo-a --log /tmp/demo-a.log --out benchmarks/results/demo-X

``--run-dir`` is the clone where ``bash scripts/demo.sh`` ran (its ``optuna.db`` and ``best.yaml``);
``--log`` the console output of ``/usr/bin/time -v bash scripts/demo.sh``, kept as ``console.txt``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import optuna

from tuner.results import confirmation as confirm
from tuner.results import store


def summarise(run_dir: Path, study_name: str) -> dict[str, Any]:
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{run_dir / 'optuna.db'}")
    trials = []
    for t in study.get_trials():
        spec, metrics = store.trial_spec(t), store.trial_metrics(t)
        trials.append(
            {
                "number": t.number,
                "label": spec.label() if spec else None,
                "state": t.state.name,
                "score": metrics.score if metrics else None,
                "tokens_per_s": metrics.tokens_per_s if metrics else None,
                "levels": {lv.batch_size: lv.tokens_per_s for lv in metrics.levels} if metrics else None,
                "pruned_reason": store.record_value(t, "pruned_reason"),
                "engine_wall_s": store.record_value(t, "engine_wall_s"),
            }
        )
    conf = confirm.load(study)
    commit = subprocess.run(["git", "-C", str(run_dir), "rev-parse", "HEAD"], capture_output=True, text=True)
    return {
        "study": study_name,
        "commit": commit.stdout.strip(),
        "study_wall_s": study.user_attrs.get("last_run_wall_s"),
        "trials": trials,
        "confirmation": conf.model_dump(mode="json") if conf else None,
        "confirmation_engine_wall_s": sum(e.wall_s for e in conf.engines) if conf else None,
        "decision": conf.decide().model_dump(mode="json") if conf and conf.complete else None,
        "hardware_class": study.user_attrs.get(store.HARDWARE_CLASS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--study", default="smollm2-cpu")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summarise(args.run_dir, args.study), indent=2) + "\n")
    shutil.copy(args.run_dir / "best.yaml", args.out / "best.yaml")
    shutil.copy(args.log, args.out / "console.txt")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
