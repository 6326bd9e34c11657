#!/usr/bin/env bash
# Install the system services some tests need (each script in scripts/services/ installs one:
# PostgreSQL, Chromium, ...). Idempotent; tests start and stop the services themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
for script in scripts/services/*.sh; do
  [ -e "$script" ] || continue
  bash "$script"
done
