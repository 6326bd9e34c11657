"""Widen an EAGLE-3 head trained for SmolLM2-135M into one for the widened target (tuner/models/wide.py).

The widened target computes the 135M's function with its residual stream padded by zeros: every hidden
state vLLM hands a head (the three auxiliary layers' inputs) is the 135M's followed by zeros, and its
embeddings are the 135M's padded the same way. A head widened with the same recipe therefore computes, on
the wide target, what the small head computes on the 135M:

- ``fc`` [hidden, 3 x target_hidden]: each auxiliary state's block of columns moves to its new offset
  (k x wide hidden), rows padded with zeros; its output is the small head's padded with zeros.
- ``input_norm`` (``norm_before_fc``, one RMSNorm over the three states together) and every other RMSNorm:
  weights x sqrt(576 / wide hidden) on the original entries, zeros elsewhere, and ``rms_norm_eps`` x 576 /
  wide hidden (one eps for all norms: the concatenation's ratio 1728 / 12288 is the same), so each norm
  divides by the same root mean square as before.
- the first decoder layer's q/k/v take [embeddings, hidden] (2 x hidden columns): each half's columns move
  to its new offset, and the heads are placed as wide.py places the target's (original query head j alone
  in KV group j, KV head j copying original KV head j // group); o_proj, gate/up/down as in wide.py.
- ``embed_tokens`` and ``lm_head`` (draft vocabulary rows): columns padded with zeros; ``d2t``/``t2d`` kept.

So the head's acceptance on the wide target is the small head's on the 135M, up to the wide target's
bfloat16 rounding: no GPU training. ``tests/test_eagle3_wide.py`` checks the function with tiny random
shapes; ``benchmarks/eagle3_head.py widen-check`` checks it end to end on vLLM.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tuner.models.wide import HEAD_DIM, WideShape

WEIGHTS = "model.safetensors"


def _layer_config(config: dict[str, Any]) -> dict[str, Any]:
    """speculators keeps the decoder's shape in ``transformer_layer_config``; EAGLE-format heads at the top."""
    inner = config.get("transformer_layer_config")
    return inner if isinstance(inner, dict) else config


def widened_head_config(config: dict[str, Any], shape: WideShape, dtype_name: str | None = None) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    layer = _layer_config(out)
    h0 = layer["hidden_size"]
    layer.update(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=HEAD_DIM,
        rms_norm_eps=layer["rms_norm_eps"] * h0 / shape.hidden,
    )
    if dtype_name is not None:
        for key in ("torch_dtype", "dtype"):
            if key in layer:
                layer[key] = dtype_name
    if out.get("target_hidden_size") is not None:
        out["target_hidden_size"] = shape.hidden
    return out


