#!/usr/bin/env bash
# A prepared demo head (a folder with specdec-tuner.json, e.g. the one `prepare-demo --eagle3 --device cuda`
# built on an earlier machine and brought back) cut into parts that travel like the bundle's, so that a fresh
# GPU machine widens it for the wide target instead of training it again (about 10 minutes of device time):
#
#   bash benchmarks/gpu_head_bundle.sh HEAD_DIR [OUTDIR]     # default OUTDIR .bundle/head (git-ignored)
#
# Then one call per part: run(carry=[".bundle/head/pNN"], command="mkdir -p /root/head && cp .bundle/head/pNN/* /root/head/"),
# and HEAD_FROM=/root/head for benchmarks/gpu_study.sh (its prepare step unpacks the head into the model cache
# under the demo head's name before prepare-demo, which then keeps it: tuner.models.demo.head_recipe_device).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_names.sh"
head=${1:?usage: gpu_head_bundle.sh HEAD_DIR [OUTDIR]}
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${2:-$repo/.bundle/head}
[ -f "$head/specdec-tuner.json" ] || { echo "$head: no specdec-tuner.json (not a prepared head)" >&2; exit 2; }
tree_mib=$(git -C "$repo" ls-files -z | (cd "$repo" && du -cb --files0-from=-) | tail -n 1 | cut -f1)
part_mb=${PART_MB:-$((62 - (tree_mib + 1048575) / 1048576))}
rm -rf "$out"; mkdir -p "$out"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ln -s "$(cd "$head" && pwd)" "$tmp/$HEAD_NAME"
tar chf "$tmp/head.tar" -C "$tmp" $HEAD_NAME
split -b "${part_mb}m" -d "$tmp/head.tar" "$out/head.tar."
for f in "$out"/head.tar.*; do n=${f##*.}; mkdir -p "$out/p$n"; mv "$f" "$out/p$n/"; done
echo "head: $(sha256sum "$head/model.safetensors" | cut -c1-16) in $(ls -d "$out"/p* | wc -l) part(s) of at most $part_mb MiB under $out"
