"""Keep credentials (HF_TOKEN and the like) out of MLflow, logs and exported files."""

from __future__ import annotations

import os
import re
from typing import Any

# hf_token, HF_TOKEN, api_key, AWS_SECRET_ACCESS_KEY, db_password; not max_tokens or num_speculative_tokens.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|API_KEY|ACCESS_KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)($|_)")


# "  hf_token: abc" in YAML text (a study file logged as an artifact)
_YAML_PAIR = re.compile(r"^(\s*[\"']?([A-Za-z0-9_.-]+)[\"']?\s*:\s*)(\S.*)$", re.MULTILINE)


def is_secret_key(key: object) -> bool:
    return _SECRET_NAME.search(str(key).upper().replace("-", "_")) is not None


def redact(value: Any) -> Any:
    """Mask keys that look like credentials, and the values of credential-like environment
    variables wherever they appear in text."""
    if isinstance(value, dict):
        return {k: ("***" if is_secret_key(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        value = _YAML_PAIR.sub(lambda m: m.group(1) + ("***" if is_secret_key(m.group(2)) else m.group(3)), value)
        for name, secret in os.environ.items():
            if secret and len(secret) >= 8 and is_secret_key(name) and secret in value:
                value = value.replace(secret, "***")
    return value
