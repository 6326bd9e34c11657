"""A 7B-class target built from SmolLM2-135M that computes the same function (Net2Net-style widening).

Users tune 7B-70B targets, where a decode step is bound by reading the weights; no such checkpoint can
be downloaded here, so the packaged 135M model is padded with zeros to the shape (and cost) of a 7B
Llama while its greedy tokens stay those of the 135M model:

- hidden 576 -> ``hidden``, intermediate 1536 -> ``intermediate``, layers kept, head_dim 64 kept;
- query heads 9 -> ``hidden // 64``; original head j sits alone in KV group j (position j * group);
- KV heads 3 -> ``kv_heads``; new KV head j copies original KV head j // 3 for j < 9, zeros otherwise;
- every other new row and column (q/k/v/o, gate/up/down, tied embeddings) is zero, so the padded
  dimensions of the residual stream stay zero, and the zero columns of o_proj and down_proj drop
  whatever the padded heads and channels compute;
- RMSNorm weights x sqrt(576 / hidden) and ``rms_norm_eps`` x 576 / hidden keep the normalisation of
  the original dimensions unchanged (the mean of squares now runs over ``hidden`` entries).

The same module cuts the drafts that share the tokenizer: the 135M itself, and the 135M with a run
of middle layers removed.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEAD_DIM = 64
SHARD_BYTES = 4 * 2**30
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "config.json", "pytorch_model.bin")


@dataclass(frozen=True)
class WideShape:
    hidden: int = 4096
    intermediate: int = 14336
    kv_heads: int = 16

    @property
    def heads(self) -> int:
        return self.hidden // HEAD_DIM


def check_shape(src: dict[str, Any], shape: WideShape) -> None:
    """The widening only works for shapes that contain the source's heads, groups and channels."""
    src_heads, src_kv = src["num_attention_heads"], src["num_key_value_heads"]
    problems = []
    if shape.hidden % HEAD_DIM or shape.hidden < src["hidden_size"]:
        problems.append(f"hidden {shape.hidden} must be a multiple of {HEAD_DIM} and >= {src['hidden_size']}")
    if shape.intermediate < src["intermediate_size"]:
        problems.append(f"intermediate {shape.intermediate} must be >= {src['intermediate_size']}")
    if shape.kv_heads < src_heads or shape.heads % shape.kv_heads:
        problems.append(
            f"kv_heads {shape.kv_heads} must be >= {src_heads} (one group per original query head) "
            f"and divide the {shape.heads} query heads"
        )
    if src["hidden_size"] // src_heads != HEAD_DIM or src_heads % src_kv:
        problems.append("the source must have head_dim 64 and grouped KV heads")
    if problems:
        raise ValueError("; ".join(problems))


