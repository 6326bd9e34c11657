"""Will this draft work with this target? Tokenizers and model sizes, compared without an engine.

The classic failure is a draft whose tokenizer differs from the target's: vLLM then either refuses
the pair or accepts almost nothing. Checking costs seconds; finding out on a GPU costs minutes.
"""

from __future__ import annotations

import copy
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Code, several scripts, whitespace runs, emoji and special characters.
PROBE_TEXTS = (
    "def add(a: int, b: int) -> int:\n    return a + b  # sum\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "The quick brown fox jumps over the lazy dog. 1234567890",
    "Größe, café, naïve — «quotes» and ‘single’ ones.",
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "東京は日本の首都です。今日はいい天気ですね。",
    "مرحبا بالعالم، كيف حالك؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "emoji 🚀🔥✨ and symbols ©®™ ≤≥≠ ∑∫√ <|tag|> {json: [1, 2]}\t\t  spaces",
)
SIZE_ADVICE = (4.0, 10.0)  # target : draft parameter ratio usually worth trying


@dataclass
class PairRow:
    check: str
    target: str
    draft: str
    ok: bool
    blocking: bool = True
    problem: str | None = None  # the one-line reason and fix, when "X differs" would not say it


@dataclass
class PairReport:
    rows: list[PairRow] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)

    @property
    def compatible(self) -> bool:
        return all(r.ok for r in self.rows if r.blocking)

    @property
    def reason(self) -> str:
        bad = [r for r in self.rows if r.blocking and not r.ok]
        return "; ".join(r.problem or f"{r.check} differs (target {r.target}, draft {r.draft})" for r in bad)


def _load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _first_vocab_difference(target: dict[str, int], draft: dict[str, int]) -> tuple[str, str] | None:
    """The first token (by target id, then draft id) whose id differs, as (target side, draft side)."""
    if target == draft:
        return None
    for token, tid in sorted(target.items(), key=lambda item: item[1]):
        did = draft.get(token)
        if did != tid:
            return f"{token!r} → {tid}", f"{token!r} → {did if did is not None else 'missing'}"
    for token, did in sorted(draft.items(), key=lambda item: item[1]):
        if token not in target:
            return f"{token!r} missing", f"{token!r} → {did}"
    return None


