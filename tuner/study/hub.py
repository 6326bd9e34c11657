"""Hugging Face hub ids (``org/name``) as local folders for the checks that run before any engine: the
config and tokenizer files only, from the local cache first; ``HF_HUB_OFFLINE`` is honoured (by
``huggingface_hub`` itself)."""

from __future__ import annotations

import re
from pathlib import Path

# What the pair and head checks read; weights stay on the hub (a head's safetensors are read when cached).
CHECK_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
]
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_hub_id(model: str) -> bool:
    return bool(HUB_ID.match(model)) and not Path(model).exists()


def local_checkpoint(model: str) -> str | None:
    """A local folder holding the model's config (and tokenizer) files: the path itself, or the hub id's
    snapshot (cached, else downloaded unless offline); None when a hub id cannot be had."""
    if not is_hub_id(model):
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return str(snapshot_download(model, allow_patterns=CHECK_FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    try:
        return str(snapshot_download(model, allow_patterns=CHECK_FILES))
    # Offline, unknown, gated, or no network (httpx's errors are not the hub's): the engine will say.
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError, RuntimeError):
        return None
