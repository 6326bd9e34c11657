#!/usr/bin/env bash
# Install the pinned CPU environment (vLLM CPU build, torch 2.13.0+cpu, Optuna, MLflow, ...) into .venv.
# Idempotent: does nothing when requirements/cpu.lock and pyproject.toml are unchanged since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SPECDEC_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.specdec-lock.sha256"
want=$(cat requirements/cpu.lock pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  # --no-deps: the lock is the whole environment; nothing else (torchvision & co.) may creep in.
  "$venv/bin/pip" install -q --progress-bar off --no-deps -r requirements/cpu.lock
  "$venv/bin/pip" install -q --progress-bar off --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
"$venv/bin/python" -c "import vllm, torch, optuna, mlflow; print('environment ready: vllm', vllm.__version__, 'torch', torch.__version__)" 2>/dev/null | tail -n 1
