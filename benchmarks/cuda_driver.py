"""Refuse a GPU host whose NVIDIA driver is too old for the CUDA that torch was built for, in one line.

``python -m benchmarks.cuda_driver`` (the first thing ``benchmarks/gpu_study.sh``'s ``check`` step runs, before
any engine starts) compares ``nvidia-smi --query-gpu=driver_version --format=csv,noheader`` with
``torch.version.cuda``: exit 0 when the driver can run it (or torch is a CPU build), else the line on stderr
and exit 1. The bundle's torch 2.13.0+cu130 (issue 27) needs driver 580 or newer; the H200 has 580.159.04.
"""

from __future__ import annotations

import subprocess
import sys

# The oldest driver (its major version) that runs any CUDA toolkit of a major release (minor version
# compatibility): NVIDIA, "CUDA Toolkit 11.x, 12.x, and 13.x Driver Version Ranges",
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]


def driver_problem(driver: str, cuda: str | None, torch_version: str = "torch") -> str | None:
    """Why ``driver`` (nvidia-smi's ``driver_version`` output: one line per GPU, or empty when there is no
    driver) cannot run a torch built for CUDA ``cuda`` (``torch.version.cuda``), in one line; None when it
    can, when torch is a CPU build (``cuda`` None) or when the CUDA release is one this table does not know."""
    if not cuda:
        return None
    try:
        major = int(cuda.split(".")[0])
    except ValueError:
        return f"cannot read torch.version.cuda {cuda!r}"
    needed = MIN_DRIVER.get(major)
    if needed is None:
        return None
    built = f"{torch_version} is built for CUDA {cuda}, which needs NVIDIA driver >= {needed}"
    versions = [line.strip() for line in driver.splitlines() if line.strip()]
    if not versions:
        return f"no NVIDIA driver found (nvidia-smi reports none); {built}"
    try:
        oldest = min(versions, key=lambda v: tuple(int(p) for p in v.split(".")))
        oldest_major = int(oldest.split(".")[0])
    except ValueError:
        return f"cannot read the NVIDIA driver version {versions[0]!r} (nvidia-smi); {built}"
    if oldest_major < needed:
        return f"NVIDIA driver {oldest} is too old: {built}"
    return None


def installed_driver() -> str:
    """nvidia-smi's driver versions, one line per GPU; empty when nvidia-smi is missing or fails."""
    try:
        proc = subprocess.run(QUERY, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout if proc.returncode == 0 else ""


def main() -> int:
    import torch

    problem = driver_problem(installed_driver(), torch.version.cuda, f"torch {torch.__version__}")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
