#!/usr/bin/env bash
# The H200 study end to end, on a GPU host where vLLM (0.32.0 since issue 27; 0.26.0 before) and the project's
# dependencies are installed (offline hosts: benchmarks/gpu_bundle.sh builds the bundle, then
# install_offline_bundle.sh; docs/measurement-log.md, sections GPU and issue 27, have the exact commands).
#
#   bash benchmarks/gpu_study.sh OUTDIR [STEP ...]
#
# STEPs, by default all of them in this order:
#   check    python, torch, GPU and vLLM versions            -> OUTDIR/machine.json
#            (first a driver too old for torch's CUDA ends the run in one line: benchmarks/cuda_driver.py)
#   prepare  python -m tuner models prepare-demo (from the packaged GGUF; SPECDEC_TUNER_GGUF overrides)
#   study    python -m tuner optimize, Optuna and MLflow in SQLite files under OUTDIR
#            (running it again resumes the study up to its budget)
#   export   the best configuration                          -> OUTDIR/best.yaml
#   serve    vllm serve --config OUTDIR/best.yaml, one completion, stop -> OUTDIR/serve_check.json
#            (if the server cannot start: vllm.LLM built from the file -> OUTDIR/engine_check.json)
#   summary  per-trial table and wall-time split             -> OUTDIR/study_summary.json
# and three steps that run only when named:
#   head     the prepared EAGLE-3 head: its marker, its training record, its weights' sha256 and its acceptance
#            at k=3 with vLLM in bfloat16 (benchmarks/eagle3_head.py record and measure; weights never enter
#            the repository)                   -> OUTDIR/head/ (head.json, training.json, head.sha256, measure-*.json)
#   grid     the same search space by brute force, one configuration after another (benchmarks/grid.py;
#            GRID_ONLY=3,1,2 picks and orders configurations, GRID_DEADLINE_S stops in time; resumes)
#                                                            -> OUTDIR/grid.json
#   compare  which configuration each found best, GPU time of each -> OUTDIR/comparison.json
# Every step appends its wall time to OUTDIR/timings.jsonl.
#
# Environment: PYTHON (python3), STUDY (studies/smollm2-h200.yaml), PREPARE_ARGS (e.g. --wide for
# studies/wide-h200.yaml), HEAD_FROM (benchmarks/gpu_head_bundle.sh's parts on the host), N_TRIALS (default: the study's
# budget.trials), STUDY_TIME_LIMIT_S (whole seconds: the tuner's --timeout, so the study starts no trial it
# expects to overrun them and exits 75; timeout(1) kills it 30 s later as a backstop; it resumes next time),
# SPECDEC_TUNER_CACHE (default OUTDIR/cache), VLLM_CACHE_ROOT (default OUTDIR/vllm-cache, so a fresh
# OUTDIR starts with a cold compile cache), SERVE_PORT (8011), SERVE_TIMEOUT_S (300).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_names.sh"
[ $# -ge 1 ] || { sed -n '2,33p' "$0"; exit 2; }
OUT=$(mkdir -p "$1" && cd "$1" && pwd); shift
STEPS=${*:-check prepare study export serve summary}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
STUDY=$(realpath "${STUDY:-$REPO/studies/smollm2-h200.yaml}")
STORAGE="sqlite:///$OUT/optuna.db"
TRACKING="sqlite:///$OUT/mlflow.db"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export SPECDEC_TUNER_CACHE=${SPECDEC_TUNER_CACHE:-$OUT/cache}
export VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-$OUT/vllm-cache}
# Offline host: never wait on the Hugging Face hub or usage reporting.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
cd "$OUT" || exit 1  # MLflow puts artifacts in ./mlruns beside its SQLite store

now() { date +%s.%N; }
record() {  # step rc started
  "$PY" -c 'import json,sys,time; print(json.dumps({"step": sys.argv[1], "rc": int(sys.argv[2]),
    "wall_s": round(time.time() - float(sys.argv[3]), 2), "started": float(sys.argv[3])}))' "$1" "$2" "$3" \
    >> "$OUT/timings.jsonl"
}

