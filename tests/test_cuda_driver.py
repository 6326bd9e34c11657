"""A GPU host whose driver is too old for the bundle's torch fails gpu_study.sh's check step in one line,
before any engine starts (no GPU here: nvidia-smi and torch are stand-ins)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cuda_driver import driver_problem

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch 2.13.0+cu130"


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("580.159.04\n", "13.0"),  # the H200 (benchmarks/results/wide-h200-v032-20261204/import_check.json)
        ("580.159.04\n580.159.04\n", "13.0"),  # one line per GPU
        ("590.44.01", "13.1"),
        ("570.86.15", "12.8"),  # an older CUDA runs on it
        ("525.60.13", "12.1"),
        ("", None),  # a CPU torch needs no driver
        ("535.104.05", "14.0"),  # a CUDA release the table does not know: not refused on a guess
    ],
)
def test_a_driver_that_can_run_torch_passes(driver: str, cuda: str | None) -> None:
    assert driver_problem(driver, cuda, TORCH) is None


@pytest.mark.parametrize(
    ("driver", "cuda", "line"),
    [
        (
            "570.86.15\n",
            "13.0",
            "NVIDIA driver 570.86.15 is too old: torch 2.13.0+cu130 is built for CUDA 13.0, which needs NVIDIA "
            "driver >= 580",
        ),
        ("535.104.05", "13.0", "NVIDIA driver 535.104.05 is too old"),
        ("580.159.04\n575.51.03\n", "13.0", "NVIDIA driver 575.51.03 is too old"),  # the oldest GPU's driver
        ("520.61.05", "12.4", "NVIDIA driver 520.61.05 is too old: torch 2.13.0+cu130 is built for CUDA 12.4"),
        ("", "13.0", "no NVIDIA driver found (nvidia-smi reports none); torch 2.13.0+cu130 is built for CUDA 13.0"),
        ("[N/A]", "13.0", "cannot read the NVIDIA driver version '[N/A]'"),
    ],
)
def test_a_driver_too_old_is_one_line_naming_it_and_the_cuda_needed(driver: str, cuda: str, line: str) -> None:
    problem = driver_problem(driver, cuda, TORCH)
    assert problem is not None and problem.startswith(line) and "\n" not in problem
    assert f"CUDA {cuda}" in problem


def _stand_ins(tmp: Path, driver: str) -> dict[str, str]:
    """An nvidia-smi that reports ``driver`` and a torch built for CUDA 13.0, first on the paths."""
    bin_dir, site = tmp / "bin", tmp / "site"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho {driver}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text('__version__ = "2.13.0+cu130"\nfrom torch import version\n')
    (site / "torch" / "version.py").write_text('cuda = "13.0"\n')
    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}:{env['PATH']}", PYTHONPATH=str(site), PYTHON=sys.executable)
    return env


def test_gpu_study_check_step_stops_the_run_before_any_engine(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_study.sh"), str(out), "check", "prepare", "study"],
        env=_stand_ins(tmp_path, "570.86.15"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    expected = (
        "NVIDIA driver 570.86.15 is too old: torch 2.13.0+cu130 is built for CUDA 13.0, which needs NVIDIA driver "
        ">= 580"
    )
    assert [line for line in proc.stderr.splitlines() if "driver" in line] == [expected]
    assert "== prepare" not in proc.stderr and "== study" not in proc.stderr
    assert not (out / "machine.json").exists()
    assert '"step": "check", "rc": 1' in (out / "timings.jsonl").read_text()
