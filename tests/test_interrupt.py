"""Ctrl-C, SIGTERM and kill -9 in the middle of a trial; the same command resumes the study."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import MULTIPROCESS, ROOT, RealStudy, run_cli, study_dict, write_study
from tuner.engine import process_guard
from tuner.engine.preflight_cache import CACHE_FILE
from tuner.results import store


def _start(study_path: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The tuner, with this test's id in its environment: the tuner adds its own after it, so
    every process it starts (and theirs, whoever adopts them) carries this test's id."""
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    full[process_guard.RUN_ENV] = _test_id(cwd)
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "optimize", "--study", str(study_path), "--no-progress"],
        cwd=cwd,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    """In the child, before exec: a runner that starts pytest in the background ignores (or blocks) SIGINT,
    the child would inherit that, and Python only turns SIGINT into KeyboardInterrupt where it is default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


_IDS: dict[Path, str] = {}


def _test_id(tmp: Path) -> str:
    return _IDS.setdefault(tmp, f"test-{uuid.uuid4().hex[:12]}")


def _wait_for(path: Path, timeout: float, text: bytes = b"") -> None:
    end = time.monotonic() + timeout
    while not path.exists() or text not in path.read_bytes():
        if time.monotonic() > end:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.5)


def _stat() -> dict[int, tuple[int, int, str]]:
    """pid: (parent, session, start time) of every live process (zombies left out)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[19])
    return table


class Family:
    """Every process the tuner started, directly or not: marked with this test's id in their
    environment, or its descendants, or in an engine's session (vLLM's processes set their title,
    which blanks the environment /proc shows)."""

    def __init__(self, tmp: Path, tuner: subprocess.Popen[str]) -> None:
        self.tmp, self.tuner = tmp, tuner
        self.seen: set[tuple[int, str]] = set()
        self.sessions: set[int] = set()

    def live(self) -> list[int]:
        table = _stat()
        pids = {pid for pid in process_guard.marked(_test_id(self.tmp)) if pid in table}
        self.sessions |= {table[pid][1] for pid in pids if table[pid][1] == pid}  # the engines lead theirs
        frontier = [self.tuner.pid]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, (ppid, _, _) in table.items() if ppid == parent and pid not in pids]
            pids.update(children)
            frontier += children
        pids |= {pid for pid, (_, sid, _) in table.items() if sid in self.sessions}
        pids.discard(self.tuner.pid)
        self.seen |= {(pid, table[pid][2]) for pid in pids}
        # A process seen before, orphaned since (no longer the tuner's descendant), is still one of them.
        return sorted(pids | {pid for pid, start in self.seen if pid in table and table[pid][2] == start})

    def none_left(self, timeout: float = 60) -> None:
        """They go away within ``timeout`` (the guard kills them once it notices the tuner is gone)."""
        end = time.monotonic() + timeout
        while (left := self.live()) and time.monotonic() < end:
            time.sleep(0.5)
        described = []
        for pid in left:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                described.append(f"{pid}: {cmdline[:200]!r}")
            except OSError:
                pass
        assert not described, "\n".join(described)


