#!/usr/bin/env bash
# One fresh-clone run of the demo, recorded:  bash benchmarks/demo_fresh.sh TAG
#
# Clones this checkout's HEAD (commit it first: uncommitted changes are not measured) into a temporary
# directory and runs `/usr/bin/time -v bash scripts/demo.sh` there with an empty model cache
# (SPECDEC_TUNER_CACHE), so the install into the clone's .venv and the model build are timed as a new
# user meets them. Writes benchmarks/results/demo-YYYYMMDD-TAG/: console.txt (with the time -v
# footer), summary.json (benchmarks/demo_summary.py: trials, confirmation, decision, seconds per
# phase and per engine, the machine's load average while it ran), best.yaml. The clone is left under /tmp for inspection; its path is printed at the end.
set -euo pipefail
tag=${1:?usage: bash benchmarks/demo_fresh.sh TAG}
repo=$(cd "$(dirname "$0")/.." && pwd)
out="$repo/benchmarks/results/demo-$(date -u +%Y%m%d)-$tag"
if [ -e "$out" ]; then
  echo "error: $out exists; fix: pick another TAG" >&2
  exit 2
fi
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "warning: uncommitted changes in $repo are not in the measured clone (it runs HEAD)" >&2
fi
commit=$(git -C "$repo" rev-parse HEAD)
tmp=$(mktemp -d /tmp/demo-fresh-XXXXXX)
git clone -q --no-checkout "$repo" "$tmp/clone"
git -C "$tmp/clone" checkout -q --detach "$commit"
log="$tmp/console.txt"
echo "demo_fresh: $commit in $tmp/clone, started $(date -u +%FT%TZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
# The 1-minute load average every 30 s: the demo itself accounts for about 2 on 2 cores; more is other work.
(while sleep 30; do cut -d' ' -f1 /proc/loadavg; done) >"$tmp/load.txt" &
sampler=$!
rc=0
(
  cd "$tmp/clone"
  export SPECDEC_TUNER_CACHE="$tmp/cache"
  /usr/bin/time -v bash scripts/demo.sh
) >>"$log" 2>&1 || rc=$?
kill "$sampler" 2>/dev/null || true
echo "demo_fresh: exit $rc, ended $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
tail -n 30 "$log" | grep -E "^demo:|Elapsed" || true
if [ "$rc" -ne 0 ]; then
  echo "error: the demo failed (exit $rc); see $log" >&2
  exit "$rc"
fi
# The clone's own venv runs the summary: the study's storage is read by the Optuna it was written with.
(cd "$repo" && PYTHONPATH="$repo" "$tmp/clone/.venv/bin/python" -m benchmarks.demo_summary \
  --run-dir "$tmp/clone" --log "$log" --load "$tmp/load.txt" --out "$out")
echo "clone kept at $tmp (remove it when done)"
