"""A real MLflow server and a real browser: the trial runs a study logs show up in the MLflow UI.

Starts ``mlflow server`` (SQLite backend, proxied artifacts) on a free loopback port, logs a fake-engine
study to it through the CLI exactly as a user would, then renders the experiment in headless Chromium
(Debian's ``chromium``, installed by scripts/services/chromium.sh) and checks the DOM: the experiment
opens on its runs page, and the link the CLI prints shows the trial runs with their figures.
Screenshots and DOM dumps are kept in test-artifacts/.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import FAKE_ENGINE, ROOT, run_cli, study_dict, write_study
from tuner.results import mlflow_ui, store

pytestmark = pytest.mark.services

ARTIFACTS = ROOT / "test-artifacts"
HOST = "127.0.0.1"
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
# MLflow 3's job runner starts three more Python processes (huey consumers) that import MLflow beside the
# server on the test's core; the tuner and the UI use no MLflow jobs (as tests/services.py's server).
SERVER_ENV = {**QUIET_ENV, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@dataclass
class Server:
    url: str
    log: Path


@dataclass
class LoggedStudy:
    name: str
    experiment_id: str
    trials: list[optuna.trial.FrozenTrial]
    parent_run: str
    stderr: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://{HOST}:{port}"
    log = tmp / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{tmp / 'mlflow.db'}",
        "--artifacts-destination",
        str(tmp / "artifacts"),
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=tmp, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **SERVER_ENV}, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Server(url, log)
    finally:
        # the server, its uvicorn worker and job consumers share the process group this test created
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc.pid, signal.SIGKILL)  # whatever ignored SIGTERM
        proc.wait(timeout=10)


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def logged_study(mlflow_server: Server, tmp_path_factory: pytest.TempPathFactory) -> LoggedStudy:
    tmp = tmp_path_factory.mktemp("ui-study")
    data = study_dict(tmp, name="ui-study", budget={"trials": 5, "trial_timeout_s": 60})
    data["workload"]["batch_sizes"] = [1]
    data["target"]["engine_args"].update({"fake_crash_k": 5, "fake_repeat_s": 0.01})
    lookup = {"prompt_lookup_max": 4, "prompt_lookup_min": 2}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": 3, **lookup},
        {"candidate": "draft-4l", "num_speculative_tokens": 2},
        {"candidate": "ngram", "num_speculative_tokens": 5, **lookup},
        {"candidate": "ngram", "num_speculative_tokens": 4, **lookup},
    ]
    path = write_study(tmp, data)
    env = {"SPECDEC_TUNER_ENGINE_MODULE": FAKE_ENGINE, **QUIET_ENV}
    args = ["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp / "runs")]
    result = run_cli([*args, "--tracking-uri", mlflow_server.url], cwd=tmp, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="ui-study", storage=data["storage"])
    experiment = MlflowClient(mlflow_server.url).get_experiment_by_name("ui-study")
    assert experiment is not None
    trials, parent = study.get_trials(), study.user_attrs[store.PARENT_RUN]
    return LoggedStudy("ui-study", experiment.experiment_id, trials, parent, result.stderr)


def _run_names(study: LoggedStudy, client: MlflowClient) -> dict[int, str]:
    return {t.number: client.get_run(store.trial_record(t).mlflow_run_id).info.run_name for t in study.trials}


def test_trial_runs_through_search_runs(mlflow_server: Server, logged_study: LoggedStudy) -> None:
    client = MlflowClient(mlflow_server.url)
    runs = client.search_runs([logged_study.experiment_id])
    trial_runs = [r for r in runs if r.data.tags.get(store.PARENT_TAG_KEY) == logged_study.parent_run]
    assert len(trial_runs) == len(logged_study.trials) == 5
    specs = [store.trial_spec(t) for t in logged_study.trials]
    assert [s.label() if s else None for s in specs] == [
        "no speculation eager",
        "ngram k=3 lookup 2-4 eager",
        "draft-4l k=2 eager",
        "ngram k=5 lookup 2-4 eager",
        "ngram k=4 lookup 2-4 eager",
    ]
    assert sorted(r.info.run_name.split(" ")[0] for r in trial_runs) == [f"trial-{i:03d}" for i in range(5)]

    def names(query: str) -> set[str]:
        return {r.info.run_name for r in client.search_runs([logged_study.experiment_id], filter_string=query)}

    ngram = names("params.method = 'ngram'")
    assert len(ngram) == 3 and all(" ngram k=" in n for n in ngram)
    faster = names("metrics.speedup > 1")
    assert faster and all(" ngram k=" in n for n in faster)
    assert names("params.method = 'ngram' and metrics.speedup > 1") == faster
    assert {n.split(" ")[0] for n in names("tags.state = 'FAIL'")} == {"trial-003"}
    assert {n.split(" ")[0] for n in names("tags.best = 'true'")} == {"trial-004"}

    # artifacts go through the server's artifact proxy
    parent_artifacts = {a.path for a in client.list_artifacts(logged_study.parent_run)}
    assert {"report.html", "report.md", "best_config.yaml"} <= parent_artifacts
    best_run = store.trial_record(next(t for t in logged_study.trials if t.number == 4)).mlflow_run_id
    assert "acceptance_profile.png" in {a.path for a in client.list_artifacts(best_run)}


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail(
            "chromium is not installed; fix: bash scripts/install-services.sh (runs scripts/services/chromium.sh)"
        )
    return path


def _browse(url: str, name: str, tmp: Path, budget_ms: int = 15000) -> str:
    """Render ``url`` in headless Chromium: save a screenshot and the DOM in test-artifacts/, return the DOM."""
    ARTIFACTS.mkdir(exist_ok=True)
    common = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # nothing beyond loopback
        f"--user-data-dir={tmp / ('chrome-' + name)}",
        "--window-size=1600,1000",
        f"--virtual-time-budget={budget_ms}",
    ]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    (ARTIFACTS / f"{name}.html").write_text(dom.stdout)
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    result = subprocess.run([*common, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 20_000
    return dom.stdout


def _runs_page(server: Server, experiment_id: str, search: str, order_by: str) -> str:
    # Sorting by a metric lists child runs flat (sorted by date, the UI nests them under the study's run).
    query = urllib.parse.urlencode({"searchFilter": search, "orderByKey": order_by, "orderByAsc": "false"})
    return f"{server.url}/#/experiments/{experiment_id}/runs?{query}"


def _render_until(url: str, name: str, tmp: Path, wanted: list[str]) -> str:
    dom = ""
    for budget in (15000, 30000, 60000):  # a slow machine needs more (virtual) time for the first render
        dom = _browse(url, name, tmp, budget)
        if all(w in dom for w in wanted):
            break
    return dom


def test_experiment_opens_on_its_runs_page(mlflow_server: Server, logged_study: LoggedStudy, tmp_path: Path) -> None:
    experiment = MlflowClient(mlflow_server.url).get_experiment(logged_study.experiment_id)
    assert experiment.tags[mlflow_ui.EXPERIMENT_KIND_TAG] == "custom_model_development"
    # The 3.17 UI picks the landing page from its GenAI / Model training switch, not from the tag:
    # without workflowType (and a browser that never chose) it opens the GenAI overview.
    url = f"{mlflow_server.url}/#/experiments/{logged_study.experiment_id}?workflowType=machine_learning"
    dom = _render_until(url, "mlflow-ui-landing", tmp_path, [">Runs</h2>", "matching runs", "ui-study"])
    assert ">Runs</h2>" in dom and ">Overview</h2>" not in dom, "see test-artifacts/mlflow-ui-landing.png"
    assert "Detect Issues" not in dom and "No data available" not in dom
    assert "ui-study" in dom  # the study's run; its trials are nested under it


def _cells(dom: str) -> dict[str, dict[str, str]]:
    """Plain-text cells of the runs table: run id -> column id -> text (pinned and scrolled parts merged)."""
    rows: dict[str, dict[str, str]] = {}
    for row_id, body in re.findall(r'row-id="([0-9a-f]{32})"(.*?)(?=row-id="|$)', dom, re.S):
        cells = re.findall(
            r'role="gridcell" col-id="([^"]+)"[^>]*><div[^>]*><span[^>]*class="ag-cell-value">([^<]*)<', body
        )
        rows.setdefault(row_id, {}).update(cells)
    return rows


def test_trial_runs_with_their_figures_in_the_browser(
    mlflow_server: Server, logged_study: LoggedStudy, tmp_path: Path
) -> None:
    client = MlflowClient(mlflow_server.url)
    names = _run_names(logged_study, client)
    url = mlflow_ui.trials_url(mlflow_server.url, logged_study.experiment_id)
    assert url is not None and f"trials in MLflow: {url}" in logged_study.stderr
    dom = _render_until(url, "mlflow-ui-trials", tmp_path, [*names.values(), "metrics.`score`"])
    missing = [n for n in names.values() if n not in dom]
    assert not missing, f"not in the rendered runs table: {missing}; see test-artifacts/mlflow-ui-trials.png"
    assert "<strong>5</strong> matching runs" in dom  # the trials, flat: not the study's run
    cells = _cells(dom)
    shown = 0
    for trial in logged_study.trials:
        run = client.get_run(store.trial_record(trial).mlflow_run_id)
        row = cells.get(run.info.run_id, {})
        for key in ("score", "speedup", "tokens_per_s"):
            if key in run.data.metrics:
                text = row.get(f"metrics.`{key}`")
                assert text, f"trial {trial.number}: no {key} cell; see test-artifacts/mlflow-ui-trials.png"
                value = run.data.metrics[key]
                assert abs(float(text) - value) <= 0.01 * abs(value) + 1e-3, (trial.number, key, text, value)
                shown += 1
    assert shown >= 6  # at least the baseline and the two measured n-gram trials
    # A pruned trial is a FINISHED run with empty metrics, a crashed one a FAILED run: the state column says so.
    states = {
        t.number: cells.get(store.trial_record(t).mlflow_run_id or "", {}).get("tags.`state`")
        for t in logged_study.trials
    }
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "PRUNED", 3: "FAIL", 4: "COMPLETE"}, states


def test_documented_search_works_in_the_browser(
    mlflow_server: Server, logged_study: LoggedStudy, tmp_path: Path
) -> None:
    names = _run_names(logged_study, MlflowClient(mlflow_server.url))
    query = "params.method = 'ngram' and metrics.speedup > 1"
    url = _runs_page(mlflow_server, logged_study.experiment_id, query, "metrics.`speedup`")
    # trials: 0 baseline, 1 ngram k=3, 2 draft-4l (pruned), 3 ngram k=5 (crashed), 4 ngram k=4
    winners = [names[1], names[4]]
    dom = _render_until(url, "mlflow-ui-search", tmp_path, winners)
    assert all(n in dom for n in winners), "see test-artifacts/mlflow-ui-search.png"
    for number in (0, 2, 3):
        assert names[number] not in dom
    assert "<strong>2</strong> matching runs" in dom
