"""Summaries of a GPU study run and its comparison with a brute-force grid (docs/measurement-log.md, GPU).

    python -m benchmarks.gpu_report study --study S.yaml --storage sqlite:///OUT/optuna.db \
        --workdir OUT/runs --timings OUT/timings.jsonl --out OUT/study_summary.json
    python -m benchmarks.gpu_report compare --study S.yaml --summary OUT/study_summary.json \
        --grid OUT/grid.json --out OUT/comparison.json
    python -m benchmarks.gpu_report markdown --summary OUT/study_summary.json [--grid ... --comparison ...]

``study`` reads the Optuna storage, each trial's engine log and progress file, and splits the study's
wall time into engine start, warm-up, measured generation, the rest of each trial (engine shutdown,
bookkeeping) and the tuner's own time between trials. ``compare`` says which configuration each
approach found best and what each cost in GPU time.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import best_per_batch
from benchmarks.vllm_log import parse_log
from tuner.results.stats import median

# Gaps between trials longer than this were spent outside the study (another command, a new session).
MAX_GAP_S = 120.0


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def _load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def _progress(path: Path) -> dict[str, Any]:
    """Engine-ready time and measured seconds from a trial's progress file (pruned trials have no result)."""
    out: dict[str, Any] = {"engine_ready_s": None, "measured_s": 0.0, "repeats": 0, "first_repeat_end_s": None}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "engine_ready":
            out["engine_ready_s"] = event["elapsed_s"]
        elif event.get("measurement"):
            m = event["measurement"]
            out["measured_s"] += m["elapsed_s"]
            out["repeats"] += 1
            if out["first_repeat_end_s"] is None:
                out["first_repeat_end_s"] = event["elapsed_s"] - m["elapsed_s"]
    return out


