#!/usr/bin/env bash
# Install and run every check: lint, types, unit tests and the real-engine tests (CPU vLLM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-cpu.sh
bash scripts/install-services.sh
.venv/bin/ruff check tuner tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
