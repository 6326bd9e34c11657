"""What the MLflow UI (3.17) reads from an experiment to choose how it shows it.

No mlflow import: the tracker writes these tags, the CLI prints the link (and, for a local store, the
``mlflow ui`` command that serves it).

- ``mlflow.experimentKind``: the kind the UI's own selector writes ("Machine learning" is
  ``custom_model_development``). The 3.17 UI chooses the landing page from its workflow switch
  (``?workflowType=`` in the URL, else the browser's last choice, else GenAI), not from this tag;
  earlier 3.x UIs and Databricks read the tag.
- ``mlflow.sharedViewState.<id>``: a saved view of the runs table (the UI's "Views" menu). The UI has no
  per-experiment default columns; a saved view is how it shows chosen metric columns and a flat, sorted
  list. The value's layout is the UI's (``savedViewEnvelope.ts``), not a documented API: a UI that cannot
  read it leaves the view out of its menu.
"""

from __future__ import annotations

import json
import shlex
import sys
import urllib.parse
from pathlib import Path

from tuner.redaction import mask_url

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
TRIALS_VIEW_ID = "specdec-trials"
TRIALS_VIEW_NAME = "specdec trials"
TRIALS_VIEW_TAG = VIEW_TAG_PREFIX + TRIALS_VIEW_ID

# Where ``mlflow ui`` (3.17) listens by default: loopback only, port 5000.
LOCAL_UI = "http://127.0.0.1:5000"
# Tracking URIs that are a store rather than a server; "+driver" suffixes (postgresql+psycopg2) aside.
LOCAL_STORE_SCHEMES = frozenset({"", "file", "sqlite", "postgresql", "mysql", "mssql"})
SQLITE_PREFIX = "sqlite:///"

# The figures a trial is judged by, then what it was.
TRIAL_COLUMNS = [
    "metrics.`score`",
    "metrics.`speedup`",
    "metrics.`tokens_per_s`",
    "metrics.`acceptance_rate`",
    "params.`method`",
    "params.`num_speculative_tokens`",
    "tags.`state`",
]


def trials_view_value(created_ms: int) -> str:
    """The saved view: trial runs only, best score first (a sort other than by date lists them flat)."""
    state = {
        "searchFilter": "tags.`specdec.role` = 'trial'",
        "orderByKey": "metrics.`score`",
        "orderByAsc": False,
        "selectedColumns": TRIAL_COLUMNS,
    }
    return json.dumps({"name": TRIALS_VIEW_NAME, "createdAt": created_ms, "state": json.dumps(state)})


def trials_url(tracking_uri: str, experiment_id: str) -> str | None:
    """The runs page of the experiment in model-training mode with the trials view: on the MLflow server of
    the tracking URI, or for a local store (a database, a folder) on ``mlflow ui``'s default address
    (:func:`ui_command` starts it); None for any other kind of tracking URI."""
    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme in ("http", "https") and parts.hostname:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        netloc = host if parts.port is None else f"{host}:{parts.port}"  # no user:password in a link to print
        base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    elif _is_local_store(tracking_uri):
        base = LOCAL_UI
    else:
        return None
    query = urllib.parse.urlencode({"workflowType": "machine_learning", "viewStateShareKey": TRIALS_VIEW_ID})
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"


def ui_command(tracking_uri: str) -> str | None:
    """The ``mlflow ui`` command that serves a local store's runs on ``LOCAL_UI``; None for a server or an
    unknown scheme. A relative SQLite file or folder is made absolute, so that the command works from any
    folder; a password is masked (the command is printed)."""
    if not _is_local_store(tracking_uri):
        return None
    store = tracking_uri
    if not urllib.parse.urlsplit(tracking_uri).scheme:
        store = str(Path(tracking_uri).expanduser().resolve())
    elif tracking_uri.startswith(SQLITE_PREFIX):
        path = tracking_uri[len(SQLITE_PREFIX) :]
        if not path.startswith("/"):  # sqlite:///x.db is relative, sqlite:////x.db absolute
            store = SQLITE_PREFIX + str(Path(path).resolve())
    mlflow = Path(sys.executable).with_name("mlflow")  # the environment's own, which may not be on PATH
    program = str(mlflow) if mlflow.exists() else "mlflow"
    return f"{shlex.quote(program)} ui --backend-store-uri {shlex.quote(mask_url(store))}"


def _is_local_store(tracking_uri: str) -> bool:
    """A tracking URI that ``mlflow ui`` serves itself: a folder (no scheme, or file:) or a database; not an
    in-memory SQLite database, nor MLflow's name for Databricks."""
    scheme = urllib.parse.urlsplit(tracking_uri).scheme
    if scheme == "sqlite":
        return tracking_uri.startswith(SQLITE_PREFIX) and tracking_uri != SQLITE_PREFIX + ":memory:"
    if scheme == "":
        return tracking_uri not in ("databricks", "databricks-uc")
    return scheme.split("+")[0] in LOCAL_STORE_SCHEMES