def widen_state_dict(
    tensors: Callable[[str], Any], names: Iterable[str], src: dict[str, Any], shape: WideShape, dtype: Any
) -> Iterable[tuple[str, Any]]:
    """Yield (name, widened tensor) one at a time, so the 13 GB result never has to sit in memory twice."""
    import torch

    h0 = src["hidden_size"]
    heads0, kv0 = src["num_attention_heads"], src["num_key_value_heads"]
    group0 = heads0 // kv0
    group = shape.heads // shape.kv_heads
    norm_scale = math.sqrt(h0 / shape.hidden)

    def pad(t: Any, rows: int, cols: int | None = None) -> Any:
        out = torch.zeros((rows,) if cols is None else (rows, cols), dtype=dtype)
        if cols is None:
            out[: t.shape[0]] = t
        else:
            out[: t.shape[0], : t.shape[1]] = t
        return out

    def place_heads(t: Any, positions: list[int], n_out: int, by_rows: bool) -> Any:
        """Copy original head h's slice (rows or columns of width 64) to each of its new positions."""
        out = torch.zeros(
            (n_out * HEAD_DIM, shape.hidden) if by_rows else (shape.hidden, n_out * HEAD_DIM), dtype=dtype
        )
        for new, old in enumerate(positions):
            if old is None:
                continue
            src_sl, dst_sl = slice(old * HEAD_DIM, (old + 1) * HEAD_DIM), slice(new * HEAD_DIM, (new + 1) * HEAD_DIM)
            if by_rows:
                out[dst_sl, :h0] = t[src_sl, :]
            else:
                out[:h0, dst_sl] = t[:, src_sl]
        return out

    # New query head j*group holds original head j; new KV head j serves it with original KV head j // group0.
    q_positions: list[Any] = [None] * shape.heads
    for j in range(heads0):
        q_positions[j * group] = j
    kv_positions: list[Any] = [j // group0 if j < heads0 else None for j in range(shape.kv_heads)]

    for name in names:
        t = tensors(name).to(dtype)
        if name.endswith("q_proj.weight"):
            yield name, place_heads(t, q_positions, shape.heads, by_rows=True)
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            yield name, place_heads(t, kv_positions, shape.kv_heads, by_rows=True)
        elif name.endswith("o_proj.weight"):
            yield name, place_heads(t, q_positions, shape.heads, by_rows=False)
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            yield name, pad(t, shape.intermediate, shape.hidden)
        elif name.endswith("down_proj.weight"):
            yield name, pad(t, shape.hidden, shape.intermediate)
        elif name.endswith("norm.weight"):
            yield name, pad(t * norm_scale, shape.hidden)
        elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
            yield name, pad(t, t.shape[0], shape.hidden)
        else:
            raise ValueError(f"widening does not know tensor {name} of shape {tuple(t.shape)}")
        del t


def widened_config(src: dict[str, Any], shape: WideShape, dtype_name: str) -> dict[str, Any]:
    cfg = dict(src)
    cfg.update(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=HEAD_DIM,
        rms_norm_eps=src["rms_norm_eps"] * src["hidden_size"] / shape.hidden,
    )
    # transformers 5 reads "dtype", older releases "torch_dtype"; set the one the source used.
    cfg["torch_dtype" if "torch_dtype" in src else "dtype"] = dtype_name
    return cfg


def _open_safetensors(path: Path) -> tuple[Callable[[str], Any], list[str], Any]:
    from safetensors import safe_open

    handle = safe_open(str(path / "model.safetensors"), framework="pt")
    return handle.get_tensor, list(handle.keys()), handle


def _write_sharded(items: Iterable[tuple[str, Any]], dst: Path) -> int:
    """Shards of about SHARD_BYTES plus the index vLLM and transformers read; returns the parameter count."""
    from safetensors.torch import save_file

    shard: dict[str, Any] = {}
    size = 0
    shards: list[dict[str, Any]] = []
    params = 0

    def flush() -> None:
        nonlocal shard, size
        if shard:
            shards.append(shard)
            name = f"model-{len(shards):05d}.safetensors"
            save_file(shard, str(dst / name), metadata={"format": "pt"})
            shards[-1] = {k: name for k in shard}
            shard, size = {}, 0

    total_bytes = 0
    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > SHARD_BYTES:
            flush()
        shard[name] = tensor.contiguous()
        size += nbytes
        total_bytes += nbytes
        params += tensor.numel()
    flush()
    weight_map = {k: v for s in shards for k, v in s.items()}
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return params


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for item in src.iterdir():
        if item.is_file() and item.name not in WEIGHT_FILES and not item.name.startswith("model-"):
            shutil.copy2(item, dst / item.name)


def build_wide(src: Path, dst: Path, shape: WideShape = WideShape(), dtype_name: str = "bfloat16") -> int:
    """Write the widened checkpoint of ``src`` (a plain HF Llama checkpoint) to ``dst``; returns parameters."""
    import torch

    src_cfg = json.loads((src / "config.json").read_text())
    check_shape(src_cfg, shape)
    get, names, _handle = _open_safetensors(src)
    dst.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(src, dst)
    dtype = getattr(torch, dtype_name)
    params = _write_sharded(widen_state_dict(get, names, src_cfg, shape, dtype), dst)
    (dst / "config.json").write_text(json.dumps(widened_config(src_cfg, shape, dtype_name), indent=2) + "\n")
    return params


def build_without_layers(src: Path, dst: Path, drop: range) -> int:
    """``src`` with decoder layers ``drop`` removed and the rest renumbered; returns the layers kept."""
    import re

    src_cfg = json.loads((src / "config.json").read_text())
    total = src_cfg["num_hidden_layers"]
    kept = [i for i in range(total) if i not in drop]
    renumber = {old: new for new, old in enumerate(kept)}
    get, names, _handle = _open_safetensors(src)
    pattern = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")

    def items() -> Iterable[tuple[str, Any]]:
        for name in names:
            m = pattern.match(name)
            if m is None:
                yield name, get(name)
            elif int(m.group(2)) in renumber:
                yield f"{m.group(1)}{renumber[int(m.group(2))]}{m.group(3)}", get(name)

    dst.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(src, dst)
    _write_sharded(items(), dst)
    cfg = dict(src_cfg, num_hidden_layers=len(kept))
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = [cfg["layer_types"][i] for i in kept]
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return len(kept)