# -- study ----------------------------------------------------------------------------------------
def study_summary(study_file: Path, storage: str, workdir: Path, timings: Path | None) -> dict[str, Any]:
    from tuner.results import store
    from tuner.study.loader import load_study

    config = load_study(study_file)
    study = store.load_existing(storage, config.name)
    trials_dir = workdir / config.name
    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        spec = store.trial_spec(t)
        metrics = store.trial_metrics(t)
        run_dir = trials_dir / f"trial-{t.number:03d}"
        duplicate = store.record_value(t, "duplicate_of")
        # A trial failed with no failure record is one whose process died with the machine: Optuna failed it
        # as stale when the study resumed on the next machine, so its "wall time" spans the gap between leases.
        # One still RUNNING in a database brought back mid-study is that trial before the resume.
        interrupted = t.state.name == "RUNNING" or (
            t.state.name == "FAIL" and store.record_value(t, "failure_class") is None
        )
        wall = (
            (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_complete and t.datetime_start and not interrupted
            else None
        )
        row: dict[str, Any] = {
            "number": t.number,
            "state": t.state.name,
            "label": spec.label() if spec else "",
            "spec": spec.model_dump(mode="json") if spec else None,
            "started": t.datetime_start.isoformat() if t.datetime_start else None,
            "completed": t.datetime_complete.isoformat() if t.datetime_complete else None,
            "wall_s": wall,
            "duplicate_of": duplicate,
            "interrupted": interrupted,
            "pruned_reason": store.record_value(t, "pruned_reason"),
            "failure": store.record_value(t, "failure_class"),
            "error": (store.record_value(t, "error") or "")[:500] or None,
            "engine": store.record_value(t, "engine"),
        }
        if duplicate is None:
            prog = _progress(run_dir / "progress.jsonl")
            row["log"] = parse_log(run_dir / "engine.log")
            row["engine_start_s"] = prog["engine_ready_s"]
            row["measured_s"] = prog["measured_s"]
            row["repeats_measured"] = prog["repeats"]
            if prog["first_repeat_end_s"] is not None and prog["engine_ready_s"] is not None:
                row["warmup_s"] = max(0.0, prog["first_repeat_end_s"] - prog["engine_ready_s"])
        if metrics is not None:
            row["metrics"] = metrics.model_dump(mode="json")
            if duplicate is None:
                row["engine_start_s"] = metrics.engine_start_s
                row["warmup_s"] = metrics.warmup_s
                row["measured_s"] = metrics.measured_s
        rows.append(row)

    best = store.best_trial(study)
    base = store.best_baseline(study)
    steps = _timings(timings)
    return {
        "study": config.name,
        "study_file": str(study_file),
        "storage": storage,
        "trials": rows,
        "best": _best_entry(best, store),
        "baseline": _best_entry(base, store),
        "best_per_batch_size": _best_per_batch(rows, config.workload.batch_sizes),
        "time_to_best_s": _time_to_best(rows, best.number if best else None),
        "split": _split(rows, steps),
        "steps": steps,
        "compile_cache": _compile_cache(rows),
    }


def _best_entry(trial: Any, store: Any) -> dict[str, Any] | None:
    if trial is None:
        return None
    spec = store.trial_spec(trial)
    metrics = store.trial_metrics(trial)
    return {
        "number": trial.number,
        "label": spec.label() if spec else "",
        "key": repr(spec.key()) if spec else None,
        "score": metrics.score if metrics else None,
        "tokens_per_s": metrics.tokens_per_s if metrics else None,
        "speedup": metrics.speedup if metrics else None,
        "levels": [lv.model_dump(mode="json") for lv in metrics.levels] if metrics else [],
    }


def _best_per_batch(rows: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    measured = [r for r in rows if r["state"] == "COMPLETE" and "metrics" in r and r.get("duplicate_of") is None]
    return best_per_batch(measured, sizes, "number")


def _time_to_best(rows: list[dict[str, Any]], best_number: int | None) -> float | None:
    """Study seconds until the best trial completed: trials up to it, and the short gaps between them."""
    if best_number is None:
        return None
    total = 0.0
    previous_end = None
    from datetime import datetime

    for r in sorted(rows, key=lambda r: r["number"]):
        if r["started"] is None or r["completed"] is None:
            continue
        start, end = datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["completed"])
        if previous_end is not None:
            gap = (start - previous_end).total_seconds()
            if 0 < gap < MAX_GAP_S:
                total += gap
        total += (end - start).total_seconds()
        previous_end = end
        if r["number"] == best_number:
            return total
    return None


def _timings(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _split(rows: list[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, Any]:
    engine = [r for r in rows if r.get("duplicate_of") is None and r["wall_s"] is not None]
    start = sum(r.get("engine_start_s") or 0.0 for r in engine)
    warmup = sum(r.get("warmup_s") or 0.0 for r in engine)
    measured = sum(r.get("measured_s") or 0.0 for r in engine)
    trial_wall = sum(r["wall_s"] for r in rows if r["wall_s"] is not None)
    study_wall = sum(s["wall_s"] for s in steps if s.get("step") == "study")
    out: dict[str, Any] = {
        "trials_with_engine": len(engine),
        "engine_start_s": start,
        "warmup_s": warmup,
        "measured_generation_s": measured,
        "rest_of_trials_s": trial_wall - start - warmup - measured,
        "trials_wall_s": trial_wall,
    }
    if study_wall >= trial_wall > 0:
        out["study_wall_s"] = study_wall
        out["tuner_outside_trials_s"] = study_wall - trial_wall
    elif study_wall:
        # A study resumed on a fresh machine whose timings.jsonl lacks the earlier calls' lines: its trials
        # hold more time than its `study` steps, so the split would print negative shares.
        out["timings_partial_s"] = study_wall
    return out


def _compile_cache(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Compiled trials in order: start time and what the compile cache did."""
    out = []
    for r in sorted(rows, key=lambda r: r["number"]):
        if r.get("duplicate_of") is not None or not r.get("spec") or r["spec"]["enforce_eager"]:
            continue
        log = r.get("log") or {}
        out.append(
            {
                "number": r["number"],
                "label": r["label"],
                "engine_start_s": r.get("engine_start_s"),
                "compile_cache": log.get("compile_cache"),
                "compile_total_s": log.get("compile_total_s"),
                "cudagraph_capture_s": log.get("cudagraph_capture_s"),
                "init_engine_s": log.get("init_engine_s"),
            }
        )
    return out


# -- comparison ----------------------------------------------------------------------------------
def portable_key(key: str) -> str:
    """A configuration key with each model path cut to its folder name: the grid and the study may run on
    machines whose model caches differ (``/root/wide/cache`` there, ``~/.cache/specdec-tuner`` here)."""
    return re.sub(r"'/[^']*/([^'/]+)/?'", r"'\1'", key)


def compare(study_file: Path, summary: dict[str, Any], grid_path: Path) -> dict[str, Any]:
    from benchmarks import grid as grid_mod
    from tuner.study.loader import load_study

    config = load_study(study_file)
    data = _load_json(grid_path)
    g = grid_mod.summary(config, data)
    by_key = {portable_key(r["key"]): r for r in g["rows"] if "metrics" in r}
    specs = grid_mod.configurations(config)

    # Same configuration measured by both: how far apart two engines of one configuration land.
    pairs = []
    for t in summary["trials"]:
        if t["state"] != "COMPLETE" or t.get("duplicate_of") is not None or not t.get("spec") or "metrics" not in t:
            continue
        from tuner.study.spec import TrialSpec

        key = portable_key(repr(TrialSpec.model_validate(t["spec"]).key()))
        if key in by_key:
            gm = {lv["batch_size"]: lv["tokens_per_s"] for lv in by_key[key]["metrics"]["levels"]}
            sm = {lv["batch_size"]: lv["tokens_per_s"] for lv in t["metrics"]["levels"]}
            pairs.append(
                {
                    "label": t["label"],
                    "study_trial": t["number"],
                    "grid_index": by_key[key]["index"],
                    "ratio_study_over_grid": {str(b): sm[b] / gm[b] for b in sm if gm.get(b)},
                }
            )

    tuner_best = summary.get("best") or {}
    grid_best = g.get("best") or {}
    same = (
        tuner_best.get("key") is not None
        and grid_best
        and portable_key(tuner_best["key"]) == portable_key(repr(specs[grid_best["index"]].key()))
    )
    tuner_best_in_grid = by_key.get(portable_key(tuner_best.get("key") or ""))
    gap = None
    if tuner_best_in_grid is not None and grid_best:
        gap = 1.0 - tuner_best_in_grid["metrics"]["score"] / grid_best["score"]

    # The configurations the grid did not run. Lower bound: each costs at least an engine start of its
    # mode (median of every start measured, grid and study) plus the grid's median per-run remainder
    # (shutdown, process exit). Estimate: the mean wall of its kind where the grid or the study measured
    # that kind in full, else the lower bound.
    measured = {portable_key(r["key"]): r["wall_s"] for r in data["runs"] if not r.get("cut_by_deadline")}
    kinds: dict[tuple[str, bool], list[float]] = {}
    for r in data["runs"]:
        if r.get("ok"):
            kinds.setdefault((r["spec"]["candidate"], r["spec"]["enforce_eager"]), []).append(r["wall_s"])
    for t in summary["trials"]:  # kinds the grid never ran: the study's complete trials
        if t["state"] == "COMPLETE" and t.get("duplicate_of") is None and t.get("spec") and t["wall_s"]:
            kind = (t["spec"]["candidate"], t["spec"]["enforce_eager"])
            if not any(
                r.get("ok") and (r["spec"]["candidate"], r["spec"]["enforce_eager"]) == kind for r in data["runs"]
            ):
                kinds.setdefault(kind, []).append(t["wall_s"])
    starts: dict[bool, list[float]] = {True: [], False: []}
    rests: list[float] = []
    for r in g["rows"]:
        if "metrics" in r:
            m = r["metrics"]
            starts[r["spec"]["enforce_eager"]].append(m["engine_start_s"])
            rests.append(r["wall_s"] - m["engine_start_s"] - m["warmup_s"] - m["measured_s"])
    for t in summary["trials"]:
        if t.get("spec") and t.get("engine_start_s"):
            starts[t["spec"]["enforce_eager"]].append(t["engine_start_s"])
    rest = _median(rests) or 0.0
    floor_s = {eager: (_median(v) or 0.0) + rest for eager, v in starts.items()}
    lower = estimated = 0.0
    unmeasured = 0
    without_full = 0
    for spec in specs:
        if portable_key(repr(spec.key())) in measured:
            continue
        unmeasured += 1
        lower += floor_s[spec.enforce_eager]
        walls = kinds.get((spec.candidate, spec.enforce_eager))
        if walls:
            estimated += sum(walls) / len(walls)
        else:
            without_full += 1
            estimated += floor_s[spec.enforce_eager]
    study_wall = summary["split"].get("study_wall_s") or summary["split"]["trials_wall_s"]
    grid_measured = g["gpu_time_s"]
    return {
        "grid": {k: v for k, v in g.items() if k != "rows"},
        "tuner": {
            "best": tuner_best,
            "best_per_batch_size": summary.get("best_per_batch_size"),
            "trials": len(summary["trials"]),
            "gpu_time_s": study_wall,
            "time_to_best_s": summary.get("time_to_best_s"),
        },
        "same_best_configuration": bool(same),
        "tuner_best_measured_by_grid_score_gap": gap,
        "cross_engine_pairs": pairs,
        "grid_unmeasured_configs": unmeasured,
        "grid_full_lower_bound_s": grid_measured + lower,
        "grid_full_estimate_s": grid_measured + estimated,
        "grid_unmeasured_of_kinds_never_measured_in_full": without_full,
        "engine_start_median_s": {"eager" if k else "compiled": _median(v) for k, v in starts.items()},
        "run_remainder_median_s": rest,
        "tuner_over_grid_measured": study_wall / grid_measured if grid_measured else None,
        "tuner_over_grid_full_lower_bound": study_wall / (grid_measured + lower) if grid_measured + lower else None,
        "tuner_over_grid_full_estimate": study_wall / (grid_measured + estimated)
        if grid_measured + estimated
        else None,
    }


# -- markdown ------------------------------------------------------------------------------------
def _f(value: Any, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(summary: dict[str, Any], comparison: dict[str, Any] | None) -> str:
    lines = []
    sizes = sorted({lv["batch_size"] for t in summary["trials"] if "metrics" in t for lv in t["metrics"]["levels"]})
    head = ["trial", "configuration", "state"] + [f"bs{b} tok/s" for b in sizes] + [f"bs{b} speedup" for b in sizes]
    head += ["accepted", "engine start s", "compile cache", "measured s", "trial wall s", "GPU mem GiB"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for t in summary["trials"]:
        m = t.get("metrics")
        lv = {x["batch_size"]: x for x in m["levels"]} if m else {}
        state = t["state"].lower()
        if t.get("duplicate_of") is not None:
            state = f"repeat of {t['duplicate_of']}"
        elif t.get("pruned_reason"):
            state = f"pruned: {t['pruned_reason']}"
        elif t.get("failure"):
            state = f"failed: {t['failure']}"
        elif t.get("interrupted"):
            state = "interrupted: the machine went back mid-trial (retried on resume)"
        cells = [str(t["number"]), t["label"], state]
        cells += [_f(lv[b]["tokens_per_s"]) if b in lv else "-" for b in sizes]
        cells += [_f(lv[b]["speedup"], ".2f") if b in lv else "-" for b in sizes]
        acc = None
        if m and m["spec"]["draft_tokens"]:
            acc = m["spec"]["accepted_tokens"] / m["spec"]["draft_tokens"]
        mem = m.get("gpu_memory_bytes") if m else None
        log = t.get("log") or {}
        cells += [
            _f(acc * 100, ".0f") + "%" if acc is not None else "-",
            _f(t.get("engine_start_s")),
            log.get("compile_cache", "-") if t.get("spec") and not t["spec"]["enforce_eager"] else "eager",
            _f(t.get("measured_s"), ".1f"),
            _f(t.get("wall_s")),
            _f(mem / 2**30 if mem else None, ".1f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    s = summary["split"]
    lines.append("")
    lines.append("| part of the study's wall time | seconds | share |")
    lines.append("|---|---|---|")
    total = s.get("study_wall_s") or s["trials_wall_s"]
    for name, key in (
        ("engine start (vLLM import, model load, compile, CUDA graphs)", "engine_start_s"),
        ("warm-up generation", "warmup_s"),
        ("measured generation", "measured_generation_s"),
        ("rest of trials (engine shutdown, process exit, MLflow/Optuna per trial)", "rest_of_trials_s"),
        ("tuner outside trials (pre-flight checks, start-up, between trials)", "tuner_outside_trials_s"),
    ):
        if key in s:
            lines.append(f"| {name} | {s[key]:.0f} | {s[key] / total:.0%} |")
    if "timings_partial_s" in s:
        lines.append(f"| **the trials' wall time** | **{total:.0f}** | 100% |")
        lines.append(
            f"\n(the `study` steps of the timings file hold {s['timings_partial_s']:.0f} s, less than the trials:"
            " it lacks the earlier calls of a resumed study, so the tuner's time outside trials is unknown)"
        )
    else:
        lines.append(f"| **study wall time** | **{total:.0f}** | 100% |")
    if comparison:
        c = comparison
        lines.append("")
        lines.append("| | tuner | brute-force grid |")
        lines.append("|---|---|---|")
        gb = c["grid"].get("best") or {}
        lines.append(f"| best configuration | {c['tuner']['best'].get('label')} | {gb.get('label')} |")
        lines.append(
            f"| configurations measured | {c['tuner']['trials']} trials | {c['grid']['configs_measured']} of {c['grid']['configs_total']} |"
        )
        lines.append(
            f"| GPU time | {c['tuner']['gpu_time_s']:.0f} s (best found after {_f(c['tuner']['time_to_best_s'])} s) "
            f"| {c['grid']['gpu_time_s']:.0f} s measured; all {c['grid']['configs_total']}: at least {c['grid_full_lower_bound_s']:.0f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("study")
    st.add_argument("--study", type=Path, required=True)
    st.add_argument("--storage", required=True)
    st.add_argument("--workdir", type=Path, required=True)
    st.add_argument("--timings", type=Path)
    st.add_argument("--out", type=Path, required=True)
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("--study", type=Path, required=True)
    cmp_.add_argument("--summary", type=Path, required=True)
    cmp_.add_argument("--grid", type=Path, required=True)
    cmp_.add_argument("--out", type=Path, required=True)
    md = sub.add_parser("markdown")
    md.add_argument("--summary", type=Path, required=True)
    md.add_argument("--comparison", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "study":
        result = study_summary(args.study, args.storage, args.workdir, args.timings)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(markdown(result, None))
    elif args.cmd == "compare":
        result = compare(args.study, _load_json(args.summary), args.grid)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
        brief = {k: v for k, v in result.items() if k not in ("cross_engine_pairs", "tuner")}
        brief["tuner"] = {k: v for k, v in result["tuner"].items() if k != "best"}
        brief["tuner"]["best"] = (result["tuner"]["best"] or {}).get("label")
        print(json.dumps(brief, indent=1, default=str))
    else:
        comparison = _load_json(args.comparison) if args.comparison else None
        print(markdown(_load_json(args.summary), comparison))
    return 0


if __name__ == "__main__":
    sys.exit(main())
