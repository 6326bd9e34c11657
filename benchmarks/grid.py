"""Brute force: measure the configurations of a study's search space one after another, the way
users tune today, for comparison with the tuner.

    python -m benchmarks.grid --study studies/smollm2-h200.yaml --list
    python -m benchmarks.grid --study studies/smollm2-h200.yaml --results OUT/grid.json
    python -m benchmarks.grid --study ... --results OUT/grid.json --only 1,19,20 --deadline-s 540
    python -m benchmarks.grid --study ... --results OUT/grid.json --summary

Configurations are numbered in the order of ``tuner.study.space.grid`` (``--list`` prints them). Each one
runs in its own engine process through the tuner's runner, so it is measured exactly as a trial is,
but with no sampler and no pruning. The results file is rewritten after every configuration; the
same command again skips what is already measured, so a grid can be spread over several sessions
(``--only`` / ``--slice`` pick configurations, ``--deadline-s`` stops starting new ones in time).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import best_per_batch
from benchmarks.vllm_log import parse_log
from tuner.engine.process import run_engine
from tuner.engine.request import EngineResult, TrialRequest
from tuner.results.scoring import apply_reference, reference_levels, score_result
from tuner.study.config import StudyConfig
from tuner.study.loader import load_study
from tuner.study.prompts import load_prompts
from tuner.study.space import grid
from tuner.study.spec import TrialSpec, llm_kwargs, resolve_model

# Expected seconds for a configuration before any of its kind was measured (engine start + measurement).
DEFAULT_EXPECTED_S = 90.0


def configurations(config: StudyConfig) -> list[TrialSpec]:
    return grid(config)


def select(total: int, only: str | None, slice_: str | None) -> list[int]:
    """Indexes to run, in the order given (``--only 3,1,2``) or ascending (``--slice 0:10``)."""
    if only:
        picked = [int(x) for x in only.replace(" ", "").split(",") if x]
    elif slice_:
        lo, _, hi = slice_.partition(":")
        picked = list(range(int(lo or 0), int(hi) if hi else total))
    else:
        picked = list(range(total))
    bad = [i for i in picked if not 0 <= i < total]
    if bad:
        raise SystemExit(f"error: configuration {bad[0]} does not exist; the grid has 0..{total - 1} (see --list)")
    return picked


def request_for(config: StudyConfig, spec: TrialSpec) -> TrialRequest:
    """The study's workload on this configuration's engine: exactly what the tuner sends a trial."""
    prompts = load_prompts(config.workload.prompts)
    if config.workload.max_prompts:
        prompts = prompts[: config.workload.max_prompts]
    kwargs = llm_kwargs(config.target, resolve_model(config.target.model), spec)
    return TrialRequest.for_study(config, prompts, kwargs)


def load_results(path: Path) -> dict[str, Any]:
    if path.is_file():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    return {"runs": [], "sessions": []}


def save_results(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def measured_keys(data: dict[str, Any]) -> set[str]:
    """Configurations with a final outcome (a run cut short by the deadline is retried)."""
    return {r["key"] for r in data["runs"] if not r.get("cut_by_deadline")}


def expected_s(data: dict[str, Any], spec: TrialSpec) -> float:
    same = [
        r
        for r in data["runs"]
        if r.get("ok") and r["spec"]["enforce_eager"] == spec.enforce_eager and r["spec"]["method"] == spec.method
    ]
    if not same:
        return DEFAULT_EXPECTED_S
    # The first engine of its kind on a fresh machine (compile-cache miss, kernel JIT: 250 s against a usual
    # 110 s for an eager one) is no guide to the next: plan with the median of the warm runs plus 20 %. The
    # maximum left 240 s of a 600 s call idle; a run cut by the deadline is retried anyway.
    warm = [r for r in same if r.get("log", {}).get("compile_cache") != "miss"]
    return 1.2 * statistics.median(r["wall_s"] for r in warm or same)


def _machine() -> dict[str, Any]:
    return {"host": platform.node(), "python": platform.python_version(), "cores": os.cpu_count()}


def run_grid(args: argparse.Namespace) -> int:
    config = load_study(args.study)
    specs = configurations(config)
    data = load_results(args.results)
    data.update(
        {
            "study": config.name,
            "study_file": str(args.study),
            "configs_total": len(specs),
            "workload": config.workload.model_dump(mode="json"),
        }
    )
    done = measured_keys(data)
    data["runs"] = [r for r in data["runs"] if r["key"] in done]  # drop runs cut short: they run again
    workdir = args.workdir or args.results.parent / "grid-runs"
    session: dict[str, Any] = {
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.grid", *sys.argv[1:]]),
        "machine": _machine(),
        "env": {k: os.environ[k] for k in ("VLLM_CACHE_ROOT", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }
    data.setdefault("sessions", []).append(session)
    started = time.monotonic()
    ran = 0
    for index in select(len(specs), args.only, args.slice):
        spec = specs[index]
        key = repr(spec.key())
        if key in done:
            continue
        elapsed = time.monotonic() - started
        timeout = config.budget.trial_timeout_s
        if args.deadline_s is not None:
            left = args.deadline_s - elapsed
            if left < expected_s(data, spec):
                print(f"[grid] deadline: {left:.0f} s left, not starting #{index} {spec.label()}", flush=True)
                session["stopped_by_deadline"] = True
                break
            timeout = min(timeout, left)
        print(f"[grid] #{index} {spec.label()} ...", flush=True)
        request = request_for(config, spec)
        run_dir = workdir / f"cfg-{index:03d}"
        when = dt.datetime.now().isoformat(timespec="seconds")
        outcome = run_engine(request, run_dir, timeout)
        record: dict[str, Any] = {
            "index": index,
            "key": key,
            "label": spec.label(),
            "spec": spec.model_dump(mode="json"),
            "llm_kwargs": request.llm_kwargs,
            "started": when,
            "wall_s": outcome.wall_s,
            "ok": outcome.ok,
            "failure": outcome.failure,
            "message": outcome.message[:1000],
            "log": parse_log(run_dir / "engine.log"),
            "result": outcome.result.model_dump(mode="json") if outcome.result else None,
        }
        if outcome.failure == "timeout" and timeout < config.budget.trial_timeout_s:
            record["cut_by_deadline"] = True
        data["runs"].append(record)
        ran += 1
        session["wall_s"] = time.monotonic() - started
        save_results(args.results, data)
        print(f"[grid] #{index} {_short(record, config)}", flush=True)
    session["wall_s"] = time.monotonic() - started
    session["configs_run"] = ran
    save_results(args.results, data)
    print_summary(config, data)
    return 0


def _short(record: dict[str, Any], config: StudyConfig) -> str:
    if not record["ok"]:
        return f"FAILED ({record['failure']}: {record['message'][:160]}) after {record['wall_s']:.0f} s"
    metrics = score_result(EngineResult.model_validate(record["result"]), config)
    levels = ", ".join(f"bs{lv.batch_size} {lv.tokens_per_s:.0f} tok/s" for lv in metrics.levels)
    acc = metrics.spec.acceptance_rate
    return (
        f"{levels}{f', {acc:.0%} accepted' if acc is not None else ''}; "
        f"start {metrics.engine_start_s:.0f} s, wall {record['wall_s']:.0f} s"
    )


# -- summary ------------------------------------------------------------------------------------
def scored_runs(config: StudyConfig, data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finished run with its metrics against the best no-speculation run of the grid."""
    results = {r["key"]: EngineResult.model_validate(r["result"]) for r in data["runs"] if r.get("ok")}
    baselines = {
        r["key"]: score_result(results[r["key"]], config)
        for r in data["runs"]
        if r.get("ok") and r["spec"]["method"] == "none"
    }
    reference = reference_levels(baselines.values())  # per batch size, the best baseline (as the tuner does)
    base_key = max(baselines, key=lambda k: apply_reference(baselines[k], reference).score, default=None)
    base_tokens = results[base_key].token_ids if base_key else None
    out = []
    for r in data["runs"]:
        if r.get("cut_by_deadline"):
            continue
        row = {k: v for k, v in r.items() if k != "result"}
        if r.get("ok"):
            metrics = score_result(results[r["key"]], config, None, base_tokens, reference=reference)
            row["metrics"] = metrics.model_dump(mode="json")
            row["is_reference"] = r["key"] == base_key
        out.append(row)
    return out


