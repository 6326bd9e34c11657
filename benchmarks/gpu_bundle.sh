#!/usr/bin/env bash
# The offline bundle for the H200 (no network there): vLLM (VLLM_VERSION, default 0.32.0, CUDA build) with the
# torch, triton and torchvision it was built for, FlashInfer, the tuner's own dependencies and the demo GGUF,
# built here on a machine with PyPI access and cut into parts small enough to travel with the tree.
#
#   bash benchmarks/gpu_bundle.sh [OUTDIR]      # default .bundle (git-ignored); run from the repo root
#   bash benchmarks/gpu_bundle.sh --resplit [OUTDIR]
#                  no download: cuts the built parts again to PART_MB of today's tree and writes code.tgz
#                  anew (the tree grows with every results folder: at 22 MiB on 2026-12-07 the 45 MiB parts
#                  built at 98a8d26 were refused as "larger than 64 MiB"; cut again, 36 parts of 40 MiB)
#
# It calls ../shared/gpu/make_offline_bundle.sh (SHARED_GPU overrides) with:
#   HOST_PACKAGES  made from the H200's `pip list --format freeze` (HOST_FREEZE, ../shared/gpu/host-freeze.txt):
#                  every NVIDIA/CUDA library (nvidia-*, cuda-*) a bare name, so the host's CUDA 13 libraries are
#                  used whatever versions torch asks for (cuDNN, cuBLAS and NCCL alone are over a gigabyte),
#                  except NCCL: torch 2.13.0's libtorch_cuda.so needs ncclCommResume, which the host's NCCL
#                  2.28.9 lacks ("undefined symbol: ncclCommResume" at `import torch`, 2026-12-04), so
#                  nvidia-nccl-cu13==NCCL_VERSION (default 2.29.7, what torch 2.13.0 asks for; 206 MB) is
#                  added to the bundle here (the shared script's pip download does not look for its
#                  manylinux_2_18 wheel).
#                  cuDNN is not carried: torch 2.13.0 was built with 9.20, the host has 9.19, and torch refuses
#                  it on first use ("cuDNN version incompatibility"), but vLLM's text path (FLASH_ATTN) never
#                  uses cuDNN; a workload that does (convolutions, vision towers) needs nvidia-cudnn-cu13 pinned too;
#                  torch, triton, torchvision and setuptools pinned to the host's versions, so the versions this
#                  vLLM needs (torch 2.13.0, triton 3.7.1, torchvision 0.28.0, setuptools<81) are carried;
#                  everything else a bare name (the host's copy is used).
#   UV_CONSTRAINT  the host's versions of those other packages, so the resolution is the one that runs there
#                  (vLLM 0.32.0 accepts every one of them except numba, llvmlite, numpy and setuptools).
#                  numba/llvmlite/numpy stay the host's (0.68.0/0.50.0/2.5.2) although vLLM pins numba==0.65.0:
#                  carrying 0.65 means llvmlite 0.47 and numpy<2.5 too (about 75 MB, over a part) under host
#                  packages built against numpy 2.5.
#   PART_MB        default: 62 MiB less the tracked tree's size (a device call carries at most 64 MiB with the
#                  tree, which grows with the results: 12.7 MiB on 2026-12-04, 15.9 MiB on 2026-12-05, when a
#                  48 MiB part was refused as "larger than 64 MiB").
# and copies install_offline_bundle.sh to OUTDIR/tools/, where benchmarks/gpu_session.sh looks for it (carry it).
# and writes OUTDIR/code.tgz: the committed code (git archive HEAD: tuner, benchmarks without results, studies),
# so a study that runs in the background over several calls runs one commit, not a working tree that other
# edits change between calls (each call copies the tree to the device again).
# Then, per part: run(carry=[".bundle/parts/pNN"], command="mkdir -p /root/stash && cp .bundle/parts/pNN/* /root/stash/");
# the last part's call carries .bundle/tools and .bundle/code.tgz too (docs/measurement-log.md, issue 27 section).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
resplit=0
if [ "${1:-}" = "--resplit" ]; then resplit=1; shift; fi
out=${1:-$repo/.bundle}
shared=${SHARED_GPU:-$repo/../shared/gpu}
freeze=${HOST_FREEZE:-$shared/host-freeze.txt}
tree_mib=$(git -C "$repo" ls-files -z | (cd "$repo" && du -cb --files0-from=-) | tail -n 1 | cut -f1)
export VLLM_VERSION=${VLLM_VERSION:-0.32.0} PART_MB=${PART_MB:-$((62 - (tree_mib + 1048575) / 1048576))}
echo "PART_MB=$PART_MB (the tracked tree: $((tree_mib / 1048576)) MiB)"

