#!/usr/bin/env bash
# Headless Chromium (Debian's package) for the MLflow UI browser test (tests/test_mlflow_ui.py).
# Idempotent: installs nothing when `chromium` is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "installing chromium (for the MLflow UI browser test)"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium >/dev/null
