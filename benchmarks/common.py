"""Shared plumbing for the benchmark scripts: study overrides, machine description, JSON output."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tuner.engine.hardware import cpu_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def load_with_overrides(study_path: Path, overrides: list[str], workdir: Path, name: str) -> Path:
    """Copy a study file into ``workdir`` with ``a.b=value`` overrides (YAML values) and local storage."""
    data = yaml.safe_load(study_path.read_text())
    prompts = Path(data["workload"]["prompts"])
    if not prompts.is_absolute():
        data["workload"]["prompts"] = str((study_path.parent / prompts).resolve())
    for item in overrides:
        key, _, raw = item.partition("=")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    data["name"] = name
    data["storage"] = f"sqlite:///{workdir / 'optuna.db'}"
    data["tracking"] = {"uri": f"sqlite:///{workdir / 'mlflow.db'}", "experiment": name}
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        import torch
        import vllm

        info["vllm"] = vllm.__version__
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def small_engine(model: str, dtype: str, spec: dict[str, Any] | None, **more: Any) -> Any:
    """The eager vLLM engine of the benchmarks that read outputs and counters (eagle3_head, lossless_dtype):
    1,024 tokens, seed 0, 1 GiB of KV cache."""
    from vllm import LLM

    return LLM(
        model=model,
        dtype=dtype,  # type: ignore[arg-type]
        max_model_len=1024,
        seed=0,
        enforce_eager=True,
        kv_cache_memory_bytes=2**30,
        speculative_config=spec,
        **more,
    )


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M")
    path = RESULTS / f"{name}-{stamp}.json"
    payload = {
        "benchmark": name,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def write_result_to(out_dir: Path, kind: str, benchmark: str, module: str, payload: dict[str, Any]) -> Path:
    """``out_dir/KIND-YYYYmmdd-HHMMSS.json``: what ran (benchmark, date, command, commit, machine), then the
    payload."""
    out_dir.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now()
    path = out_dir / f"{kind}-{now.strftime('%Y%m%d-%H%M%S')}.json"
    header = {
        "benchmark": benchmark,
        "date": now.isoformat(timespec="seconds"),
        "command": " ".join(["python", "-m", module, *sys.argv[1:]]),
        "git": git_revision(),
        "machine": machine(),
    }
    path.write_text(json.dumps({**header, **payload}, indent=1) + "\n")
    return path


def git_revision() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def best_per_batch(rows: list[dict[str, Any]], sizes: list[int], id_key: str) -> dict[str, Any]:
    """Per batch size, the row (with ``metrics``) whose level there scored highest, by its ``id_key``."""
    out: dict[str, Any] = {}
    for bs in sizes:
        cands = [(r, lv) for r in rows for lv in r["metrics"]["levels"] if lv["batch_size"] == bs]
        if cands:
            r, lv = max(cands, key=lambda x: x[1]["score"])
            out[str(bs)] = {
                id_key: r[id_key],
                "label": r["label"],
                "tokens_per_s": lv["tokens_per_s"],
                "speedup": lv["speedup"],
            }
    return out