cut_parts() {  # FILE: the tar stream into OUTDIR/parts/pNN/part.NN of PART_MB each
  rm -rf "$out/parts"; mkdir -p "$out/parts"
  split -b "${PART_MB}m" -d "$1" "$out/parts/part."
  for f in "$out"/parts/part.*; do n=${f##*.}; mkdir -p "$out/parts/p$n"; mv "$f" "$out/parts/p$n/"; done
}
write_code() {
  git -C "$repo" archive --format=tar.gz -o "$out/code.tgz" HEAD tuner benchmarks studies pyproject.toml README.md \
    ':(exclude)benchmarks/results'
  echo "code: $out/code.tgz ($(git -C "$repo" rev-parse --short HEAD))"
}
if [ "$resplit" = 1 ]; then
  out=$(cd "$out" && pwd)
  tmp=$(mktemp -d "$out/tmp.XXXX"); trap 'rm -rf "$tmp"' EXIT
  cat "$out"/parts/p*/part.* > "$tmp/bundle.tar"
  cut_parts "$tmp/bundle.tar"
  echo "bundle: $(wc -c < "$tmp/bundle.tar") bytes in $(ls -d "$out"/parts/p* | wc -l) parts"
  write_code
  exit 0
fi
mkdir -p "$out/tools"; out=$(cd "$out" && pwd)

python3 - "$freeze" "$out/tools/host-packages.txt" "$out/tools/host-constraints.txt" <<'EOF'
import re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s.strip().lower())
carried = {"torch", "triton", "torchvision", "setuptools"}   # pinned: a different resolved version is carried
host_own = {"numba", "llvmlite", "numpy"}                     # bare and unconstrained: the host's copy, see above
names, cons = [], []
for line in open(sys.argv[1]):
    line = line.strip()
    if not line or line.startswith("#") or "==" not in line:
        continue
    name, version = line.split("==", 1)
    n = norm(name)
    if n.startswith(("nvidia-", "cuda-")):
        names.append(n)
    elif n in carried:
        names.append(f"{n}=={version}")
    else:
        names.append(n)
        if n not in host_own and n != "torchaudio":
            cons.append(f"{n}=={version}")
open(sys.argv[2], "w").write("# made by benchmarks/gpu_bundle.sh from the H200's pip freeze\n" + "\n".join(names) + "\n")
open(sys.argv[3], "w").write("\n".join(cons) + "\n")
EOF
echo "HOST_PACKAGES: $(grep -c . "$out/tools/host-packages.txt") lines ($(grep -c == "$out/tools/host-packages.txt") pinned); constraints: $(grep -c . "$out/tools/host-constraints.txt")"

cp "$shared/install_offline_bundle.sh" "$out/tools/"
HOST_PACKAGES=$out/tools/host-packages.txt UV_CONSTRAINT=$out/tools/host-constraints.txt \
  bash "$shared/make_offline_bundle.sh" "$out" optuna==5.0.0 mlflow-skinny==3.17.2 sqlalchemy==2.1.9 alembic==1.20.1
# NCCL into the same tar stream (install_offline_bundle.sh runs `cat part.* | tar xf -`), then cut again.
tmp=$(mktemp -d "$out/tmp.XXXX"); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp/add/wh" "nvidia-nccl-cu13==${NCCL_VERSION:-2.29.7}"
# The EAGLE-3 trainer (prepare-demo --eagle3 --device cuda): four small wheels, about 1 MB
# (requirements/eagle3-train-gpu.txt says why these four).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp/add/wh" -r "$repo/requirements/eagle3-train-gpu.txt"
cat "$out"/parts/p*/part.* > "$tmp/bundle.tar"
(cd "$tmp/add" && tar rf "$tmp/bundle.tar" ./wh/*.whl)
cut_parts "$tmp/bundle.tar"
rm -rf "$tmp"
# What the bundle holds, for the docs: one line a wheel with its size.
(cd "$out/parts" && cat p*/part.* | tar tvf - | awk '{print $3, $6}' | grep '\.whl$' | sort -k2) > "$out/tools/contents.txt"
echo "bundle: $(cat "$out"/parts/p*/part.* | wc -c) bytes in $(ls -d "$out"/parts/p* | wc -l) parts; contents: $out/tools/contents.txt"
write_code
