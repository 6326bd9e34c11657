"""Will this draft work with this target? Tokenizers and model sizes, compared without an engine.

The classic failure is a draft whose tokenizer differs from the target's: vLLM then either refuses
the pair or accepts almost nothing. Checking costs seconds; finding out on a GPU costs minutes.
"""

from __future__ import annotations

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
        return "; ".join(f"{r.check} differs (target {r.target}, draft {r.draft})" for r in bad)


def _load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _config(path: str) -> dict[str, Any]:
    cfg = Path(path) / "config.json"
    return json.loads(cfg.read_text()) if cfg.exists() else {}


def count_parameters(path: str) -> int | None:
    """From safetensors headers only: no weights are read."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with file.open("rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for dim in info["shape"]:
                n *= dim
            total += n
    return total


def _fmt_params(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def compare_pair(target: str, draft: str, trust_remote_code: bool = False, load_weights: bool = False) -> PairReport:
    del load_weights  # sizes come from file headers; kept for API clarity
    t_tok = _load_tokenizer(target, trust_remote_code)
    d_tok = _load_tokenizer(draft, trust_remote_code)
    t_cfg, d_cfg = _config(target), _config(draft)
    report = PairReport()
    rows = report.rows

    t_vocab, d_vocab = len(t_tok), len(d_tok)
    rows.append(PairRow("tokenizer vocabulary size", str(t_vocab), str(d_vocab), t_vocab == d_vocab))
    t_emb, d_emb = t_cfg.get("vocab_size"), d_cfg.get("vocab_size")
    rows.append(PairRow("embedding rows (config vocab_size)", str(t_emb), str(d_emb), t_emb == d_emb))

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
    from rich.table import Table

    table = Table(title=f"target {target}\ndraft  {draft}")
    for col in ("check", "target", "draft", "verdict"):
        table.add_column(col)
    for row in report.rows:
        verdict = "ok" if row.ok else ("INCOMPATIBLE" if row.blocking else "differs (warning)")
        table.add_row(row.check, row.target, row.draft, verdict)
    buf = StringIO()
    console = Console(file=buf, width=110)
    console.print(table)
    for line in report.advice:
        console.print(f"advice: {line}")
    console.print("verdict: " + ("compatible" if report.compatible else f"INCOMPATIBLE: {report.reason}"))
    return buf.getvalue()
