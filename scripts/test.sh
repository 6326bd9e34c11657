#!/usr/bin/env bash
# Install and run every check: lint, types, unit tests and the real-engine tests (CPU vLLM).
#   bash scripts/test.sh            everything; pytest as two processes side by side (below)
#   bash scripts/test.sh ARGS...    one pytest with these arguments (a file, -k, -m "not engine", ...)
# A CPU vLLM engine computes on one core, so on a machine with two or more cores pytest runs as two
# processes, each pinned to half of the cores, and each engine keeps a core to itself: [a] the tests that
# share the session's real study (tests/conftest.py: real_study), the worker tests and the fake-engine search
# tests, about half of the time (2026-12-04, other work on the machine: [a] 1,414 s and [b] 1,535 s side by
# side, the search tests 125 s of [b]); [b] every other test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv is installed without byte-code (pip --no-compile) and this machine's environment sets
# PYTHONDONTWRITEBYTECODE=1: then every Python process compiled torch, vLLM and MLflow again (`from vllm
# import LLM` 32 s against 13 s from cached byte-code). Unset, each module is compiled once, on its first
# import, starting with install-cpu.sh's import check (tests/conftest.py unsets it for pytest run any way).
unset PYTHONDONTWRITEBYTECODE
bash scripts/install-cpu.sh
bash scripts/install-services.sh
.venv/bin/ruff check tuner tests benchmarks
.venv/bin/ruff format --check tuner tests benchmarks
.venv/bin/mypy
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
read -r CORES_A CORES_B < <(.venv/bin/python -c '
import os
cpus = sorted(os.sched_getaffinity(0))
half = len(cpus) // 2
print(",".join(map(str, cpus[:half])) or "-", ",".join(map(str, cpus[half:])))')
if [ "$CORES_A" = "-" ] || ! command -v taskset > /dev/null; then
  exec .venv/bin/python -m pytest
fi
# Built once here: two pytest processes would otherwise both build the demo models at the same time.
.venv/bin/python -m tuner models prepare-demo
A=(tests/test_engine_study.py tests/test_schedule_engine.py tests/test_interrupt.py tests/test_engine_failures.py
   tests/test_workers.py tests/test_search_fake.py)
B=()
for f in "${A[@]}"; do B+=(--ignore "$f"); done
tmp=$(mktemp -d)
run() {  # name cores pytest-args...: one pytest on its cores, each output line prefixed with its name
  local name=$1 cores=$2
  shift 2
  taskset -c "$cores" .venv/bin/python -m pytest -p no:cacheprovider --basetemp "$tmp/$name" "$@" 2>&1 \
    | sed -u "s/^/[$name] /"
}
echo "pytest in two processes: [a] on cores $CORES_A (${A[*]}), [b] on cores $CORES_B (every other test)"
run a "$CORES_A" "${A[@]}" &
a=$!
run b "$CORES_B" "${B[@]}" &
b=$!
status=0
wait $a || status=$?
wait $b || status=$?
exit $status
