#!/usr/bin/env bash
# One device call on the offline H200 (see docs/benchmarks.md, "Running on the H200"): install the offline
# bundle once per machine, then run gpu_study.sh steps on a results folder that lives as long as the machine,
# and copy the results files to $OUT so they come back (optuna.db and mlflow.db too: a study that needs
# more than one session resumes from them, copied back into RESULTS_DIR before its next `study` step).
#
#   bash benchmarks/gpu_session.sh RESULTS_DIR STEP ...
#
# Needs /root/stash (the bundle's parts, copied there by earlier calls) and .bundle/tools/install_offline_bundle.sh
# (a copy of ../shared/gpu/install_offline_bundle.sh, carried). Environment as for gpu_study.sh
# (STUDY, PREPARE_ARGS, GRID_ONLY, GRID_DEADLINE_S, STUDY_TIME_LIMIT_S, N_TRIALS).
set -uo pipefail
results=${1:?usage: gpu_session.sh RESULTS_DIR STEP ...}; shift
[ -d /root/stash ] || { echo "no /root/stash: the machine went cold; send the bundle's parts again" >&2; exit 3; }
if [ ! -d /tmp/site/vllm ]; then
  bash .bundle/tools/install_offline_bundle.sh /root/stash || exit 3
fi
export PYTHONPATH=/tmp/site SPECDEC_TUNER_GGUF=${SPECDEC_TUNER_GGUF:-$(ls /root/bundle/model/*.gguf | head -n 1)}
bash benchmarks/gpu_study.sh "$results" "$@"
rc=$?
if [ -n "${OUT:-}" ]; then
  for f in grid.json study_summary.json comparison.json machine.json timings.jsonl best.yaml optuna.db mlflow.db; do
    [ -f "$results/$f" ] && cp "$results/$f" "$OUT/"
  done
fi
exit $rc
