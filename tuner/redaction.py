"""Keep credentials (HF_TOKEN, database passwords and the like) out of MLflow, logs and exported files."""

from __future__ import annotations

import os
import re
from typing import Any

# hf_token, HF_TOKEN, api_key, AWS_SECRET_ACCESS_KEY, db_password; not max_tokens or num_speculative_tokens.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|API_KEY|ACCESS_KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)")


# "  hf_token: abc" in YAML text (a study file logged as an artifact)
_YAML_PAIR = re.compile(r"^(\s*[\"']?([A-Za-z0-9_.-]+)[\"']?\s*:\s*)(\S.*)$", re.MULTILINE)

# "postgresql+psycopg2://user:password@host/db": the password runs to the last "@" of the URL (an
# unescaped "@" in a password is still masked whole).
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^\s/:@'\"]*):([^\s'\"]*)@")
# "...?password=x&sslmode=require"
_URL_QUERY = re.compile(r"([?&;])([A-Za-z0-9_.-]+)=([^&;\s'\"]*)")


def is_secret_key(key: object) -> bool:
    return _SECRET_NAME.search(str(key).upper().replace("-", "_")) is not None


def mask_url(text: str) -> str:
    """URLs (a storage URL, a tracking URI, or text that contains them) with their passwords masked:
    ``postgresql://u:***@host/db``. The one place the tuner does this; use it wherever a URL is
    printed, logged or stored."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", text)
    return _URL_QUERY.sub(
        lambda m: m.group(0) if not is_secret_key(m.group(2)) else f"{m.group(1)}{m.group(2)}=***", text
    )


def redact(value: Any) -> Any:
    """Mask keys that look like credentials, passwords in URLs, and the values of credential-like
    environment variables wherever they appear in text."""
    if isinstance(value, dict):
        return {k: ("***" if is_secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        value = _YAML_PAIR.sub(lambda m: m.group(1) + ("***" if is_secret_key(m.group(2)) else m.group(3)), value)
        value = mask_url(value)
        for name, secret in os.environ.items():
            if secret and len(secret) >= 8 and is_secret_key(name) and secret in value:
                value = value.replace(secret, "***")
    return value
