#!/usr/bin/env bash
# Time CI (`bash .ci/run`) from a fresh clone of one commit and keep the result as a results file:
#   bash benchmarks/ci_time.sh [COMMIT]          (default: HEAD of this checkout)
# writes benchmarks/results/ci-<UTC date>-<short commit>/console.txt (the whole console, `time -v` included)
# and summary.json (date, commit, machine, wall seconds, pytest passed/failed, peak RSS), which
# `python -m benchmarks.docs_tables --write` turns into the CI table of docs/benchmarks.md.
# It runs the whole suite: on a shared machine, run it when nothing else is measuring.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
commit="$(git -C "$repo" rev-parse "${1:-HEAD}")"
short="${commit:0:7}"
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
out="$repo/benchmarks/results/ci-$(date -u +%Y%m%d)-$short"
clone="$(mktemp -d /tmp/ci-time-XXXXXX)"
mkdir -p "$out"
git clone --quiet "$repo" "$clone/repo"
git -C "$clone/repo" checkout --quiet "$commit"
set +e
(cd "$clone/repo" && CI=true /usr/bin/time -v bash .ci/run) >"$out/console.txt" 2>&1
rc=$?
set -e
ended="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
python3 - "$out" "$commit" "$started" "$ended" "$rc" <<'PY'
import json, os, platform, re, sys
out, commit, started, ended, rc = sys.argv[1:6]
log = open(os.path.join(out, "console.txt"), errors="replace").read()

def last(pattern: str) -> str | None:
    found = re.findall(pattern, log, re.M)
    return found[-1] if found else None

def count(word: str) -> int:
    # pytest's closing line of each process ("[a] ... 32 passed, 1 failed in ..."); summed over processes
    return sum(int(n) for n in re.findall(rf"(\d+) {word}\b[^\n]* in [\d.]+s", log))

wall = last(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)")
seconds = None
if wall:
    parts = [float(p) for p in wall.split(":")]
    seconds = sum(p * 60**i for i, p in enumerate(reversed(parts)))
rss = last(r"Maximum resident set size \(kbytes\): (\d+)")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
summary = {
    "benchmark": "ci",
    "started": started,
    "ended": ended,
    "commit": commit,
    "command": f"bash benchmarks/ci_time.sh {commit[:7]}: a fresh clone, then CI=true /usr/bin/time -v bash .ci/run",
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "host": platform.node()},
    "exit_code": int(rc),
    "wall_s": seconds,
    "passed": count("passed"),
    "failed": count("failed"),
    "errors": count("errors?"),
    "peak_rss_kb": int(rss) if rss else None,
    "source": "console.txt",
}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(json.dumps(summary))
PY
rm -rf "$clone"
exit "$rc"
