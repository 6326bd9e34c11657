"""The demo head's plumbing without training: the missing training environment, and the exported head's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuner.errors import UserError
from tuner.models.eagle3 import TRAIN_PYTHON_ENV, export_head, train_python


def test_missing_training_environment_is_one_line_naming_the_fix(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRAIN_PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(UserError) as err:
        train_python()
    msg = str(err.value)
    assert "\n" not in msg and "--eagle3" in msg and "requirements/eagle3-train.txt" in msg


def test_exported_head_leaves_the_embeddings_to_the_target(tmp_path: Path) -> None:
    """vLLM shares the target's embed_tokens with a head that has none (the widened target's are padded)."""
    from safetensors.torch import load_file, save_file

    ckpt, dst = tmp_path / "0", tmp_path / "head"
    ckpt.mkdir()
    weights = {"embed_tokens.weight": torch.ones(10, 4), "fc.weight": torch.ones(4, 12), "d2t": torch.zeros(5).long()}
    save_file(weights, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    (ckpt / "optimizer_state_dict.pt").write_text("x")
    export_head(ckpt, dst)
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(load_file(str(dst / "model.safetensors"))) == ["d2t", "fc.weight"]