def summary(config: StudyConfig, data: dict[str, Any]) -> dict[str, Any]:
    rows = scored_runs(config, data)
    ok = [r for r in rows if "metrics" in r]
    best = max(ok, key=lambda r: r["metrics"]["score"], default=None)
    per_batch = best_per_batch(ok, config.workload.batch_sizes, "index")
    return {
        "configs_total": data.get("configs_total"),
        "configs_measured": len(rows),
        "configs_failed": sum(1 for r in rows if not r.get("ok")),
        "gpu_time_s": sum(r["wall_s"] for r in data["runs"]),
        "best": {
            "label": best["label"],
            "index": best["index"],
            "score": best["metrics"]["score"],
            "speedup": best["metrics"]["speedup"],
        }
        if best
        else None,
        "best_per_batch_size": per_batch,
        "rows": rows,
    }


def print_summary(config: StudyConfig, data: dict[str, Any]) -> None:
    s = summary(config, data)
    sizes = config.workload.batch_sizes
    head = ["#", "configuration"] + [f"bs{b} tok/s" for b in sizes] + [f"bs{b} x" for b in sizes]
    head += ["accepted", "start s", "wall s", "cache"]
    print("\n" + " | ".join(head))
    for r in sorted(s["rows"], key=lambda r: r["index"]):
        cells = [str(r["index"]), r["label"]]
        if "metrics" in r:
            m = r["metrics"]
            lv = {x["batch_size"]: x for x in m["levels"]}
            cells += [f"{lv[b]['tokens_per_s']:.0f}" if b in lv else "-" for b in sizes]
            cells += [f"{lv[b]['speedup']:.2f}" if b in lv and lv[b]["speedup"] else "-" for b in sizes]
            acc = m["spec"]["accepted_tokens"] / m["spec"]["draft_tokens"] if m["spec"]["draft_tokens"] else None
            cells += [f"{acc:.0%}" if acc is not None else "-", f"{m['engine_start_s']:.0f}"]
        else:
            cells += ["-"] * (2 * len(sizes)) + [f"FAILED {r['failure']}", "-"]
        cells += [f"{r['wall_s']:.0f}", str(r.get("log", {}).get("compile_cache", "-"))]
        print(" | ".join(cells))
    print(
        f"\n{s['configs_measured']} of {s['configs_total']} configurations measured "
        f"({s['configs_failed']} failed), {s['gpu_time_s']:.0f} s of engine time"
    )
    if s["best"]:
        print(f"best: #{s['best']['index']} {s['best']['label']} (score {s['best']['score']:.1f})")
    for bs, b in s["best_per_batch_size"].items():
        print(f"best at batch {bs}: #{b['index']} {b['label']}: {b['tokens_per_s']:.0f} tok/s ({b['speedup']:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, required=True)
    parser.add_argument("--results", type=Path, help="JSON file the results are appended to (resumable)")
    parser.add_argument("--workdir", type=Path, help="engine logs (default: grid-runs/ beside the results)")
    parser.add_argument("--only", help="comma-separated configuration numbers, run in this order")
    parser.add_argument("--slice", help="A:B, configuration numbers A..B-1")
    parser.add_argument(
        "--deadline-s", type=float, help="start no configuration that would end after this many seconds"
    )
    parser.add_argument("--list", action="store_true", help="print the numbered configurations and exit")
    parser.add_argument("--summary", action="store_true", help="print the table of --results and exit")
    args = parser.parse_args(argv)
    if args.list:
        config = load_study(args.study)
        for i, spec in enumerate(configurations(config)):
            print(f"{i:3d}  {spec.label()}")
        return 0
    if args.results is None:
        parser.error("--results is required (except with --list)")
    if args.summary:
        print_summary(load_study(args.study), load_results(args.results))
        return 0
    return run_grid(args)


if __name__ == "__main__":
    sys.exit(main())