def widen_head_tensors(
    tensors: Callable[[str], Any], names: Iterable[str], layer: dict[str, Any], shape: WideShape, dtype: Any
) -> Iterable[tuple[str, Any]]:
    """(name, widened tensor) for every tensor of a head whose decoder shape is ``layer`` (the small one)."""
    import torch

    h0, i0 = layer["hidden_size"], layer["intermediate_size"]
    heads0, kv0 = layer["num_attention_heads"], layer["num_key_value_heads"]
    if i0 > shape.intermediate:
        raise ValueError(f"intermediate {shape.intermediate} must be >= {i0}")
    group0, group = heads0 // kv0, shape.heads // shape.kv_heads
    scale = math.sqrt(h0 / shape.hidden)
    q_pos: list[int | None] = [None] * shape.heads
    for j in range(heads0):
        q_pos[j * group] = j
    kv_pos: list[int | None] = [j // group0 if j < heads0 else None for j in range(shape.kv_heads)]

    def blocks(t: Any, rows_out: int, n_blocks: int, block0: int, block: int, row_map: Any = None) -> Any:
        """Column block k of width block0 -> columns [k*block, k*block + block0); rows by row_map or padded."""
        out = torch.zeros((rows_out, n_blocks * block), dtype=dtype)
        src = t if row_map is None else row_map(t)
        for k in range(n_blocks):
            out[: src.shape[0], k * block : k * block + block0] = src[:, k * block0 : (k + 1) * block0]
        return out

    def heads_rows(positions: list[int | None], n_out: int) -> Callable[[Any], Any]:
        def place(t: Any) -> Any:
            out = torch.zeros((n_out * HEAD_DIM, t.shape[1]), dtype=dtype)
            for new, old in enumerate(positions):
                if old is not None:
                    out[new * HEAD_DIM : (new + 1) * HEAD_DIM] = t[old * HEAD_DIM : (old + 1) * HEAD_DIM]
            return out

        return place

    def pad(t: Any, rows: int, cols: int | None = None) -> Any:
        out = torch.zeros((rows,) if cols is None else (rows, cols), dtype=dtype)
        if cols is None:
            out[: t.shape[0]] = t
        else:
            out[: t.shape[0], : t.shape[1]] = t
        return out

    for name in names:
        t = tensors(name)
        if name in ("d2t", "t2d") or not t.is_floating_point():
            yield name, t
            continue
        t = t.to(dtype)
        if name.endswith("fc.weight"):
            yield name, blocks(t, shape.hidden, t.shape[1] // h0, h0, shape.hidden)
        elif name.endswith("input_norm.weight"):  # norm_before_fc: one norm over the aux states side by side
            n = t.shape[0] // h0
            yield name, blocks((t * scale)[None, :], 1, n, h0, shape.hidden)[0]
        elif name.endswith("q_proj.weight"):
            n_in = t.shape[1] // h0
            yield name, blocks(t, shape.heads * HEAD_DIM, n_in, h0, shape.hidden, heads_rows(q_pos, shape.heads))
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            n_in = t.shape[1] // h0
            rows = heads_rows(kv_pos, shape.kv_heads)
            yield name, blocks(t, shape.kv_heads * HEAD_DIM, n_in, h0, shape.hidden, rows)
        elif name.endswith("o_proj.weight"):
            out = torch.zeros((shape.hidden, shape.heads * HEAD_DIM), dtype=dtype)
            for new, old in enumerate(q_pos):
                if old is not None:
                    out[:h0, new * HEAD_DIM : (new + 1) * HEAD_DIM] = t[:, old * HEAD_DIM : (old + 1) * HEAD_DIM]
            yield name, out
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            yield name, pad(t, shape.intermediate, shape.hidden)
        elif name.endswith("down_proj.weight"):
            yield name, pad(t, shape.hidden, shape.intermediate)
        elif name.endswith("norm.weight"):
            yield name, pad(t * scale, shape.hidden)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            yield name, pad(t, t.shape[0], shape.hidden)
        else:
            raise ValueError(f"widening a head does not know tensor {name} of shape {tuple(t.shape)}")


def widen_head(src: Path, dst: Path, shape: WideShape | None = None, dtype_name: str = "bfloat16") -> int:
    """Write the widened head of ``src`` to ``dst`` (default: the wide target's shape); returns its parameters."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from tuner.models.wide import check_shape

    shape = shape or WideShape()
    config = json.loads((src / "config.json").read_text())
    layer = _layer_config(config)
    check_shape(layer, shape)
    dtype = getattr(torch, dtype_name)
    dst.mkdir(parents=True, exist_ok=True)
    with safe_open(str(src / WEIGHTS), framework="pt") as handle:
        names = list(handle.keys())
        widened = dict(widen_head_tensors(handle.get_tensor, names, layer, shape, dtype))
    save_file({k: v.contiguous() for k, v in widened.items()}, str(dst / WEIGHTS), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(widened_head_config(config, shape, dtype_name), indent=2) + "\n")
    for item in src.iterdir():
        if item.is_file() and item.name not in (WEIGHTS, "config.json") and item.suffix in (".json", ".txt", ".jinja"):
            shutil.copy2(item, dst / item.name)
    return sum(int(v.numel()) for v in widened.values())
