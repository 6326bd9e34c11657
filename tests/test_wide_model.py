"""The widened target computes the 135M model's function; the mid-layer draft is a valid checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.models.wide import WideShape, build_wide, build_without_layers, check_shape

PROMPTS = [
    "def fibonacci(n):\n",
    "The capital of France is",
    "Write a haiku about the sea.",
    "import numpy as np\nx = np.arange(10)\n",
]
NEW_TOKENS = 32


def _greedy(path: Path) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok(text, return_tensors="pt").input_ids
            gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.eos_token_id)
            out.append(gen[0, ids.shape[1] :].tolist())
    return out


@pytest.fixture(scope="module")
def source(demo_models: None) -> Path:
    from tuner.models.demo import TARGET_NAME, demo_path

    return demo_path(TARGET_NAME)


def test_widened_model_keeps_greedy_tokens(source: Path, tmp_path: Path) -> None:
    # Twice as wide (hidden 1152, 18 query heads in 9 KV groups of 2): the full 4096 is the same code.
    shape = WideShape(hidden=1152, intermediate=3072, kv_heads=9)
    params = build_wide(source, tmp_path / "wide", shape, dtype_name="float32")
    cfg = json.loads((tmp_path / "wide" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (1152, 18, 9)
    assert params > 2.5 * 134_000_000
    assert _greedy(tmp_path / "wide") == _greedy(source)


def test_full_shape_is_7b_class(source: Path) -> None:
    cfg = json.loads((source / "config.json").read_text())
    shape = WideShape()
    check_shape(cfg, shape)
    h, i, layers, vocab = shape.hidden, shape.intermediate, cfg["num_hidden_layers"], cfg["vocab_size"]
    per_layer = 2 * h * h + 2 * h * shape.kv_heads * 64 + 3 * h * i + 2 * h
    assert 6.5e9 < layers * per_layer + vocab * h + h < 7.0e9


def test_shapes_that_cannot_hold_the_source_are_refused(source: Path) -> None:
    cfg = json.loads((source / "config.json").read_text())
    with pytest.raises(ValueError, match="kv_heads"):
        check_shape(cfg, WideShape(hidden=1152, intermediate=3072, kv_heads=6))
    with pytest.raises(ValueError, match="intermediate"):
        check_shape(cfg, WideShape(hidden=1152, intermediate=1024, kv_heads=9))


def test_mid_layer_draft(source: Path, tmp_path: Path) -> None:
    kept = build_without_layers(source, tmp_path / "mid", range(12, 17))
    cfg = json.loads((tmp_path / "mid" / "config.json").read_text())
    index = json.loads((tmp_path / "mid" / "model.safetensors.index.json").read_text())
    layers = {int(k.split(".")[2]) for k in index["weight_map"] if k.startswith("model.layers.")}
    assert kept == cfg["num_hidden_layers"] == 25
    assert layers == set(range(25))
    assert (tmp_path / "mid" / "tokenizer.json").is_file()
