"""The exported file, read back through vLLM's own parser, reproduces the measured engine arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tuner.outputs.export import serve_config

MEASURED: dict[str, Any] = {
    "model": "/models/SmolLM2-135M-Instruct",
    "dtype": "float32",
    "seed": 0,
    "trust_remote_code": False,
    "enforce_eager": False,
    "disable_log_stats": False,
    "max_model_len": 512,
    "kv_cache_memory_bytes": 1073741824,
    "enable_prefix_caching": False,  # vLLM's default is on (None, resolved to true)
    "enable_chunked_prefill": True,
    "speculative_config": {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    },
}


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "best.yaml"
    path.write_text("# header\n" + yaml.safe_dump(serve_config(MEASURED), sort_keys=False))
    return path


def test_every_measured_argument_survives_vllms_parser(tmp_path: Path) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    path = _write(tmp_path)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(["--config", str(path)]))
    for key, value in MEASURED.items():
        assert getattr(engine_args, key) == value, key


def test_vllm_serve_parser_reads_false_booleans(tmp_path: Path) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.26
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    top = FlexibleArgumentParser(prog="vllm")
    make_arg_parser(top.add_subparsers(dest="subparser").add_parser("serve"))
    args = top.parse_args(["serve", "--config", str(_write(tmp_path))])
    assert args.enable_prefix_caching is False and args.enforce_eager is False
    assert args.speculative_config == MEASURED["speculative_config"]


def test_no_top_level_false_for_vllm_026() -> None:
    """vLLM 0.26.0's config-file loader drops `key: false` without a word: the file never relies on it."""
    config = serve_config(MEASURED)
    assert not [k for k, v in config.items() if v is False]
    assert config["no-enable-prefix-caching"] is True and config["no-enforce-eager"] is True
