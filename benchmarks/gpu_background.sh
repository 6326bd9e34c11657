#!/usr/bin/env bash
# gpu_session.sh steps that outlive a device call: a call lasts at most 10 minutes and a trial of the wide
# target 2-5, so a study driven call by call stops at each call's end with minutes unused (the tuner starts no
# trial it expects to overrun the call). The device keeps a process that started its own session (setsid)
# running between calls while the machine stays warm, so start the steps once and let each later call wait:
#
#   bash benchmarks/gpu_background.sh start RESULTS_DIR STEP ...   # returns at once; log: RESULTS_DIR/background.log
#   bash benchmarks/gpu_background.sh wait RESULTS_DIR SECONDS     # up to SECONDS, prints the log's new lines
#                                                                  # (vLLM's INFO/WARNING left out), copies the
#                                                                  # results to $OUT; exit 0 done, 75 still running
#
# `wait` says how long ago the log was last written: minutes of silence mean a step hangs (the head's generation
# engine did, three sessions running, before eagle3_data.generate spawned it: docs/measurement-log.md, 2026-12-07).
# Once the EAGLE-3 head is trained, the first `wait` after it also brings the head back as $OUT/head.tar.NN
# (15 MiB pieces; weights never enter the repository): keep them here in a git-ignored folder and carry them to
# the next machine as one folder of parts for HEAD_FROM, which saves that machine the head's ~600 s of training.
#
# Environment as for gpu_session.sh (RESUME_FROM, STUDY, PREPARE_ARGS, ...); leave STUDY_TIME_LIMIT_S unset.
# If the machine goes back mid-trial, the snapshot of the last `wait` holds every finished trial and the
# study retries the interrupted one when it resumes.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_names.sh"
cmd=${1:?usage: gpu_background.sh start RESULTS_DIR STEP ... | wait RESULTS_DIR SECONDS}
results=${2:?RESULTS_DIR}; shift 2
mkdir -p "$results"
log=$results/background.log

case $cmd in
  start)
    if [ -f "$results/background.pid" ] && kill -0 "$(cat "$results/background.pid")" 2>/dev/null; then
      echo "already running (pid $(cat "$results/background.pid"))" >&2; exit 1
    fi
    : > "$results/background.offset"
    # OUT belongs to this call only (emptied before the next): the steps write no results there; `wait` does.
    rm -f "$results/background.pid"
    env -u OUT setsid nohup bash -c 'echo $$ > "$1/background.pid"; bash benchmarks/gpu_session.sh "$@"
      echo "background steps exited with $?"' _ "$results" "$@" > "$log" 2>&1 < /dev/null &
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$results/background.pid" ] && break; sleep 0.5; done
    echo "started (pid $(cat "$results/background.pid")): $*" ;;
  wait)
    seconds=${1:?SECONDS}
    # No pid file: nothing was started here (`kill -0 0` would signal this shell's own group and say "alive").
    pid=$(cat "$results/background.pid" 2>/dev/null || true)
    alive() { [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
    end=$((SECONDS + seconds))
    while alive && [ $SECONDS -lt $end ]; do sleep 5; done
    offset=$(cat "$results/background.offset" 2>/dev/null || echo 0); offset=${offset:-0}
    tail -c +$((offset + 1)) "$log" | grep -av '^(\|INFO\|^\[W\|WARNING'
    wc -c < "$log" > "$results/background.offset"
    echo "log last written $(($(date +%s) - $(stat -c %Y "$log"))) s ago"
    if [ -n "${OUT:-}" ]; then
      # The study may be writing: copy each database through SQLite's backup API, never a torn file.
      for f in optuna.db mlflow.db; do
        [ -f "$results/$f" ] && python3 -c 'import sqlite3, sys
src, dst = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
src.backup(dst); dst.close()' "$results/$f" "$OUT/$f"
      done
      (cd "$results" && tar czf "$OUT/results.tgz" --ignore-failed-read \
         $(ls -d grid.json study_summary.json comparison.json machine.json timings.jsonl best.yaml serve_check.json \
              engine_check.json ./*.log runs head 2>/dev/null))
      head=${SPECDEC_TUNER_CACHE:-$results/cache}/models/$HEAD_NAME
      if [ -f "$head/specdec-tuner.json" ] && [ ! -f "$results/head.sent" ]; then
        tar cf - -C "$(dirname "$head")" "$(basename "$head")" | split -b 15m -d - "$OUT/head.tar." \
          && touch "$results/head.sent" && echo "head: $(ls "$OUT"/head.tar.* | wc -l) piece(s) in \$OUT"
      fi
    fi
    if alive; then echo "still running after ${seconds}s"; exit 75; fi
    exit 0 ;;
  *) echo "unknown command: $cmd (start or wait)" >&2; exit 2 ;;
esac
