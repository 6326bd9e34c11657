"""check-pair and the pre-flight check on real checkpoints: the demo pair, and a draft made incompatible."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli, study_dict, write_study
from tuner.models.demo import DRAFT_LAYERS, demo_path, draft_name

pytestmark = pytest.mark.usefixtures("demo_models")


@pytest.fixture(scope="module")
def resized_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer draft whose vocabulary was resized: the classic mismatch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bad-draft") / "draft-resized"
    source = demo_path(draft_name(DRAFT_LAYERS[0]))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(64)])
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_demo_pair_is_compatible(tmp_path: Path) -> None:
    res = run_cli(
        ["check-pair", "--target", "demo:SmolLM2-135M-Instruct", "--draft", "demo:SmolLM2-135M-Instruct-4L"], tmp_path
    )
    assert res.returncode == 0, res.stderr
    assert "verdict: compatible" in res.stdout
    assert "token ids of probe texts" in res.stdout and "size ratio" in res.stdout


def test_resized_vocabulary_is_incompatible(tmp_path: Path, resized_draft: Path) -> None:
    res = run_cli(["check-pair", "--target", "demo:SmolLM2-135M-Instruct", "--draft", str(resized_draft)], tmp_path)
    assert res.returncode == 2
    assert "INCOMPATIBLE" in res.stdout and "vocabulary" in res.stdout


def test_check_pair_missing_path(tmp_path: Path) -> None:
    res = run_cli(["check-pair", "--target", "demo:SmolLM2-135M-Instruct", "--draft", str(tmp_path / "nope")], tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: --draft:") and len(res.stderr.strip().splitlines()) == 1


def test_preflight_drops_incompatible_draft(tmp_path: Path, resized_draft: Path, fake_engine: str) -> None:
    from mlflow.tracking import MlflowClient

    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["candidates"].append({"name": "bad", "method": "draft_model", "model": str(resized_draft)})
    res = run_cli(
        ["optimize", "--study", str(write_study(tmp_path, data)), "--no-progress"],
        tmp_path,
        env={"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"},
    )
    assert res.returncode == 0, res.stderr
    assert "bad" in res.stderr and "removed" in res.stderr
    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    parent = next(r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags)
    assert "bad" in parent.data.tags["preflight.rejected"]


def test_nothing_valid_left_exits_2(tmp_path: Path, resized_draft: Path) -> None:
    data = study_dict(tmp_path)
    data["candidates"] = [{"name": "bad", "method": "draft_model", "model": str(resized_draft)}]
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2
    assert "no speculative candidate passed" in res.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()


def test_missing_draft_path_is_bad_input(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["candidates"][2]["model"] = str(tmp_path / "missing-draft")
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: candidates.2.model:")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "optuna.db").exists()
