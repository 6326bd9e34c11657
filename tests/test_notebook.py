"""notebooks/analysis.ipynb: executed end to end against two studies this test creates (fake engine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from tests.conftest import ROOT
from tests.test_report import make_study

NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK = NOTEBOOKS / "analysis.ipynb"
ARTIFACTS = ROOT / "test-artifacts"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_analysis", NOTEBOOKS / "build_analysis.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebook_matches_its_generator() -> None:
    assert NOTEBOOK.read_text() == _generator().render(), (
        "notebooks/analysis.ipynb differs from notebooks/build_analysis.py; "
        "fix: edit the script and run .venv/bin/python notebooks/build_analysis.py"
    )
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code")


def test_notebook_runs_against_two_studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "python3" in KernelSpecManager().find_kernel_specs(), "ipykernel's python3 kernel is not installed"
    cpu = make_study(tmp_path / "cpu", name="cpu-study", batch_sizes=(1, 4))
    other = make_study(
        tmp_path / "gpu",
        name="gpu-study",
        trials=4,
        batch_sizes=(1, 8),
        eager=(True,),
        first_trials=[
            {"candidate": "ngram", "num_speculative_tokens": 2},
            {"candidate": "ngram", "num_speculative_tokens": 6},
        ],
    )
    monkeypatch.setenv("SPECDEC_STUDY_STORAGE", cpu.storage)
    monkeypatch.setenv("SPECDEC_STUDY_NAME", cpu.name)
    monkeypatch.setenv("SPECDEC_TRACKING_URI", cpu.tracking_uri)
    monkeypatch.setenv("SPECDEC_COMPARE_STORAGE", other.storage)
    monkeypatch.setenv("SPECDEC_COMPARE_STUDY_NAME", other.name)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('KERNEL', sys.executable)"))
    client = NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(NOTEBOOKS)}})
    try:
        client.execute()
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        nbformat.write(nb, ARTIFACTS / "analysis.executed.ipynb")

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(
        str(o.get("text", ""))
        + str(o.get("data", {}).get("text/plain", ""))
        + str(o.get("data", {}).get("text/markdown", ""))
        for o in outputs
    )
    assert f"KERNEL {sys.executable}" in text  # the venv's python ran the notebook
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 6  # history, throughput, acceptance, importances, engine start, comparison
    assert "Use ngram k=4" in text  # the headline
    assert "params.method = 'ngram'" in text and "tags.best = 'true'" in text
    assert " 0 runs" not in text.split("params.method = 'ngram' and metrics.speedup > 1")[1].splitlines()[0]
    assert "MLflow [0.6, 0.36, 0.21, 0.12], Optuna [0.6, 0.36, 0.21, 0.12]" in text
    assert "gpu-study" in text and "cpu-study" in text
    assert "set SPECDEC_COMPARE_STUDY_NAME" not in text
