"""Tiny random-weight EAGLE-3 heads shaped for the demo target (SmolLM2-135M: hidden 576, 30 layers,
vocabulary 49152), in the two layouts vLLM loads: the EAGLE format (``midlayer.*``, ``fc``, ``d2t``) and
the ``speculators`` format (``config.json`` with ``speculators_config``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

HIDDEN = 576
LAYERS = 30
VOCAB = 49152
HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 9, 3, 64, 1536
DRAFT_VOCAB = 2048
AUX_IDS = [2, 15, 27]


def write_head(
    out: Path,
    *,
    layout: str = "eagle",
    hidden: int = HIDDEN,
    target_hidden: int | None = None,
    vocab: int = VOCAB,
    draft_vocab: int = DRAFT_VOCAB,
    aux_ids: list[int] | None = AUX_IDS,
    d2t_shift: int = 0,
    d2t_length: int | None = None,
    architecture: str = "LlamaForCausalLMEagle3",
    seed: int = 0,
) -> Path:
    """One head's config.json and model.safetensors. ``d2t_shift`` is added to the last ``d2t`` entry (a
    draft token mapped past the target's vocabulary); ``target_hidden`` None leaves the key out (vLLM
    then reads ``hidden_size``)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    fc_in = (target_hidden or hidden) * len(aux_ids or AUX_IDS)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    d2t = np.zeros(d2t_length or draft_vocab, dtype=np.int64)
    d2t[-1] += d2t_shift
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    tensors = {
        f"{prefix}self_attn.q_proj.weight": w(HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * hidden),
        f"{prefix}self_attn.o_proj.weight": w(hidden, HEADS * HEAD_DIM),
        f"{prefix}mlp.gate_proj.weight": w(INTERMEDIATE, hidden),
        f"{prefix}mlp.up_proj.weight": w(INTERMEDIATE, hidden),
        f"{prefix}mlp.down_proj.weight": w(hidden, INTERMEDIATE),
        f"{prefix}input_layernorm.weight": np.ones(hidden, dtype=np.float32),
        f"{prefix}hidden_norm.weight": np.ones(hidden, dtype=np.float32),
        f"{prefix}post_attention_layernorm.weight": np.ones(hidden, dtype=np.float32),
        "norm.weight": np.ones(hidden, dtype=np.float32),
        "fc.weight": w(hidden, fc_in),
        "lm_head.weight": w(draft_vocab, hidden),
        "d2t": d2t,
        "t2d": np.zeros(vocab, dtype=bool),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    layer: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    eagle3: dict[str, Any] = {"draft_vocab_size": draft_vocab}
    if target_hidden is not None:
        eagle3["target_hidden_size"] = target_hidden
    if aux_ids is not None:
        eagle3["eagle_aux_hidden_state_layer_ids"] = aux_ids
    if layout == "eagle":
        config = {**layer, **eagle3}
    else:
        config = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "transformer_layer_config": layer,
            "norm_before_residual": True,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {
                    "name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "architectures": ["LlamaForCausalLM"],
                },
            },
            **eagle3,
        }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def write_eagle1_head(out: Path, hidden: int = HIDDEN) -> Path:
    """An EAGLE-1 head's layout (config.json of a plain Llama, ``fc`` over embeddings and hidden states,
    ``layers.0.*``): enough for the checks, not for an engine."""
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        "fc.weight": np.zeros((hidden, 2 * hidden), dtype=np.float32),
        "layers.0.self_attn.q_proj.weight": np.zeros((HEADS * HEAD_DIM, hidden), dtype=np.float32),
    }
    save_file(tensors, str(out / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "vocab_size": VOCAB}
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    return out
