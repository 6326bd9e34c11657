"""Serve mode with the real thing: `vllm serve` (CPU vLLM, the packaged demo model) under `vllm bench serve`
load, through the CLI as a user runs it. One study (module fixture): the baseline and an n-gram trial at
concurrency 1 and 4, each with a rate search against a loose SLO (objective: goodput)."""

from __future__ import annotations

import copy
import json
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import CliResult, run_cli, study_dict, write_study
from tests.test_interrupt import Family, _start
from tuner.results import store

pytestmark = pytest.mark.engine

SERVE = {
    "mode": "serve",
    "serve": {
        "objective": "goodput",
        # Loose: a 2-core CPU keeps it at every rate tried, so the search ends at max_rps.
        "slo": {"percentile": 90, "ttft_ms": 60000, "tpot_ms": 5000},
        "rate_search": {
            "start_rps": 2,
            "max_rps": 4,
            "bisect_steps": 1,
            "requests": 3,
            "probe_s": 1,
            "time_limit_s": 120,
        },
    },
}


def serve_study(tmp: Path, name: str, trials: int) -> dict[str, Any]:
    data = study_dict(tmp, name=name, budget={"trials": trials, "trial_timeout_s": 600})
    # Four prompts (three copy tasks): concurrency 4 is one wave.
    data["workload"].update(
        copy.deepcopy(SERVE), batch_sizes=[1, 4], repeats=1, max_tokens=16, temperature=0.0, top_p=1.0, max_prompts=4
    )
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    ]
    return data


@dataclass
class ServedStudy:
    tmp: Path
    data: dict[str, Any]
    export: Path
    result: CliResult


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, demo_models: None) -> ServedStudy:
    tmp = tmp_path_factory.mktemp("served")
    data = serve_study(tmp, "served-study", trials=2)
    export = tmp / "best.yaml"
    result = run_cli(["optimize", "--study", str(write_study(tmp, data)), "--export", str(export)], cwd=tmp)
    return ServedStudy(tmp, data, export, result)


def _trials(s: ServedStudy) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=s.data["name"], storage=s.data["storage"]).get_trials()


def test_a_served_study_completes(served: ServedStudy) -> None:
    assert served.result.returncode == 0, served.result.stderr[-3000:]
    trials = _trials(served)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2, [t.user_attrs for t in trials]
    assert [s.method for t in trials if (s := store.trial_spec(t))] == ["none", "ngram"]


def test_levels_carry_served_latencies_and_the_slo_search(served: ServedStudy) -> None:
    base, ngram = (store.trial_metrics(t) for t in _trials(served))
    assert base is not None and ngram is not None
    for m in (base, ngram):
        assert m.mode == "serve" and m.objective == "goodput"
        for concurrency in (1, 4):
            level = m.level(concurrency)
            assert level is not None and level.tokens_per_s > 0 and level.request_throughput
            for key in ("ttft_p50", "ttft_p90", "ttft_p99", "tpot_p90", "itl_p90", "e2el_p99"):
                assert level.latency_ms[key] > 0, key
            assert level.slo_held is True
        assert m.slo is not None and m.slo.max_rate_rps == 4.0 and not m.slo.truncated
        assert [p.rate_rps for p in m.slo.probes] == [2.0, 4.0]
    # The server's own /metrics counters, diffed around each window: n-gram drafts on copy prompts.
    assert ngram.spec.drafts > 0 and len(ngram.spec.accepted_per_pos) == 3
    assert base.spec.drafts == 0
    assert ngram.slo_rate_speedup == 1.0 and base.score >= 1.0
    # Served outputs are compared with the baseline's too (temperature 0, float32 on CPU: exactly).
    for concurrency in (1, 4):
        level = ngram.level(concurrency)
        assert level is not None and level.lossless_match_rate == 1.0, level and level.first_divergence
    client = MlflowClient(served.data["tracking"]["uri"])
    exp = client.get_experiment_by_name(served.data["name"])
    assert exp is not None and len(client.search_runs([exp.experiment_id], "tags.lossless = 'exact'")) == 1


def test_each_trial_served_the_file_export_writes(served: ServedStudy) -> None:
    """The exported file's settings are exactly the served trial's config file (header comments aside)."""
    chosen = yaml.safe_load(served.export.read_text())
    served_files = sorted((served.tmp / "tuner-runs" / served.data["name"]).glob("trial-*/serve.yaml"))
    assert len(served_files) == 2
    assert chosen in [yaml.safe_load(p.read_text()) for p in served_files]
    assert not [key for key in chosen if "key" in key]  # the trial's generated API key is not part of it
    ngram = yaml.safe_load(served_files[1].read_text())
    assert ngram["speculative-config"]["num_speculative_tokens"] == 3


def test_mlflow_has_per_level_latency_metrics(served: ServedStudy) -> None:
    client = MlflowClient(served.data["tracking"]["uri"])
    exp = client.get_experiment_by_name(served.data["name"])
    children = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("specdec.role") == "trial"]
    assert len(children) == 2
    for run in children:
        assert run.data.tags["workload_mode"] == "serve"
        for key in ("ttft_p90_ms_bs1", "tpot_p99_ms_bs4", "request_throughput_bs4", "slo_max_rate_rps"):
            assert run.data.metrics[key] > 0, key
        history = client.get_metric_history(run.info.run_id, "slo_probe_rate_rps")
        assert [m.value for m in sorted(history, key=lambda m: m.step)] == [2.0, 4.0]


def test_no_server_outlives_its_trial(served: ServedStudy) -> None:
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_server(p)]
    assert not left


def _is_server(proc: Path) -> bool:
    try:
        return b"tuner.engine.vllm_cli" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def _server_port(family: Family) -> int:
    for pid in family.live():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tuner.engine.vllm_cli" in argv:
            return int(argv[argv.index(b"--port") + 1])
    raise AssertionError("no server among the tuner's processes")


def _wait_for_health(family: Family, timeout: float) -> int:
    """The port of the tuner's server once its /health answers 200."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert family.tuner.poll() is None, family.tuner.communicate()[1][-3000:]
        try:
            port = _server_port(family)
            if _status(f"http://127.0.0.1:{port}/health") == 200:
                return port
        except (AssertionError, OSError):
            pass  # no server yet, or not listening yet
        time.sleep(0.5)
    raise TimeoutError("no server answered /health")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_a_server_is_gone_after_ctrl_c_and_kill_9(tmp_path: Path, demo_models: None, how: str) -> None:
    data = serve_study(tmp_path, f"served-{how}", trials=1)
    data["workload"]["serve"].pop("slo")
    data["workload"]["serve"]["objective"] = "throughput"
    data["workload"]["repeats"] = 50  # still running when the signal comes
    proc = _start(write_study(tmp_path, data), tmp_path)
    family = Family(tmp_path, proc)
    port = _wait_for_health(family, 600)  # the signal comes as soon as the first server answers
    # Loopback only, and the generated key guards the API (not /health).
    assert _status(f"http://127.0.0.1:{port}/health") == 200
    assert _status(f"http://127.0.0.1:{port}/v1/models") == 401
    listening = Path("/proc/net/tcp").read_text()
    assert f"0100007F:{port:04X}" in listening and f"00000000:{port:04X}" not in listening
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    else:
        proc.kill()
    proc.communicate(timeout=120)
    family.none_left()
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_server(p)]
    if how == "ctrl-c":
        trial = _trials(ServedStudy(tmp_path, data, tmp_path / "x", CliResult(0, "", "")))[0]
        assert json.dumps(store.trial_record(trial).failure_class) == '"interrupted"'
