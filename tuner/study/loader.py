"""Read and validate a study file; every problem becomes one UserError line naming the field and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tuner.errors import UserError
from tuner.study.config import StudyConfig


def load_study(path: str | Path) -> StudyConfig:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--study: {path} does not exist; fix: pass the path of a study YAML file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UserError(
            f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)}); fix: correct the syntax"
        ) from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of study settings; fix: see studies/smollm2-cpu.yaml")
    try:
        study = StudyConfig.model_validate(raw)
    except ValidationError as exc:
        raise UserError(f"{path}: {describe_validation_error(exc, StudyConfig)}") from None
    prompts = study.workload.prompts
    if not prompts.is_absolute():
        prompts = (path.parent / prompts).resolve()
    workload = study.workload.model_copy(update={"prompts": prompts})
    return study.model_copy(update={"workload": workload})


def describe_validation_error(exc: ValidationError, root: type[BaseModel]) -> str:
    """The first error, as ``field.path: problem; fix: ...``."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    field = ".".join(loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, err["loc"][:-1])
        guess = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f"did you mean '{guess[0]}'?" if guess else f"allowed keys: {', '.join(sorted(allowed))}"
        return f"{field}: unknown key; fix: remove it or correct the spelling ({hint})"
    if kind == "missing":
        return f"{field}: required; fix: add it"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if "fix:" not in msg:
        value = err.get("input")
        shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
        msg = f"{msg} (got {shown}); fix: correct the value"
    return f"{field}: {msg}"


def _allowed_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _inner_model(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _inner_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