def _check_resumed(data: dict, interrupted_kind: str, interrupted: int | None = None) -> None:
    """One trial was cut short (trial ``interrupted`` where the test knows which); the same command retried
    it with the same parameters and spent exactly the budget, with one baseline and no MLflow run left open."""
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1, states
    failed = next(t for t in trials if t.state == optuna.trial.TrialState.FAIL)
    assert interrupted is None or failed.number == interrupted, (failed.number, interrupted)
    retry = [t for t in trials if store.trial_record(t).retry_of == failed.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.COMPLETE
    assert retry[0].params == failed.params
    baselines = [t for t in trials if (s := store.trial_spec(t)) and s.is_baseline]
    assert len(baselines) == 1 and baselines[0].state == optuna.trial.TrialState.COMPLETE
    assert store.budget_used(study) == data["budget"]["trials"]
    client = MlflowClient(data["tracking"]["uri"])
    run = client.get_run(store.trial_record(failed).mlflow_run_id)
    assert run.info.status in ("KILLED", "FAILED"), run.info.status
    if interrupted_kind == "signal":
        assert store.trial_record(failed).failure_class == "interrupted"
    exp = client.get_experiment_by_name(data["name"])
    assert not [r for r in client.search_runs([exp.experiment_id]) if r.info.status == "RUNNING"]


# An n-gram configuration the session's real study has not measured (it has k=3, lookup 3..1): the sampler
# could propose one it has, which reuses that result without an engine, so the test picks it.
UNMEASURED: dict[str, Any] = {
    "candidate": "ngram",
    "enforce_eager": True,
    "ngram.num_speculative_tokens": 2,
    "ngram.prompt_lookup_max": 2,
    "ngram.prompt_lookup_min": 1,
}


def _one_more_real_trial(tmp_path: Path, real_study: RealStudy) -> tuple[dict, Path, int]:
    """The session's real study (baseline, n-gram, draft: all measured) resumed from a copy of its storage with
    a budget of one more trial, an unmeasured n-gram configuration waiting in it: the tuner's only engine is
    that trial's, with no baseline engine before it. Returns the study, its file and the trial's number."""
    assert real_study.result.returncode == 0, real_study.result.stderr[-3000:]
    data = yaml.safe_load(real_study.study_path.read_text())
    shutil.copy(real_study.dir / "optuna.db", tmp_path / "optuna.db")
    # Its pre-flight verdict too, as a resume in the same work directory has it (tokenizer loads, vLLM's checks).
    workdir = _trial_dir(tmp_path, data, 0).parent
    workdir.mkdir(parents=True)
    shutil.copy(_trial_dir(real_study.dir, data, 0).parent / CACHE_FILE, workdir / CACHE_FILE)
    # Sections outside the fingerprint: the copy resumes the same study, with a tracking store of its own.
    data["storage"] = f"sqlite:///{tmp_path / 'optuna.db'}"
    data["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": data["name"]}
    data["confirm"] = {"enabled": False}  # confirmation engines are not what these tests interrupt
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * data["budget"]["trials"]
    assert store.budget_used(study) == data["budget"]["trials"]
    data["budget"]["trials"] += 1
    study.enqueue_trial(UNMEASURED)  # Optuna hands out waiting trials before sampling
    number = study.trials[-1].number
    return data, write_study(tmp_path, data), number


def _trial_dir(tmp_path: Path, data: dict, number: int) -> Path:
    return tmp_path / "tuner-runs" / data["name"] / f"trial-{number:03d}"


@pytest.mark.engine
def test_ctrl_c_during_a_real_trial_then_resume(tmp_path: Path, real_study: RealStudy) -> None:
    data, path, number = _one_more_real_trial(tmp_path, real_study)
    proc = _start(path, tmp_path)
    _wait_for(_trial_dir(tmp_path, data, number) / "progress.jsonl", 600)  # the n-gram engine is up and measuring
    family = Family(tmp_path, proc)
    assert family.live(), "engine should be running"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "run the same command again to resume" in err
    family.none_left()
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "signal", number)


FAKE = {"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"}


def _start_hanging_study(tmp_path: Path, name: str) -> tuple[dict, Path, Path, subprocess.Popen[str]]:
    """A fake-engine study whose first speculative trial hangs while ``hang`` exists; returns once it runs."""
    data = study_dict(tmp_path, name=name, budget={"trials": 3, "trial_timeout_s": 600})
    hang = tmp_path / "hang"
    hang.touch()
    data["target"]["engine_args"]["fake_hang_file"] = str(hang)
    data["target"]["engine_args"]["fake_helper"] = True  # a child of the engine's, like a resource tracker
    path = write_study(tmp_path, data)
    proc = _start(path, tmp_path, FAKE)
    _wait_for(tmp_path / "tuner-runs" / name / "trial-001" / "request.json", 120)
    time.sleep(2)
    return data, path, hang, proc


def test_sigterm_kills_the_engine_and_resume_retries(tmp_path: Path) -> None:
    data, path, hang, proc = _start_hanging_study(tmp_path, "sigterm")
    family = Family(tmp_path, proc)
    assert family.live()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    family.none_left()
    hang.unlink()
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path, env=FAKE)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "signal")


def test_kill_9_leaves_a_stale_trial_that_is_retried(tmp_path: Path) -> None:
    data, path, hang, proc = _start_hanging_study(tmp_path, "kill9")
    family = Family(tmp_path, proc)
    assert family.live()
    proc.kill()
    proc.communicate(timeout=60)
    family.none_left()  # the engine, and anything else the tuner started
    hang.unlink()
    time.sleep(store.GRACE_S + store.HEARTBEAT_S)  # let the dead trial's heartbeat go stale
    res = run_cli(["optimize", "--study", str(path), "--no-progress"], tmp_path, env=FAKE)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(data, "kill")


@pytest.mark.engine
def test_kill_9_during_a_real_measurement_leaves_no_process(tmp_path: Path, real_study: RealStudy) -> None:
    """vLLM's engine-core process and multiprocessing's resource tracker included, not only the engine."""
    data, path, number = _one_more_real_trial(tmp_path, real_study)
    proc = _start(path, tmp_path, MULTIPROCESS)
    _wait_for(_trial_dir(tmp_path, data, number) / "progress.jsonl", 600, b'"repeat"')  # measuring
    family = Family(tmp_path, proc)
    assert len(family.live()) >= 3, "the engine and vLLM's processes should be running"
    proc.kill()
    proc.communicate(timeout=60)
    family.none_left()
