"""The body of a ``vllm serve --config FILE`` file, from a trial's ``vllm.LLM`` keyword arguments.

Export writes it under its header comments, and serve mode starts each trial's server from it, so
the exported file is exactly what was measured. No heavy imports: the trial's engine process uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from tuner.redaction import is_secret_key

# Engine arguments whose defaults vLLM resolves by who builds the engine: ``vllm.LLM`` and ``vllm serve``
# differ (vLLM 0.32 CPU: max_num_seqs 256 vs 128, max_num_batched_tokens 4096 vs 2048; an H200: 16384 vs 8192
# tokens), so a served file that leaves them out would not run the engine an offline trial measured.
RESOLVED_ARGS = ("max_num_seqs", "max_num_batched_tokens")


def pin_resolved(llm_kwargs: Mapping[str, Any], resolved: Mapping[str, int]) -> dict[str, Any]:
    """``llm_kwargs`` with each ``resolved`` value (``EngineResult.resolved_args``) added where the arguments
    leave it unset, so that ``vllm serve`` runs the values the measured engine ran with; set ones are kept."""
    pinned = dict(llm_kwargs)
    for key, value in resolved.items():
        if pinned.get(key) is None:
            pinned[key] = value
    return pinned


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


class _Dumper(yaml.SafeDumper):
    """Block style, except that a list of numbers stays on one line: ``- [1, 3, 3]`` for a schedule's range."""


def _sequence(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    numbers = bool(data) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=numbers)


_Dumper.add_representer(list, _sequence)


def serve_yaml(llm_kwargs: dict[str, Any]) -> str:
    return yaml.dump(serve_config(llm_kwargs), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
