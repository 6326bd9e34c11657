"""The body of a ``vllm serve --config FILE`` file, from a trial's ``vllm.LLM`` keyword arguments.

Export writes it under its header comments, and serve mode starts each trial's server from it, so
the exported file is exactly what was measured. No heavy imports: the trial's engine process uses it.
"""

from __future__ import annotations

from typing import Any

import yaml

from tuner.redaction import is_secret_key


def serve_config(llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments -> ``vllm serve`` config keys (dashes), every measured value kept.

    Credentials (``hf_token`` and the like) are left out: set them in the serving environment.
    """
    out: dict[str, Any] = {}
    for key, value in llm_kwargs.items():
        if key in ("disable_log_stats",) or is_secret_key(key):
            continue
        flag = key.replace("_", "-")
        if value is False:
            # vLLM 0.26.0's FlexibleArgumentParser.load_config_file drops `key: false` silently (only
            # true becomes `--key`), so a flag whose default is true or None (enable_prefix_caching)
            # would be served as its default; 0.32 turns false into `--no-key`. Writing `no-key: true`
            # becomes `--no-key` in both: vLLM's engine booleans are BooleanOptionalAction flags.
            out[f"no-{flag}"] = True
            continue
        out[flag] = value
    return out


def serve_yaml(llm_kwargs: dict[str, Any]) -> str:
    return yaml.safe_dump(serve_config(llm_kwargs), sort_keys=False, default_flow_style=False)
