"""Will this EAGLE head serve this target? Its shapes against the target's, read from config.json and the
safetensors headers (only the small ``d2t`` tensor's data is read), without an engine.

A head has no tokenizer of its own: it drafts from the target's hidden states into the target's vocabulary,
so the pair check's tokenizer comparison does not apply. What breaks a head is its shape: vLLM builds the
head from its config and then fails on a weight's shape, or runs and accepts nothing. The rules are vLLM
0.32's: ``vllm/model_executor/models/llama_eagle3.py`` (``fc`` takes ``target_hidden_size`` × the number of
auxiliary layers, ``target_hidden_size`` defaulting to ``hidden_size``; draft token i is target token
i + d2t[i]), ``vllm/transformers_utils/configs/speculators/algos.py`` (the speculators layout) and
``vllm/transformers_utils/configs/eagle.py`` (the architecture's name).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from tuner.study.pair_check import PairReport, PairRow, read_config, tensor_headers

HeadMethod = Literal["eagle", "eagle3"]
# The target's layers whose hidden states vLLM hands an EAGLE-3 head when the head names none
# (SupportsEagle3.get_eagle3_default_aux_hidden_state_layers, vllm/model_executor/models/interfaces.py).
DEFAULT_AUX = "vLLM's default (2, L // 2, L - 3)"


class HeadInfo(BaseModel):
    """What vLLM reads of a head, in either layout."""

    layout: Literal["eagle", "speculators"]
    method: HeadMethod
    architecture: str | None
    hidden_size: int | None
    target_hidden_size: int | None  # as vLLM reads it: hidden_size when the head leaves it out
    vocab_size: int | None
    draft_vocab_size: int | None  # vocab_size when the head leaves it out
    aux_layer_ids: list[int] | None
    tensors: dict[str, list[int]]  # name -> shape, from the safetensors headers


def is_head(path: str) -> bool:
    """A folder in a layout vLLM loads as an EAGLE head (its config, or an EAGLE head's own weights)."""
    config = read_config(path)
    if config.get("speculators_config") is not None:
        return True
    if any("eagle" in str(a).lower() for a in config.get("architectures") or []):
        return True
    names = tensor_headers(path)
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names:
        return True
    # EAGLE-1: a plain architecture name, but an fc over embeddings and hidden states, and no model.* tree
    return "fc.weight" in names and not any(n.startswith("model.") for n in names)


def read_head(path: str, method: HeadMethod | None = None) -> HeadInfo:
    config = read_config(path)
    tensors = {name: shape for name, (_, shape) in tensor_headers(path).items()}
    if config.get("speculators_config") is not None:
        layer = dict(config.get("transformer_layer_config") or {})
        kind = config.get("speculators_model_type")
        layout: Literal["eagle", "speculators"] = "speculators"
        # vLLM maps the speculators type to its architecture (algos.py: update_eagle3).
        arch = {"llama": "Eagle3LlamaForCausalLM", "qwen3": "Eagle3Qwen3ForCausalLM"}.get(
            str(layer.get("model_type", "llama"))
        )
        guessed: HeadMethod = "eagle3" if kind in ("eagle3", "peagle") else "eagle"
        values = {**layer, **{k: config[k] for k in ("draft_vocab_size", "target_hidden_size") if k in config}}
        aux = config.get("eagle_aux_hidden_state_layer_ids")
    else:
        layout = "eagle"
        values = config
        archs = config.get("architectures") or []
        guessed = "eagle3" if any("eagle3" in str(a).lower() for a in archs) or "d2t" in tensors else "eagle"
        arch = _vllm_architecture(str(archs[0]), method or guessed) if archs else None
        eagle_config = config.get("eagle_config") or {}
        aux = config.get("eagle_aux_hidden_state_layer_ids") or eagle_config.get("eagle_aux_hidden_state_layer_ids")
    hidden = values.get("hidden_size")
    vocab = values.get("vocab_size")
    return HeadInfo(
        layout=layout,
        method=method or guessed,
        architecture=arch,
        hidden_size=hidden,
        target_hidden_size=values.get("target_hidden_size") or hidden,
        vocab_size=vocab,
        draft_vocab_size=values.get("draft_vocab_size") or vocab,
        aux_layer_ids=list(aux) if aux else None,
        tensors=tensors,
    )


def _vllm_architecture(arch: str, method: HeadMethod) -> str:
    """The name vLLM asks its registry for (EAGLEConfig in vllm/transformers_utils/configs/eagle.py)."""
    if method == "eagle3" or arch.startswith("Eagle3") or arch.endswith("Eagle3"):
        return arch if arch.startswith("Eagle3") or arch.endswith("Eagle3") else f"Eagle3{arch}"
    return arch if arch.startswith("Eagle") else f"Eagle{arch}"


def vllm_head_architectures() -> dict[str, str] | None:
    """vLLM's registered speculative architectures -> their module, read from the installed vLLM's
    registry source (importing vLLM costs tens of seconds); None without vLLM or when it is laid out
    otherwise."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    registry = Path(next(iter(spec.submodule_search_locations))) / "model_executor" / "models" / "registry.py"
    try:
        tree = ast.parse(registry.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_SPECULATIVE_DECODING_MODELS" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            return {str(name): str(where[0]) for name, where in value.items()}
    return None


def _d2t_targets(path: str) -> tuple[int, int] | None:
    """(lowest, highest) target id the head's draft tokens map to (i + d2t[i]); None without d2t."""
    import numpy as np
    from safetensors import safe_open

    for name, (file, _) in tensor_headers(path).items():
        if name == "d2t":
            with safe_open(str(file), framework="numpy") as fh:
                d2t = fh.get_tensor("d2t").astype(np.int64)
            mapped = np.arange(len(d2t), dtype=np.int64) + d2t
            return int(mapped.min()), int(mapped.max())
    return None


def check_head(target: str, head: str, method: str | None = None, flag: str = "") -> PairReport:
    """The head's shapes against the target's, as a head of ``method`` (eagle, eagle3; None: the head's own
    kind); each failing row's ``problem`` names the field and the fix, prefixed with ``flag`` (the
    command-line flag that named the head)."""
    kind: HeadMethod | None = "eagle3" if method == "eagle3" else "eagle" if method == "eagle" else None
    info = read_head(head, kind)
    t_cfg = read_config(target)
    t_hidden, t_vocab, t_layers = t_cfg.get("hidden_size"), t_cfg.get("vocab_size"), t_cfg.get("num_hidden_layers")
    report = PairReport()
    rows = report.rows
    where = f"{flag}: " if flag else ""

    def row(check: str, target_value: object, head_value: object, problem: str | None) -> None:
        rows.append(
            PairRow(check, str(target_value), str(head_value), problem is None, problem=problem and where + problem)
        )

    rows.append(PairRow("layout", "", f"{info.layout} ({info.method} head)", True, blocking=False))
    known = vllm_head_architectures()
    module = (known or {}).get(info.architecture or "")
    family = "eagle3" if info.method == "eagle3" else "_eagle"  # llama_eagle3 vs llama_eagle
    if known is None:
        rows.append(PairRow("architecture", "", f"{info.architecture} (vLLM's registry not readable)", True, False))
    else:
        arch_problem = None
        if module is None:
            arch_problem = (
                f"head architecture {info.architecture} is not one vLLM loads as a speculative head "
                "(config.json architectures); fix: use a head trained for vLLM (EAGLE or speculators layout)"
            )
        elif not module.endswith(family):
            arch_problem = (
                f"head architecture {info.architecture} is not an {info.method} head (vLLM loads it from {module}); "
                f"fix: set the candidate's method to the head's kind"
            )
        row("architecture", t_cfg.get("architectures", ["?"])[0], f"{info.architecture} ({module})", arch_problem)

    if info.method == "eagle3":
        th = info.target_hidden_size
        row(
            "target hidden size (target_hidden_size)",
            t_hidden,
            th,
            None
            if th == t_hidden
            else f"head hidden size {th} does not match the target's {t_hidden} (target_hidden_size); "
            f"fix: use a head trained for this target (hidden size {t_hidden})",
        )
    else:
        row(
            "hidden size (hidden_size)",
            t_hidden,
            info.hidden_size,
            None
            if info.hidden_size == t_hidden
            else f"head hidden size {info.hidden_size} does not match the target's {t_hidden} (hidden_size); "
            "fix: use a head trained for this target",
        )

    aux_count = _check_aux(info, t_layers, row)
    if not info.tensors:
        # A hub id's weights are not fetched for a check (config and tokenizer files only).
        rows.append(PairRow("weights", "", "not local: fc.weight, embeddings and d2t not checked", True, False))
    _check_fc(info, aux_count, row)
    if info.tensors and "embed_tokens.weight" not in info.tensors and info.hidden_size != t_hidden:
        row(
            "embeddings (shared with the target)",
            t_hidden,
            info.hidden_size,
            f"head hidden size {info.hidden_size} cannot share the target's {t_hidden}-wide embeddings and the head "
            "has no embed_tokens.weight (hidden_size); fix: use a head of the target's hidden size or one with its "
            "own embed_tokens",
        )

    row(
        "vocabulary (vocab_size)",
        t_vocab,
        info.vocab_size,
        None
        if info.vocab_size == t_vocab
        else f"head vocabulary {info.vocab_size} does not match the target's {t_vocab} (vocab_size); "
        "fix: use a head trained for this target's tokenizer",
    )
    if info.method == "eagle3":
        _check_draft_vocab(head, info, t_vocab, row, weights=bool(info.tensors))
    checked = ", ".join(r.check for r in rows if r.blocking)
    report.advice.append(
        f"checked as an {info.method} head ({info.layout} layout): {checked}; no tokenizer (a head has none)"
    )
    return report


def _check_aux(info: HeadInfo, t_layers: Any, row: Any) -> int:
    """The auxiliary layers' rows; returns how many hidden states the head's fc takes."""
    if info.method != "eagle3":
        return 1
    ids = info.aux_layer_ids
    if ids is None:
        row("auxiliary layers (eagle_aux_hidden_state_layer_ids)", f"{t_layers} layers", DEFAULT_AUX, None)
        return 3
    # The target records layer i's input (0) or output (i+1): ids 0..num_hidden_layers
    # (vllm/model_executor/models/llama.py, _maybe_add_hidden_state); ids are a set there.
    bad = [i for i in ids if not isinstance(i, int) or not 0 <= i <= (t_layers or 0)]
    problem = None
    if bad:
        problem = (
            f"head auxiliary layer {bad[0]} is outside the target's {t_layers} layers (0-{t_layers}) "
            "(eagle_aux_hidden_state_layer_ids); fix: use a head trained for this target, or layer ids within "
            f"0-{t_layers}"
        )
    elif len(set(ids)) != len(ids):
        problem = (
            f"head auxiliary layers {ids} repeat a layer, which vLLM reads once "
            "(eagle_aux_hidden_state_layer_ids); fix: list each layer once"
        )
    row("auxiliary layers (eagle_aux_hidden_state_layer_ids)", f"{t_layers} layers", ids, problem)
    return len(ids)


def _check_fc(info: HeadInfo, aux_count: int, row: Any) -> None:
    shape = info.tensors.get("fc.weight")
    if shape is None:
        return
    width = (info.target_hidden_size or 0) * aux_count if info.method == "eagle3" else 2 * (info.hidden_size or 0)
    expected = [info.hidden_size, width]
    row(
        "fc.weight shape",
        f"[{info.hidden_size}, {width}]",
        shape,
        None
        if shape == expected
        else f"head fc.weight is {shape}, its config says {expected} (hidden_size, target_hidden_size, "
        "eagle_aux_hidden_state_layer_ids); fix: a config.json that matches the head's weights",
    )


def _check_draft_vocab(head: str, info: HeadInfo, t_vocab: Any, row: Any, weights: bool) -> None:
    draft_vocab = info.draft_vocab_size
    lm_head = info.tensors.get("lm_head.weight")
    problem = None
    if draft_vocab is None or t_vocab is None or draft_vocab > t_vocab:
        problem = (
            f"head draft vocabulary {draft_vocab} is larger than the target's {t_vocab} (draft_vocab_size); "
            "fix: use a head trained for this target"
        )
    elif lm_head is not None and lm_head[0] != draft_vocab:
        problem = (
            f"head lm_head.weight has {lm_head[0]} rows, its config says {draft_vocab} (draft_vocab_size); "
            "fix: a config.json that matches the head's weights"
        )
    row("draft vocabulary (draft_vocab_size)", t_vocab, draft_vocab, problem)
    if not weights:
        return
    d2t_shape = info.tensors.get("d2t")
    if d2t_shape is None:
        row(
            "draft-to-target ids (d2t)",
            t_vocab,
            "none",
            None
            if draft_vocab == t_vocab
            else f"head drafts {draft_vocab} tokens but has no d2t to map them to the target's {t_vocab} "
            "(d2t); fix: use a head checkpoint with its d2t tensor",
        )
        return
    if d2t_shape != [draft_vocab]:
        row(
            "draft-to-target ids (d2t)",
            f"[{draft_vocab}]",
            d2t_shape,
            f"head d2t has shape {d2t_shape}, not [{draft_vocab}] (d2t, draft_vocab_size); "
            "fix: a config.json whose draft_vocab_size matches the head's d2t",
        )
        return
    low, high = _d2t_targets(head) or (0, 0)
    row(
        "draft-to-target ids (d2t)",
        f"ids 0-{int(t_vocab) - 1}",
        f"ids {low}-{high}",
        None
        if 0 <= low and high < t_vocab
        else f"head d2t maps draft tokens to target id {high if high >= t_vocab else low}, outside the target's "
        f"0-{int(t_vocab) - 1} (d2t); fix: use a head trained for this target's vocabulary",
    )
