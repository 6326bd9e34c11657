"""What a trial ran on. Throughput from different hardware is not comparable, so a study refuses to mix."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

from pydantic import BaseModel


class Hardware(BaseModel):
    host: str
    accelerator: str  # "1x NVIDIA H200" or "cpu"
    gpu_count: int = 0
    gpu_name: str = ""
    driver: str = ""
    cpu: str = ""
    cores: int = 0

    @property
    def hardware_class(self) -> str:
        """What this process sees: all its visible GPUs."""
        return self.engine_class(self.gpu_count)

    def engine_class(self, gpus_per_engine: int) -> str:
        """What must match for two throughputs to be comparable (not the host name): the GPU model and
        how many GPUs one engine uses, not how many this process sees. ``optimize --workers`` gives each
        worker a slice of the parent's GPUs, and a remote worker may see more than its engines use."""
        if self.gpu_count:
            return f"{gpus_per_engine}x {self.gpu_name}"
        return f"cpu: {self.cpu} ({self.cores} cores)"


def gpus_per_engine(engine_args: dict[str, Any]) -> int:
    """GPUs one vLLM engine of these arguments uses."""
    count = 1
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        value = engine_args.get(key)
        if isinstance(value, int) and value > 0:
            count *= value
    return count


def _visible_gpus() -> list[tuple[str, str]]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.count(",") >= 2]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = {v.strip() for v in visible.split(",") if v.strip()}
        rows = [r for r in rows if r[0] in wanted]
    return [(r[1], r[2]) for r in rows]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> Hardware:
    gpus = _visible_gpus()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
    if gpus:
        name, driver = gpus[0]
        return Hardware(
            host=platform.node(),
            accelerator=f"{len(gpus)}x {name}",
            gpu_count=len(gpus),
            gpu_name=name,
            driver=driver,
            cpu=cpu_model(),
            cores=cores,
        )
    return Hardware(host=platform.node(), accelerator="cpu", cpu=cpu_model(), cores=cores)
