#!/usr/bin/env bash
# One device call on the offline H200 (see docs/measurement-log.md, section GPU, its commands): install the offline
# bundle once per machine, then run gpu_study.sh steps on a results folder that lives as long as the machine,
# and copy the results files to $OUT so they come back (optuna.db and mlflow.db too: a study that needs
# more than one session resumes from them, copied back into RESULTS_DIR before its next `study` step).
#
#   bash benchmarks/gpu_session.sh RESULTS_DIR STEP ...
#
# Needs /root/stash (the bundle's parts, copied there by earlier calls) and .bundle/tools/install_offline_bundle.sh
# (a copy of ../shared/gpu/install_offline_bundle.sh, carried). Environment as for gpu_study.sh
# (STUDY, PREPARE_ARGS, GRID_ONLY, GRID_DEADLINE_S, STUDY_TIME_LIMIT_S, N_TRIALS), and RESUME_FROM: a folder
# of the tree (committed results of an earlier session) whose optuna.db, mlflow.db, timings.jsonl and grid.json start
# RESULTS_DIR when it has none, so the study resumes on a fresh machine and its summary splits the whole
# study's wall time (not only this machine's part). Back here, replace the committed timings.jsonl with the
# returned one: it holds the earlier lines.
set -uo pipefail
results=${1:?usage: gpu_session.sh RESULTS_DIR STEP ...}; shift
if [ -n "${RESUME_FROM:-}" ]; then
  mkdir -p "$results"
  for f in optuna.db mlflow.db timings.jsonl grid.json; do
    if [ ! -f "$results/$f" ] && [ -f "$RESUME_FROM/$f" ]; then cp "$RESUME_FROM/$f" "$results/" && echo "resumed $f from $RESUME_FROM" >&2; fi
  done
fi
[ -d /root/stash ] || { echo "no /root/stash: the machine went cold; send the bundle's parts again" >&2; exit 3; }
if [ ! -d /tmp/site/vllm ]; then
  bash .bundle/tools/install_offline_bundle.sh /root/stash || exit 3
fi
export PYTHONPATH=/tmp/site SPECDEC_TUNER_GGUF=${SPECDEC_TUNER_GGUF:-$(ls /root/bundle/model/*.gguf | head -n 1)}
# The EAGLE-3 trainer (prepare-demo --eagle3 --device cuda) runs in the bundle's Python: speculators and its
# three wheels are in /tmp/site beside vLLM (requirements/eagle3-train-gpu.txt).
export SPECDEC_TUNER_TRAIN_PYTHON=${SPECDEC_TUNER_TRAIN_PYTHON:-$(command -v python3)}
bash benchmarks/gpu_study.sh "$results" "$@"
rc=$?
if [ -n "${OUT:-}" ]; then
  # A call brings back at most 8 files: the two databases (a later session resumes from them) and one
  # archive of the rest, the trials' engine logs and progress files included (`gpu_report study` reads them).
  for f in optuna.db mlflow.db; do
    [ -f "$results/$f" ] && cp "$results/$f" "$OUT/"
  done
  (cd "$results" && tar czf "$OUT/results.tgz" --ignore-failed-read \
     $(ls -d grid.json study_summary.json comparison.json machine.json timings.jsonl best.yaml serve_check.json \
          engine_check.json ./*.log runs 2>/dev/null))
fi
exit $rc