step_check() {
  "$PY" -m benchmarks.cuda_driver || return 1
  "$PY" - "$OUT/machine.json" <<'EOF'
import json, platform, subprocess, sys
import torch, vllm
info = {"python": platform.python_version(), "torch": torch.__version__, "vllm": vllm.__version__,
        "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                         "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
except OSError:
    pass
try:
    info["cpu"] = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
except (OSError, StopIteration):
    pass
import os
info["cores"] = os.cpu_count()
for name in ("optuna", "mlflow", "transformers"):
    try:
        info[name] = __import__(name).__version__
    except Exception as exc:  # noqa: BLE001
        info[name] = f"missing: {exc}"
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
print(json.dumps(info))
EOF
}

step_prepare() {
  # HEAD_FROM: a folder of benchmarks/gpu_head_bundle.sh parts (a head trained on an earlier machine).
  local models=$SPECDEC_TUNER_CACHE/models
  if [ -n "${HEAD_FROM:-}" ] && [ ! -f "$models/$HEAD_NAME/specdec-tuner.json" ]; then
    mkdir -p "$models" && cat "$HEAD_FROM"/head.tar.* | tar xf - -C "$models" || return 1
    echo "head from $HEAD_FROM: $(sha256sum "$models/$HEAD_NAME/model.safetensors" | cut -c1-16)"
    touch "$OUT/head.sent"  # gpu_background.sh's wait: the head came from the other side, do not send it back
  fi
  "$PY" -m tuner models prepare-demo ${PREPARE_ARGS:-}
}

step_head() {
  local head=$SPECDEC_TUNER_CACHE/models/$HEAD_NAME
  mkdir -p "$OUT/head" && cp "$head/specdec-tuner.json" "$OUT/head/head.json" \
    && (cd "$head" && sha256sum ./*.safetensors) > "$OUT/head/head.sha256" || return 1
  "$PY" -m benchmarks.eagle3_head record --head "$head" --out "$OUT/head/training.json" || return 1
  "$PY" -m benchmarks.eagle3_head measure --head "$head" --k 3 --dtype bfloat16 --train-heldout 40 --out-dir "$OUT/head"
}

step_study() {
  local args=(-m tuner optimize --study "$STUDY" --storage "$STORAGE" --tracking-uri "$TRACKING"
              --workdir "$OUT/runs" --export "$OUT/best.yaml")
  [ -n "${N_TRIALS:-}" ] && args+=(--n-trials "$N_TRIALS")
  if [ -n "${STUDY_TIME_LIMIT_S:-}" ]; then
    # --timeout starts no trial or engine expected to overrun the limit and exits 75. timeout(1) is only
    # a backstop for an engine that overruns its estimate: its SIGTERM drops the trial in flight (exit 130).
    args+=(--timeout "$STUDY_TIME_LIMIT_S")
    timeout -s TERM -k 20 $((STUDY_TIME_LIMIT_S + 30)) "$PY" "${args[@]}"
  else
    "$PY" "${args[@]}"
  fi
  local rc=$?
  case $rc in
    75|130|124) echo "study stopped by the time limit (STUDY_TIME_LIMIT_S); run the step again to resume" >&2 ;;
  esac
  return $rc
}

step_export() {
  "$PY" -m tuner export --study "$STUDY" --storage "$STORAGE" --output "$OUT/best.yaml" >/dev/null && cat "$OUT/best.yaml"
}

step_serve() {
  # The real check: vllm serve --config; where the CLI cannot start, the same file through vLLM's parser and vllm.LLM.
  "$PY" -m benchmarks.config_check serve --config "$OUT/best.yaml" --out "$OUT/serve_check.json" \
      --port "${SERVE_PORT:-8011}" --timeout-s "${SERVE_TIMEOUT_S:-300}" \
    || "$PY" -m benchmarks.config_check engine --config "$OUT/best.yaml" --out "$OUT/engine_check.json"
}

step_summary() {
  "$PY" -m benchmarks.gpu_report study --study "$STUDY" --storage "$STORAGE" --workdir "$OUT/runs" \
    --timings "$OUT/timings.jsonl" --out "$OUT/study_summary.json"
}

step_grid() {
  local args=(-m benchmarks.grid --study "$STUDY" --results "$OUT/grid.json" --workdir "$OUT/grid-runs")
  [ -n "${GRID_ONLY:-}" ] && args+=(--only "$GRID_ONLY")
  [ -n "${GRID_DEADLINE_S:-}" ] && args+=(--deadline-s "$GRID_DEADLINE_S")
  "$PY" "${args[@]}"
}

step_compare() {
  "$PY" -m benchmarks.gpu_report compare --study "$STUDY" --summary "$OUT/study_summary.json" \
      --grid "$OUT/grid.json" --out "$OUT/comparison.json" >/dev/null \
    && "$PY" -m benchmarks.gpu_report markdown --summary "$OUT/study_summary.json" --comparison "$OUT/comparison.json"
}

status=0
for step in $STEPS; do
  echo "== $step ($(date -u +%H:%M:%S))" >&2
  started=$(now)
  "step_$step"
  rc=$?
  record "$step" "$rc" "$started"
  if [ $rc -ne 0 ]; then
    echo "step $step exited with $rc" >&2
    status=$rc
    case $step in check|prepare) exit $rc ;; esac
  fi
done
exit $status
