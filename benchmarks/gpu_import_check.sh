#!/usr/bin/env bash
# On the GPU host, after install_offline_bundle.sh: does the bundle's vLLM/torch import and run a kernel on the
# host's CUDA libraries, and which nvcc would FlashInfer's JIT use? Writes OUT_JSON (default import_check.json).
#
#   PYTHONPATH=/tmp/site bash benchmarks/gpu_import_check.sh [OUT_JSON]
#
# Fields: versions (vllm, torch, torch.version.cuda, triton, torchvision, flashinfer, transformers, numpy,
# numba), the GPU, cuDNN/cuBLAS/NCCL as torch loads them (and from where: the host's or the bundle's),
# a bf16 matmul checked against fp32, FlashInfer's CUDA path and nvcc version next to torch's CUDA,
# nvidia-smi's line, and each check's error if it failed.
set -uo pipefail
out=${1:-import_check.json}
python3 - "$out" <<'EOF'
import json, os, platform, subprocess, sys, time
info = {"python": platform.python_version(), "pythonpath": os.environ.get("PYTHONPATH", ""), "errors": {}}
def check(name, fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        info["errors"][name] = f"{type(exc).__name__}: {exc}"[:800]
t0 = time.time()
def versions():
    import torch, vllm
    info.update(vllm=vllm.__version__, torch=torch.__version__, torch_cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name(), torch_file=torch.__file__, vllm_file=vllm.__file__)
    info["import_s"] = round(time.time() - t0, 1)
check("import vllm, torch", versions)
for mod in ("triton", "torchvision", "flashinfer", "transformers", "numpy", "numba", "optuna", "mlflow"):
    check(f"import {mod}", lambda m=mod: info.__setitem__(m, __import__(m).__version__))
def cudnn():  # torch refuses a cuDNN of another minor version here, on first use (vLLM's text path never uses it)
    import torch
    info["cudnn"] = torch.backends.cudnn.version()
check("cudnn", cudnn)
def libs():
    import torch
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    err = ((a @ a).float() - a.float() @ a.float()).abs().max().item()
    info["bf16_matmul_max_abs_err"] = round(err, 3)
    maps = open(f"/proc/{os.getpid()}/maps").read()
    info["loaded_cuda_libs"] = sorted({l.split()[-1] for l in maps.splitlines()
                                       if any(k in l for k in ("libcublas", "libcudnn.", "libnccl", "libcudart", "libnvJitLink"))})
check("cuda libraries", libs)
def vllm_ops():
    import importlib, torch
    try:  # the compiled kernels against this torch: vllm._C until 0.2x, vllm._C_stable_libtorch in 0.32
        importlib.import_module("vllm._C_stable_libtorch"); info["vllm_C_module"] = "vllm._C_stable_libtorch"
    except ImportError:
        importlib.import_module("vllm._C"); info["vllm_C_module"] = "vllm._C"
    info["vllm_C_ops"] = len([n for n in dir(torch.ops._C) if not n.startswith("_")])
check("vllm compiled ops", vllm_ops)
def fi():
    from flashinfer.jit.cpp_ext import get_cuda_path, get_cuda_version
    info["flashinfer_cuda_path"] = get_cuda_path()
    info["flashinfer_cuda_version"] = str(get_cuda_version())
    info["flashinfer_cuda_matches_torch"] = str(get_cuda_version()).split(".")[:2] == str(info.get("torch_cuda")).split(".")[:2]
check("flashinfer jit", fi)
for cmd, key in ((["nvcc", "--version"], "nvcc"), (["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                  "--format=csv,noheader"], "nvidia_smi")):
    try:
        info[key] = subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (OSError, IndexError) as exc:
        info["errors"][key] = str(exc)
open(sys.argv[1], "w").write(json.dumps(info, indent=1) + "\n")
print(json.dumps(info))
EOF
