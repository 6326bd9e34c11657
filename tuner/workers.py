"""``optimize --workers N``: N local ``tuner worker`` processes sharing one study.

The parent creates the study and its MLflow parent run and enqueues the baseline, so workers only join.
GPUs are split between workers (``CUDA_VISIBLE_DEVICES``); with fewer GPUs than workers they share.
Without GPUs, the CPU cores are split between the workers' engines (``VLLM_CPU_OMP_THREADS_BIND``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuner import study_store as store
from tuner.optimize import StudyRunner
from tuner.runner import env_with_project


def visible_gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    from tuner.hardware import describe

    return [str(i) for i in range(describe().gpu_count)]


def gpu_slices(workers: int, gpus: list[str], per_worker: int) -> list[str | None]:
    """Each worker's CUDA_VISIBLE_DEVICES: disjoint groups of ``per_worker`` while there are enough,
    otherwise workers share (each needs its share of memory: set gpu_memory_utilization)."""
    if not gpus:
        return [None] * workers
    groups = [gpus[i : i + per_worker] for i in range(0, len(gpus) - per_worker + 1, per_worker)] or [gpus]
    return [",".join(groups[i % len(groups)]) for i in range(workers)]


def cpu_slices(workers: int, cpus: list[int]) -> list[str | None]:
    """Each CPU worker's engine cores (``VLLM_CPU_OMP_THREADS_BIND``), disjoint and even.

    vLLM's CPU build binds every engine to the same cores by default ("auto": the first cores of the
    NUMA node), so without this two local workers would share one core and leave the others idle."""
    if workers < 2 or len(cpus) < workers:
        return [None] * workers
    per = len(cpus) // workers
    return [",".join(str(c) for c in cpus[i * per : (i + 1) * per]) for i in range(workers)]


def run_workers(runner: StudyRunner, study_path: Path, workers: int, gpus_per_worker: int, log_dir: Path) -> list[int]:
    """Start the workers, show the study's progress from its storage, wait. Returns exit codes."""
    assert runner.study is not None
    log_dir.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpu_ids()
    slices = gpu_slices(workers, gpus, gpus_per_worker)
    own_cores: list[str | None] = [None] * workers
    if not gpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        own_cores = cpu_slices(workers, sorted(os.sched_getaffinity(0)))
    procs: list[subprocess.Popen[bytes]] = []
    for index, devices in enumerate(slices):
        env = env_with_project()
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        if own_cores[index] is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(own_cores[index])
        cmd = [
            sys.executable,
            "-m",
            "tuner",
            "worker",
            "--study",
            str(study_path),
            "--no-progress",
            "--storage",
            runner.storage_url,
            "--tracking-uri",
            runner.tracking_uri,
            "--n-trials",
            str(runner.budget),
            "--workdir",
            str(runner.workdir.parent),
        ]
        log = (log_dir / f"worker-{index}.log").open("wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        print(
            f"worker {index} started (pid {procs[-1].pid}, GPUs {devices or 'none'}"
            + (f", CPU cores {own_cores[index]}" if own_cores[index] else "")
            + f"), log {log.name}",
            file=sys.stderr,
        )
    try:
        done = -1
        while any(p.poll() is None for p in procs):
            used = store.budget_used(runner.study)
            if used != done:
                done = used
                print(f"[{used}/{runner.budget}] trials finished across {workers} workers", file=sys.stderr, flush=True)
            time.sleep(2)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=120)
        raise
    return [p.returncode for p in procs]
