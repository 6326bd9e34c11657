"""What the tuner's current rules decide on a stored study, without starting an engine.

    python -m benchmarks.rederive --study S.yaml --storage sqlite:///OUT/optuna.db --out OUT/rederived.json

A resumed ``optimize`` derives the schedule again from the completed trials and keeps the stored
confirmation's engines when they answer the finalists the rules now call for (tuner.trial.confirm). This
prints and writes what that resume would find: the study's noise per level, the schedule (or why none),
the finalists, and whether the stored confirmation answers them, with its decision. It only reads the
storage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from tuner.results import confirmation, outcome, schedule_run
from tuner.study.loader import load_study


def rederive(study_file: Path, storage: str) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    config = load_study(study_file)
    study = optuna.load_study(study_name=config.name, storage=storage)
    levels = config.workload.batch_sizes
    derivation = schedule_run.derive_for(study, config)
    run = schedule_run.ScheduleRun(basis=schedule_run.basis(study), derivation=derivation)
    wanted = outcome.expected_finalists(study, config, config.confirm.speculative, run)
    stored = confirmation.load(study)
    answer: dict[str, Any] = {"stored": stored is not None}
    if stored is not None and wanted is not None:
        usable = stored.answering(wanted)
        answer.update(same=usable is stored, narrowed=usable is not None and usable is not stored)
        if usable is not None:
            answer["complete"] = usable.complete
            answer["engines"] = len(usable.engines)
            answer["engines_to_run"] = usable.engines_to_run()
            if usable.complete:
                decision = usable.decide()
                answer["winner"] = decision.winner
                answer["results"] = [r.model_dump(mode="json") for r in decision.speculative]
    return {
        "benchmark": "the current rules on a stored study (benchmarks/rederive.py)",
        "date": dt.date.today().isoformat(),
        "command": f"python -m benchmarks.rederive --study {study_file} --storage {storage}",
        "study": config.name,
        "noise": schedule_run.noise(study, levels),
        "schedule": derivation.schedule.text() if derivation.schedule is not None else None,
        "note": derivation.note,
        "levels": [c.model_dump(mode="json") for c in derivation.levels],
        "finalists": [f.label for f in wanted.finalists] if wanted is not None else [],
        "stored_schedule": (s.schedule.text() if (s := schedule_run.load(study)) and s.schedule else None),
        "stored_confirmation_finalists": [f.label for f in stored.finalists] if stored is not None else [],
        "confirmation": answer,
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| level | noise | k chosen | fastest k | tok/s chosen | tok/s fastest |", "|---|---|---|---|---|---|"]
    for c in result["levels"]:
        lines.append(
            f"| {c['level']} | {result['noise'][c['level']]:.1%} | {c['k']} | {c['fastest_k']} "
            f"| {c['tokens_per_s']:.1f} | {c['fastest_tokens_per_s']:.1f} |"
        )
    lines.append("")
    lines.append(f"schedule: {result['schedule'] or result['note']}")
    lines.append(f"finalists: {'; '.join(result['finalists'])}")
    lines.append(
        f"stored confirmation: {json.dumps({k: v for k, v in result['confirmation'].items() if k != 'results'})}"
    )
    for r in result["confirmation"].get("results", []):
        lines.append(f"  {r['label']}: median {r['median']:.3f}x, wins {r['wins']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = rederive(args.study, args.storage)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