def _merges(tokenizer: Any, path: str) -> list[tuple[str, ...]] | None:
    """BPE merges of the fast tokenizer (its tokenizer.json ``model.merges``), or None without BPE."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        model = json.loads(backend.to_str()).get("model", {})
    else:
        file = Path(path) / "tokenizer.json"
        model = json.loads(file.read_text(encoding="utf-8")).get("model", {}) if file.exists() else {}
    merges = model.get("merges")
    if merges is None:
        return None
    # tokenizers writes ["a", "b"] pairs; older files have "a b" strings
    return [tuple(m) if isinstance(m, list) else tuple(str(m).split(" ", 1)) for m in merges]


def _first_merge_difference(target: list[tuple[str, ...]], draft: list[tuple[str, ...]]) -> tuple[str, str] | None:
    if target == draft:
        return None
    for i in range(max(len(target), len(draft))):
        t = " + ".join(repr(x) for x in target[i]) if i < len(target) else "none"
        d = " + ".join(repr(x) for x in draft[i]) if i < len(draft) else "none"
        if t != d:
            return f"merge {i}: {t}", f"merge {i}: {d}"
    return None


def _added_tokens(tokenizer: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {
        int(i): f"{str(tok)!r}{' (special)' if getattr(tok, 'special', False) else ''}" for i, tok in decoder.items()
    }


def _first_id_difference(target: dict[int, str], draft: dict[int, str]) -> tuple[str, str] | None:
    for i in sorted(set(target) | set(draft)):
        if target.get(i) != draft.get(i):
            return f"id {i}: {target.get(i, 'none')}", f"id {i}: {draft.get(i, 'none')}"
    return None


def _special_tokens(tokenizer: Any) -> dict[str, str]:
    # PAD only fills batches (its id row below is a warning); the other roles shape what is generated.
    special = getattr(tokenizer, "special_tokens_map", None) or {}
    return {k: str(v) for k, v in special.items() if k != "pad_token"}


def _first_key_difference(target: dict[str, str], draft: dict[str, str]) -> tuple[str, str] | None:
    for key in sorted(set(target) | set(draft)):
        if target.get(key) != draft.get(key):
            return f"{key} {target.get(key)!r}", f"{key} {draft.get(key)!r}"
    return None


def _identity_rows(t_tok: Any, d_tok: Any, target: str, draft: str) -> list[PairRow]:
    """The whole vocabulary (token → id), the BPE merges and the added and special tokens: the same size
    and the same probe encodings do not prove the same ids."""
    rows = []
    t_vocab, d_vocab = t_tok.get_vocab(), d_tok.get_vocab()
    diff = _first_vocab_difference(t_vocab, d_vocab)
    rows.append(PairRow("vocabulary (token → id)", *(diff or (f"{len(t_vocab)} tokens", "identical")), ok=diff is None))
    t_merges, d_merges = _merges(t_tok, target), _merges(d_tok, draft)
    if t_merges is not None or d_merges is not None:
        merge_diff = _first_merge_difference(t_merges or [], d_merges or [])
        rows.append(
            PairRow(
                "BPE merges", *(merge_diff or (f"{len(t_merges or [])} merges", "identical")), ok=merge_diff is None
            )
        )
    t_added = _added_tokens(t_tok)
    added_diff = _first_id_difference(t_added, _added_tokens(d_tok))
    rows.append(
        PairRow("added tokens", *(added_diff or (f"{len(t_added)} tokens", "identical")), ok=added_diff is None)
    )
    t_special = _special_tokens(t_tok)
    special_diff = _first_key_difference(t_special, _special_tokens(d_tok))
    rows.append(
        PairRow(
            "special tokens (besides PAD)",
            *(special_diff or (f"{len(t_special)} entries", "identical")),
            ok=special_diff is None,
        )
    )
    return rows


def read_config(path: str) -> dict[str, Any]:
    cfg = Path(path) / "config.json"
    return json.loads(cfg.read_text()) if cfg.exists() else {}


def tensor_headers(path: str) -> dict[str, tuple[Path, list[int]]]:
    """Every tensor of the folder's safetensors files: its file and shape, from the headers alone."""
    tensors: dict[str, tuple[Path, list[int]]] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with file.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        tensors.update({name: (file, info["shape"]) for name, info in header.items() if name != "__metadata__"})
    return tensors


def count_parameters(path: str) -> int | None:
    """From safetensors headers only: no weights are read."""
    tensors = tensor_headers(path)
    if not tensors:
        return None
    total = 0
    for _, shape in tensors.values():
        n = 1
        for dim in shape:
            n *= dim
        total += n
    return total


