"""Hugging Face hub ids (``org/name``) as local folders for the checks that run before any engine: the
config and tokenizer files only, from the local cache first; ``HF_HUB_OFFLINE`` is honoured (by
``huggingface_hub`` itself)."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.errors import UserError

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


def local_path_missing(model: str) -> bool:
    """True for a path-like model reference that does not exist (hub ids are not checked)."""
    looks_local = model.startswith(("/", ".", "~")) or Path(model).exists()
    return looks_local and not Path(model).expanduser().exists()


class HubModelMissing(UserError):
    """A hub id that no engine on this machine could load either: offline and not cached, or not on the hub."""


def local_checkpoint(model: str) -> str | None:
    """A local folder holding the model's config (and tokenizer) files: the path itself, or the hub id's
    snapshot (cached, else downloaded unless offline). None when the hub cannot be reached now (the engine
    may fare better); :class:`HubModelMissing` when the engine would fail on it too."""
    if not is_hub_id(model):
        return model
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return str(snapshot_download(model, allow_patterns=CHECK_FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:  # vLLM reads the same variable: its engine would not find it either
            raise HubModelMissing(
                f"{model} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                f"allows nothing else; fix: download it first (`hf download {model}`) or unset HF_HUB_OFFLINE"
            ) from None
    try:
        return str(snapshot_download(model, allow_patterns=CHECK_FILES))
    except RepositoryNotFoundError:  # gated repositories too: the engine would use the same token
        raise HubModelMissing(
            f"{model} is not on the Hugging Face hub, or is gated and this machine's token has no access; "
            "fix: check the id, or log in with a token that can read it (`hf auth login`)"
        ) from None
    # No network, a server error, a timeout (httpx's errors are not the hub's): the engine will say.
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError, RuntimeError):
        return None


def model_folder(field: str, model: str, fix: str) -> str | None:
    """``local_checkpoint`` of a model the user named in ``field``: a UserError naming the field for a path
    that does not exist (``fix`` says what to give) or a hub id that no engine here could load."""
    if local_path_missing(model):
        raise UserError(f"{field}: {model} does not exist; fix: {fix}")
    try:
        return local_checkpoint(model)
    except HubModelMissing as exc:
        raise UserError(f"{field}: {exc}") from None
