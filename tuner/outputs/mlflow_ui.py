"""What the MLflow UI (3.17) reads from an experiment to choose how it shows it.

No mlflow import: the tracker writes these tags.

- ``mlflow.experimentKind``: the kind the UI's own selector writes ("Machine learning" is
  ``custom_model_development``). The 3.17 UI chooses the landing page from its workflow switch
  (``?workflowType=`` in the URL, else the browser's last choice, else GenAI), not from this tag;
  earlier 3.x UIs and Databricks read the tag.
"""

from __future__ import annotations

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
