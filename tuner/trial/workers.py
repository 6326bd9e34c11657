"""``optimize --workers N``: N local ``tuner worker`` processes sharing one study.

The parent creates the study and its MLflow parent run and enqueues the baseline, so workers only join.
GPUs are split between workers (``CUDA_VISIBLE_DEVICES``); with fewer GPUs than workers they share.
Without GPUs, the CPU cores are split between the workers' engines (``VLLM_CPU_OMP_THREADS_BIND``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from tuner.engine.process import EngineProcess, env_with_project
from tuner.environment import STORAGE_ENV, TRACKING_ENV
from tuner.results import store
from tuner.trial.optimize import StudyRunner


def visible_gpu_ids() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    from tuner.engine.hardware import describe

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


def worker_command(runner: StudyRunner, study_path: Path) -> list[str]:
    """No URLs on the command line: anyone on the host can read it (``ps``); see :func:`worker_env`."""
    return [
        sys.executable,
        "-m",
        "tuner",
        "worker",
        "--study",
        str(study_path),
        "--no-progress",
        "--n-trials",
        str(runner.budget),
        "--workdir",
        str(runner.workdir.parent),
        *_timeout_args(runner),
    ]


def _timeout_args(runner: StudyRunner) -> list[str]:
    """The workers stop by this command's --timeout: they get what is left of it."""
    if runner.deadline.timeout_s is None:
        return []
    return ["--timeout", f"{max(runner.deadline.left(), 0.001):.3f}"]


def worker_env(runner: StudyRunner, devices: str | None, cores: str | None) -> dict[str, str]:
    """The worker's environment: its GPUs or CPU cores, and the study's storage and tracking URLs
    (which may carry passwords; a process's environment is readable only by its user)."""
    env = env_with_project()
    env[STORAGE_ENV] = runner.storage_url
    env[TRACKING_ENV] = runner.tracking_uri
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    return env


def run_workers(runner: StudyRunner, study_path: Path, workers: int, gpus_per_worker: int, log_dir: Path) -> list[int]:
    """Start the workers, show the study's progress from its storage, wait. Returns exit codes."""
    study = runner.ready().study
    log_dir.mkdir(parents=True, exist_ok=True)
    gpus = visible_gpu_ids()
    slices = gpu_slices(workers, gpus, gpus_per_worker)
    own_cores: list[str | None] = [None] * workers
    if not gpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        own_cores = cpu_slices(workers, sorted(os.sched_getaffinity(0)))
    # Each worker owns its process group (EngineProcess): a kill -9 of this process takes the workers and
    # their engines with it; Ctrl-C here is passed on as SIGTERM, which a worker handles like Ctrl-C.
    with contextlib.ExitStack() as stack:
        procs: list[EngineProcess] = []
        for index, devices in enumerate(slices):
            env = worker_env(runner, devices, own_cores[index])
            log_path = log_dir / f"worker-{index}.log"
            procs.append(
                stack.enter_context(EngineProcess(worker_command(runner, study_path), log_path, env, grace_s=120.0))
            )
            print(
                f"worker {index} started (pid {procs[-1].pid}, GPUs {devices or 'none'}"
                + (f", CPU cores {own_cores[index]}" if own_cores[index] else "")
                + f"), log {log_path}",
                file=sys.stderr,
            )
        try:
            done = -1
            while any(p.poll() is None for p in procs):
                used = store.budget_used(study)
                if used != done:
                    done = used
                    print(
                        f"[{used}/{runner.budget}] trials finished across {workers} workers",
                        file=sys.stderr,
                        flush=True,
                    )
                time.sleep(2)
        except KeyboardInterrupt:
            for p in procs:  # all at once; leaving the block then waits for each group to end
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            raise
        return [p.returncode if p.returncode is not None else 1 for p in procs]
