"""The workload's prompt file: JSONL, one prompt a line, chat messages or raw text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import UserError


class Prompt(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    messages: list[dict[str, str]] | None = None
    text: str | None = None
    tags: list[str] = Field(default_factory=list)


def load_prompts(path: Path, field: str = "workload.prompts") -> list[Prompt]:
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise UserError(f"{field}: {path} {what}; fix: point it at a JSONL prompt file")
    prompts: list[Prompt] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        prompts.append(_parse_line(line, number, path, field))
    if not prompts:
        raise UserError(f"{field}: {path} has no prompts; fix: add one JSON object a line")
    return prompts


def _parse_line(line: str, number: int, path: Path, field: str) -> Prompt:
    where = f"{field}: {path} line {number}"
    try:
        data: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg}); fix: one JSON object a line") from None
    if isinstance(data, str):
        data = {"text": data}
    if not isinstance(data, dict):
        raise UserError(f'{where}: expected an object; fix: use {{"messages": [...]}} or {{"prompt": "..."}}')
    text = data.get("prompt", data.get("text"))
    messages = data.get("messages")
    if (text is None) == (messages is None):
        raise UserError(f"{where}: give exactly one of 'messages' or 'prompt'; fix: correct the line")
    if messages is not None and not _valid_messages(messages):
        raise UserError(
            f"{where}: 'messages' must be a non-empty list of {{role, content}} strings; fix: correct the line"
        )
    if text is not None and (not isinstance(text, str) or not text):
        raise UserError(f"{where}: 'prompt' must be a non-empty string; fix: correct the line")
    tags = data.get("tags", [])
    return Prompt(id=str(data.get("id", number)), messages=messages, text=text, tags=tags)


def _valid_messages(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )
