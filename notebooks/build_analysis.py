"""Writes notebooks/analysis.ipynb (without outputs). Edit the cells here, then run:

    .venv/bin/python notebooks/build_analysis.py

tests/test_notebook.py checks that the notebook matches this script and executes it against studies
the test creates, so the notebook cannot rot.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
TARGET = HERE / "analysis.ipynb"

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """# Reviewing a specdec-tuner study

This notebook loads a study from its **Optuna storage** (every trial's settings, metrics and failure reason)
and its **MLflow runs** (the same trials as the MLflow UI shows them), reproduces the report's key plots and
compares two studies, e.g. the same search space measured on CPU and on GPU.

Where it reads from (environment variables; the defaults are the demo's files in the repository root):

| variable | default | meaning |
|---|---|---|
| `SPECDEC_STUDY_STORAGE` | `sqlite:///<repo>/optuna.db` | Optuna storage URL of the study |
| `SPECDEC_STUDY_NAME` | `smollm2-cpu` | study name (`name:` in the study file) |
| `SPECDEC_TRACKING_URI` | `sqlite:///<repo>/mlflow.db` | MLflow tracking URI (a file or `http://host:port`) |
| `SPECDEC_EXPERIMENT` | the study name | MLflow experiment (`tracking.experiment`) |
| `SPECDEC_COMPARE_STUDY_NAME` | *(none)* | a second study to compare with |
| `SPECDEC_COMPARE_STORAGE` | `SPECDEC_STUDY_STORAGE` | its Optuna storage |

For one self-contained file instead, run `python -m tuner report --study STUDY.yaml --output report.html`.""",
    ),
    (
        "code",
        """import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm, imported by Optuna

%matplotlib inline
import mlflow
import pandas as pd
from IPython.display import Markdown, display
from mlflow.tracking import MlflowClient

ROOT = Path.cwd() if (Path.cwd() / "tuner").is_dir() else Path.cwd().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tuner.outputs import plots
from tuner.outputs import report
from tuner.results import store

STORAGE = os.environ.get("SPECDEC_STUDY_STORAGE", f"sqlite:///{ROOT / 'optuna.db'}")
STUDY_NAME = os.environ.get("SPECDEC_STUDY_NAME", "smollm2-cpu")
TRACKING_URI = os.environ.get("SPECDEC_TRACKING_URI", f"sqlite:///{ROOT / 'mlflow.db'}")
EXPERIMENT = os.environ.get("SPECDEC_EXPERIMENT", STUDY_NAME)
COMPARE_NAME = os.environ.get("SPECDEC_COMPARE_STUDY_NAME", "")
COMPARE_STORAGE = os.environ.get("SPECDEC_COMPARE_STORAGE", STORAGE)
pd.set_option("display.max_colwidth", 90)
pd.set_option("display.width", 200)
print(f"study {STUDY_NAME!r} from {STORAGE}; MLflow at {TRACKING_URI}")""",
    ),
    (
        "md",
        """## 1. The study, from Optuna

Each trial stores its normalised settings (`spec`), its measurements (`metrics`: throughput per batch size,
acceptance counters, engine start time) and, when it did not complete, why (`failure_class`, `error`,
`pruned_reason`). Speedups are against the study's best trial without speculation.""",
    ),
    (
        "code",
        """study = store.load_existing(STORAGE, STUDY_NAME)
rows = report.collect_rows(study)
summary = report.build_report(study, storage=STORAGE)
# The study's one answer (tuner.results.outcome), as export and report state it: what is served, and by which rule.
display(Markdown(f"**{summary.headline}**"))
for line in summary.decided:
    display(Markdown(f"- {line}"))
trials = report.trials_frame(rows)
trials""",
    ),
    (
        "md",
        """**Why** — the report's explanation: acceptance of the winner, how it changes with the draft position
and with `num_speculative_tokens`, batch sizes, and what happened to the other candidates.""",
    ),
    (
        "code",
        """display(Markdown("\\n".join(f"- {line}" for line in summary.why) or "_no completed trial yet_"))""",
    ),
    (
        "md",
        """## 2. The same trials in MLflow

One parent run per study, one child run per trial with params (`method`, `candidate`, `num_speculative_tokens`,
...), metrics (`tokens_per_s`, `speedup`, `acceptance_rate`, ...) and tags (`state`, `failure_class`, `best`).
The filter strings below are exactly what you type into the MLflow UI's search box.""",
    ),
    (
        "code",
        """mlflow.set_tracking_uri(TRACKING_URI)
client = MlflowClient(TRACKING_URI)
experiment = client.get_experiment_by_name(EXPERIMENT)
runs = mlflow.search_runs([experiment.experiment_id], filter_string="tags.`specdec.role` = 'trial'")
wanted = [
    "tags.mlflow.runName", "tags.state", "params.method", "params.num_speculative_tokens", "params.enforce_eager",
    "metrics.tokens_per_s", "metrics.speedup", "metrics.acceptance_rate", "metrics.engine_start_s",
]
runs[[c for c in wanted if c in runs.columns]].sort_values("tags.mlflow.runName")""",
    ),
    (
        "code",
        """for query in [
    "params.method = 'ngram'",
    "metrics.speedup > 1",
    "params.method = 'ngram' and metrics.speedup > 1",
    "tags.state = 'FAIL'",
    "tags.best = 'true'",
]:
    found = mlflow.search_runs([experiment.experiment_id], filter_string=query)
    names = ", ".join(sorted(found["tags.mlflow.runName"])) if len(found) else "-"
    print(f"{query:50} {len(found):2d} runs: {names}")""",
    ),
    (
        "md",
        """The per-position acceptance is also logged as the stepped metric `accepted_per_pos_rate` (and as the
`acceptance_profile.png` artifact of each speculative trial). Reading it back from MLflow gives the same numbers
as the Optuna storage:""",
    ),
    (
        "code",
        """best = summary.featured
if best is not None and best.mlflow_run_id:
    history = client.get_metric_history(best.mlflow_run_id, "accepted_per_pos_rate")
    from_mlflow = [round(m.value, 3) for m in sorted(history, key=lambda m: m.step)]
    from_optuna = [round(x, 3) for x in best.metrics.spec.per_position_rate]
    print(f"{best.label}: MLflow {from_mlflow}, Optuna {from_optuna}")
    assert from_mlflow == from_optuna
else:
    print("no completed speculative trial yet")""",
    ),
    (
        "md",
        """## 3. The key plots

**Optimisation history.** Each trial's score: per batch size, (median output tokens/s minus a penalty times its
MAD) over the best no-speculation median at that batch size, averaged with `batch_weights`; the step line is the
best so far. Baselines come first, then `search.first_trials`, then the
sampler. Crosses are pruned trials at their last partial throughput, red triangles failed trials.""",
    ),
    ("code", "plots.history(rows)"),
    (
        "md",
        """**Throughput against `num_speculative_tokens`.** One line per candidate (the best trial at each k), every trial
as a dot, one panel per batch size; the dashed line is no speculation. A curve that rises and then falls shows
the k where drafting more stops paying.""",
    ),
    ("code", "plots.throughput_vs_k(rows)"),
    (
        "md",
        """**Accepted tokens per position.** For each candidate's best trial: the share of drafts whose token at position
i was accepted. It can only fall with i; where it approaches zero, further draft positions are wasted work.""",
    ),
    ("code", "plots.acceptance_per_position(rows)"),
    (
        "md",
        """**Parameter importances.** fANOVA over the normalised settings of the completed trials (a small study gives a
note instead of bars).""",
    ),
    (
        "code",
        """if summary.importance_note:
    print(summary.importance_note)
plots.importances(summary.importances, summary.importance_note)""",
    ),
    (
        "md",
        """**Engine start against `enforce_eager`.** Compiled mode (`enforce_eager: false`) captures graphs or compiles
before serving: a slower start that may buy steady-state throughput.""",
    ),
    ("code", "plots.engine_start_vs_eager(rows)"),
    (
        "md",
        """## 4. Compare two studies

The same search space measured on two machines (say CPU and GPU), or with two workloads, usually picks different
winners: n-gram lookup costs almost nothing to draft, a draft model costs a forward pass per token, and how much
a verified token saves depends on whether the target is memory- or compute-bound. Set
`SPECDEC_COMPARE_STUDY_NAME` (and `SPECDEC_COMPARE_STORAGE` when it lives elsewhere).""",
    ),
    (
        "code",
        """if COMPARE_NAME:
    other = store.load_existing(COMPARE_STORAGE, COMPARE_NAME)
    other_rows = report.collect_rows(other)
    other_summary = report.build_report(other, storage=COMPARE_STORAGE)
    labels = {STUDY_NAME: summary, COMPARE_NAME: other_summary}
    if COMPARE_NAME == STUDY_NAME:
        labels = {f"{STUDY_NAME} ({STORAGE})": summary, f"{COMPARE_NAME} ({COMPARE_STORAGE})": other_summary}
    for name, rep in labels.items():
        display(Markdown(f"- **{name}**: {rep.headline}"))
    side = report.compare_frame(labels)
    display(side.pivot(index="candidate", columns="study", values=["speedup", "acceptance_rate", "tokens_per_s"]))
    display(plots.compare_studies({name: rep.rows for name, rep in labels.items()}))
else:
    print("set SPECDEC_COMPARE_STUDY_NAME (and SPECDEC_COMPARE_STORAGE) to compare this study with another one")""",
    ),
]


def build() -> nbformat.NotebookNode:
    cells = []
    for i, (kind, source) in enumerate(CELLS):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"cell-{i:02d}"
        cells.append(cell)
    nb = new_notebook(cells=cells)
    nb["metadata"] = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    return nb


def render() -> str:
    return nbformat.writes(build()) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if TARGET.exists() and TARGET.read_text() == text else 1)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