def _fmt_params(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _files_stamp(path: str) -> tuple[str, tuple[tuple[str, int, int], ...]] | None:
    """The checkpoint folder's files by name, size and change time; None for what is not a local folder."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = sorted(f for f in folder.iterdir() if f.is_file())
    return str(folder.resolve()), tuple((f.name, (st := f.stat()).st_size, st.st_mtime_ns) for f in files)


# Reports of this process, by both folders' files: pre-flight compares the same pair again for each study a
# process runs (a test session runs many); two tokenizer loads are about two seconds.
_REPORTS: dict[tuple[object, ...], PairReport] = {}


def compare_pair(target: str, draft: str, trust_remote_code: bool = False, load_weights: bool = False) -> PairReport:
    del load_weights  # sizes come from file headers; kept for API clarity
    stamps = (_files_stamp(target), _files_stamp(draft))
    key = (*stamps, trust_remote_code)
    if None not in stamps and key in _REPORTS:
        return copy.deepcopy(_REPORTS[key])
    report = _compare(target, draft, trust_remote_code)
    if None not in stamps:
        _REPORTS[key] = copy.deepcopy(report)
    return report


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _without_tokenizer(target: str, draft: str) -> PairReport | None:
    """A folder with no tokenizer files (an EAGLE head, say) as a blocking row instead of a traceback."""
    sides = {"target": target, "draft": draft}
    has = {
        side: not Path(path).is_dir() or any((Path(path) / name).exists() for name in TOKENIZER_FILES)
        for side, path in sides.items()
    }
    if all(has.values()):
        return None
    problem = "; ".join(
        f"the {side} {sides[side]} has no tokenizer files ({', '.join(TOKENIZER_FILES)})"
        for side in sides
        if not has[side]
    )
    state = {side: "present" if has[side] else "none" for side in sides}
    fix = "fix: give a checkpoint with its tokenizer (an EAGLE head takes method: eagle3 or eagle)"
    return PairReport(
        rows=[PairRow("tokenizer files", state["target"], state["draft"], False, problem=f"{problem}; {fix}")]
    )


def _compare(target: str, draft: str, trust_remote_code: bool) -> PairReport:
    missing = _without_tokenizer(target, draft)
    if missing is not None:
        return missing
    t_tok = _load_tokenizer(target, trust_remote_code)
    d_tok = _load_tokenizer(draft, trust_remote_code)
    t_cfg, d_cfg = read_config(target), read_config(draft)
    report = PairReport()
    rows = report.rows

    t_vocab, d_vocab = len(t_tok), len(d_tok)
    rows.append(PairRow("tokenizer vocabulary size", str(t_vocab), str(d_vocab), t_vocab == d_vocab))
    t_emb, d_emb = t_cfg.get("vocab_size"), d_cfg.get("vocab_size")
    rows.append(PairRow("embedding rows (config vocab_size)", str(t_emb), str(d_emb), t_emb == d_emb))
    rows.extend(_identity_rows(t_tok, d_tok, target, draft))

    mismatched = [
        i
        for i, text in enumerate(PROBE_TEXTS)
        if t_tok.encode(text, add_special_tokens=False) != d_tok.encode(text, add_special_tokens=False)
    ]
    rows.append(
        PairRow(
            "token ids of probe texts",
            f"{len(PROBE_TEXTS)} texts",
            "identical" if not mismatched else f"{len(mismatched)} differ (e.g. text {mismatched[0] + 1})",
            not mismatched,
        )
    )
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        tv, dv = getattr(t_tok, name, None), getattr(d_tok, name, None)
        # PAD differences do not break speculation; BOS/EOS do.
        rows.append(PairRow(name.replace("_", " "), str(tv), str(dv), tv == dv, blocking=name != "pad_token_id"))
    t_chat = bool(getattr(t_tok, "chat_template", None))
    d_chat = bool(getattr(d_tok, "chat_template", None))
    rows.append(PairRow("chat template present", str(t_chat), str(d_chat), t_chat == d_chat, blocking=False))

    t_params, d_params = count_parameters(target), count_parameters(draft)
    rows.append(PairRow("parameters", _fmt_params(t_params), _fmt_params(d_params), True, blocking=False))
    if t_params and d_params:
        ratio = t_params / d_params
        rows.append(PairRow("size ratio target:draft", f"{ratio:.1f}:1", "", True, blocking=False))
        low, high = SIZE_ADVICE
        if ratio < low:
            report.advice.append(
                f"the draft is large for this target ({ratio:.1f}:1; {low:.0f}:1 to {high:.0f}:1 is usual): "
                "drafting may cost as much as it saves"
            )
        elif ratio > high * 5:
            report.advice.append(f"the draft is very small for this target ({ratio:.0f}:1): expect low acceptance")
    return report


def render(report: PairReport, target: str, draft: str) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"target {target}\ndraft  {draft}")
    for col in ("check", "target", "draft", "verdict"):
        table.add_column(col)
    for row in report.rows:
        verdict = "ok" if row.ok else ("INCOMPATIBLE" if row.blocking else "differs (warning)")
        table.add_row(escape(row.check), escape(row.target), escape(row.draft), verdict)
    buf = StringIO()
    console = Console(file=buf, width=110)
    console.print(table)
    for line in report.advice:
        console.print(f"advice: {line}")
    console.print("verdict: " + ("compatible" if report.compatible else f"INCOMPATIBLE: {escape(report.reason)}"))
    return buf.getvalue()
