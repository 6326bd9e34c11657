"""What the MLflow UI (3.17) reads from an experiment to choose how it shows it.

No mlflow import: the tracker writes these tags, the CLI prints the link.

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
import urllib.parse

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
TRIALS_VIEW_ID = "specdec-trials"
TRIALS_VIEW_NAME = "specdec trials"
TRIALS_VIEW_TAG = VIEW_TAG_PREFIX + TRIALS_VIEW_ID

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
    """The runs page of the experiment in model-training mode with the trials view; None unless the
    tracking URI is an MLflow server (for a database, the UI is whatever ``mlflow ui`` serves)."""
    parts = urllib.parse.urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if parts.port is None else f"{host}:{parts.port}"  # no user:password in a link to print
    base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    query = urllib.parse.urlencode({"workflowType": "machine_learning", "viewStateShareKey": TRIALS_VIEW_ID})
    return f"{base}/#/experiments/{experiment_id}/runs?{query}"
