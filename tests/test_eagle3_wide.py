"""A widened EAGLE-3 head computes on zero-padded hidden states what the small head computes on the originals.

The head's forward below follows vLLM 0.32's llama_eagle3.py (norm_before_fc, norm_before_residual and
norm_output as speculators 0.9.0 trains them): fc over the three auxiliary states, the first layer over
[input_layernorm(embeds), hidden_norm(hidden)], attention with RoPE and grouped KV heads, MLP, final norm,
lm_head over the draft vocabulary; the second drafting step feeds the head's own (normed) output back.
Tiny random shapes; a wrong offset for any padded block changes the logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tuner.models.eagle3_wide import widen_head, widen_head_tensors, widened_head_config
from tuner.models.wide import WideShape

H0, HEADS0, KV0, I0, VOCAB, DRAFT_VOCAB = 128, 2, 1, 192, 50, 20
SMALL = {
    "hidden_size": H0,
    "intermediate_size": I0,
    "num_attention_heads": HEADS0,
    "num_key_value_heads": KV0,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
WIDE = WideShape(hidden=512, intermediate=384, kv_heads=4)


def random_head(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    def norm(n: int) -> torch.Tensor:
        return 1 + 0.3 * torch.randn(n, generator=g)

    p = "layers.0."
    return {
        "embed_tokens.weight": r(VOCAB, H0),
        "fc.weight": r(H0, 3 * H0),
        "input_norm.weight": norm(3 * H0),
        p + "input_layernorm.weight": norm(H0),
        p + "hidden_norm.weight": norm(H0),
        p + "self_attn.q_proj.weight": r(HEADS0 * 64, 2 * H0),
        p + "self_attn.k_proj.weight": r(KV0 * 64, 2 * H0),
        p + "self_attn.v_proj.weight": r(KV0 * 64, 2 * H0),
        p + "self_attn.o_proj.weight": r(H0, HEADS0 * 64),
        p + "post_attention_layernorm.weight": norm(H0),
        p + "mlp.gate_proj.weight": r(I0, H0),
        p + "mlp.up_proj.weight": r(I0, H0),
        p + "mlp.down_proj.weight": r(H0, I0),
        "norm.weight": norm(H0),
        "lm_head.weight": r(DRAFT_VOCAB, H0),
        "d2t": torch.arange(DRAFT_VOCAB, dtype=torch.long),
    }


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = pos[:, None].float() * theta ** (-torch.arange(half).float() / half)
    cos, sin = freqs.cos()[None], freqs.sin()[None]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def head_step(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, hidden: torch.Tensor) -> tuple:
    """One drafting step over a sequence: (draft logits, hidden state fed to the next step)."""
    eps, heads, kv = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    p, n = "layers.0.", ids.shape[0]
    embeds = w["embed_tokens.weight"][ids]
    x = torch.cat(
        [rms(embeds, w[p + "input_layernorm.weight"], eps), rms(hidden, w[p + "hidden_norm.weight"], eps)], -1
    )
    residual = rms(hidden, w[p + "hidden_norm.weight"], eps)  # norm_before_residual
    pos = torch.arange(n)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, 64).transpose(0, 1)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).view(n, kv, 64).transpose(0, 1)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(n, kv, 64).transpose(0, 1)
    q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = residual + att.transpose(0, 1).reshape(n, heads * 64) @ w[p + "self_attn.o_proj.weight"].T
    m = rms(h, w[p + "post_attention_layernorm.weight"], eps)
    act = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
    h = h + act @ w[p + "mlp.down_proj.weight"].T
    out = rms(h, w["norm.weight"], eps)
    return out @ w["lm_head.weight"].T, out  # norm_output: the normed state goes to the next step


def draft(w: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, aux: torch.Tensor) -> list[torch.Tensor]:
    combined = rms(aux, w["input_norm.weight"], cfg["rms_norm_eps"]) @ w["fc.weight"].T  # norm_before_fc
    logits1, fed_back = head_step(w, cfg, ids, combined)
    logits2, _ = head_step(w, cfg, ids, fed_back)
    return [logits1, logits2]


def pad_aux(aux: torch.Tensor, hidden: int) -> torch.Tensor:
    """The wide target's three auxiliary states: each the small target's followed by zeros."""
    out = torch.zeros(aux.shape[0], 3 * hidden, dtype=aux.dtype)
    for k in range(3):
        out[:, k * hidden : k * hidden + H0] = aux[:, k * H0 : (k + 1) * H0]
    return out


def widened(w: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    cfg = widened_head_config({"transformer_layer_config": SMALL}, WIDE)["transformer_layer_config"]
    return dict(widen_head_tensors(w.__getitem__, list(w), SMALL, WIDE, torch.float64)), cfg


def test_widened_head_drafts_what_the_small_head_drafts() -> None:
    w = {k: (v.double() if v.is_floating_point() else v) for k, v in random_head().items()}
    ids = torch.tensor([3, 17, 42, 8, 0, 25, 11])
    aux = torch.randn(len(ids), 3 * H0, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    wide_w, wide_cfg = widened(w)
    assert wide_w["fc.weight"].shape == (WIDE.hidden, 3 * WIDE.hidden)
    assert wide_cfg["num_attention_heads"] == WIDE.heads and wide_cfg["hidden_size"] == WIDE.hidden
    for small, wide in zip(
        draft(w, SMALL, ids, aux), draft(wide_w, wide_cfg, ids, pad_aux(aux, WIDE.hidden)), strict=True
    ):
        torch.testing.assert_close(wide, small, rtol=1e-9, atol=1e-9)
    assert torch.equal(wide_w["d2t"], w["d2t"])


def test_a_wrongly_placed_block_changes_the_drafts() -> None:
    """The check above sees padding mistakes: the second aux state's columns one block early differ."""
    w = {k: (v.double() if v.is_floating_point() else v) for k, v in random_head().items()}
    ids = torch.tensor([1, 2, 3, 4])
    aux = torch.randn(len(ids), 3 * H0, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    wide_w, wide_cfg = widened(w)
    wrong = dict(wide_w)
    wrong["fc.weight"] = wide_w["fc.weight"].clone()
    wrong["fc.weight"][:, H0 : 2 * H0] = wide_w["fc.weight"][:, WIDE.hidden : WIDE.hidden + H0]
    wrong["fc.weight"][:, WIDE.hidden : WIDE.hidden + H0] = 0
    small = draft(w, SMALL, ids, aux)[0]
    assert not torch.allclose(draft(wrong, wide_cfg, ids, pad_aux(aux, WIDE.hidden))[0], small)


def test_widen_head_writes_a_speculators_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    src, dst = tmp_path / "small", tmp_path / "wide"
    src.mkdir()
    save_file(random_head(), str(src / "model.safetensors"))
    config = {"speculators_model_type": "eagle3", "transformer_layer_config": SMALL, "draft_vocab_size": DRAFT_VOCAB}
    (src / "config.json").write_text(json.dumps(config))
    widen_head(src, dst, WIDE, "float32")
    out = json.loads((dst / "config.json").read_text())
    assert out["transformer_layer_config"]["hidden_size"] == WIDE.hidden
    assert out["transformer_layer_config"]["rms_norm_eps"] == pytest.approx(1e-5 * H0 / WIDE.hidden)
    tensors = load_file(str(dst / "model.safetensors"))
    assert tensors["layers.0.self_attn.q_proj.weight"].shape == (WIDE.heads * 64, 2 * WIDE.hidden)
    assert tensors["lm_head.weight"].shape == (DRAFT_VOCAB, WIDE.hidden)
