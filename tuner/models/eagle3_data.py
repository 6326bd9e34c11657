"""Training data for an EAGLE-3 head: the target's own answers and its hidden states, in speculators' layout.

Three steps, each resumable from its file under a work directory:

1. ``generate``: the target answers the offline prompt set (tuner.models.eagle3_prompts) through vLLM,
   greedy like the studies; written as ``responses.jsonl`` (prompt token ids + answer token ids).
2. ``extract``: the target's hidden states for every (prompt + answer) sequence, computed with
   transformers and forward hooks: the residual stream entering each auxiliary layer (what vLLM hands an
   EAGLE-3 head: ``hidden_states + residual`` before that layer) and the last layer's output before the
   final norm (speculators' ``verifier_last_hidden_states``). Written as speculators 0.9.0's offline
   layout: ``data/`` (a datasets arrow table with input_ids, loss_mask, seq_len) and
   ``data/hidden_states/hs_{i}.safetensors`` (``hidden_states`` [seq, 4, hidden], ``token_ids``).
   vLLM 0.32 CPU's own ``extract_hidden_states`` path needs a KV-connector server; for a 135M model the
   transformers forward on CPU is fast and computes the same residual stream.
3. training itself runs speculators' trainer in its own environment (tuner.models.eagle3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.environment import spawn_engine_cores


def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's and speculators' default: (2, num_layers // 2, num_layers - 3)."""
    return [2, num_layers // 2, num_layers - 3]


def generate(
    target: Path,
    prompts: list[list[dict[str, str]]],
    out: Path,
    max_tokens: int,
    seed: int,
    log: Callable[[str], object] = print,
    device: str = "cpu",
    dtype: str = "float32",
) -> Path:
    """Greedy answers of ``target`` to ``prompts`` (vLLM), as token ids; kept when already written.

    On CPU: eager, 1 GiB of KV cache. On a GPU: CUDA graphs and 16 GiB of KV cache (some 700k bfloat16
    tokens of the 135M, so that the whole prompt set is in flight at once)."""
    path = out / "responses.jsonl"
    if path.is_file():
        return path
    from vllm import LLM, SamplingParams

    spawn_engine_cores()  # this process may have widened the target: a forked engine core would hang
    gpu = device == "cuda"
    more: dict[str, Any] = {"max_num_seqs": 1024} if gpu else {}
    llm = LLM(
        model=str(target),
        dtype=dtype,  # type: ignore[arg-type]
        max_model_len=1024,
        seed=seed,
        enforce_eager=not gpu,
        kv_cache_memory_bytes=2**34 if gpu else 2**30,
        **more,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=seed)
    conversations: Any = prompts
    outputs = llm.chat(conversations, params, use_tqdm=False)
    tmp = path.with_suffix(".tmp")
    tokens = 0
    with tmp.open("w") as f:
        for o in outputs:
            answer = list(o.outputs[0].token_ids)
            tokens += len(answer)
            f.write(json.dumps({"prompt_ids": list(o.prompt_token_ids or []), "answer_ids": answer}) + "\n")
    tmp.rename(path)
    log(f"generated {tokens} answer tokens for {len(outputs)} prompts -> {path}")
    return path


def read_responses(path: Path) -> list[dict[str, list[int]]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def extract(
    target: Path,
    responses: Path,
    data_dir: Path,
    aux_layers: list[int] | None = None,
    batch: int = 8,
    limit: int | None = None,
    log: Callable[[str], object] = print,
    device: str = "cpu",
    dtype: str = "float32",
) -> Path:
    """Hidden states in speculators' offline layout; kept when already complete.

    ``limit`` keeps the ``limit`` shortest sequences (ties by position), numbered in the responses' order:
    the CPU budget's knob (the forward pass is most of the cost; short answers train as well).
    """
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    done = data_dir / "dataset_info.json"
    if done.is_file():
        return data_dir
    rows = select_shortest(read_responses(responses), limit)
    model: Any = AutoModelForCausalLM.from_pretrained(str(target), dtype=getattr(torch, dtype))
    model.to(device).eval()
    layers = model.model.layers
    aux = aux_layers or default_aux_layers(len(layers))
    captured: dict[int, Any] = {}

    def entering(i: int) -> Callable[..., None]:
        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            captured[i] = (args[0] if args else kwargs["hidden_states"]).detach().cpu()

        return hook

    def leaving(_module: Any, _args: Any, output: Any) -> None:
        captured[len(layers)] = (output[0] if isinstance(output, tuple) else output).detach().cpu()

    handles = [layers[i].register_forward_pre_hook(entering(i), with_kwargs=True) for i in aux]
    handles.append(layers[-1].register_forward_hook(leaving))
    hs_dir = data_dir / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    # Batches of similar lengths (little padding); files and table rows keep the responses' order.
    order = sorted(range(len(rows)), key=lambda i: (seq_len(rows[i]), i))
    with torch.inference_mode():
        for start in range(0, len(rows), batch):
            chunk_ids = order[start : start + batch]
            chunk = [rows[i] for i in chunk_ids]
            seqs = [r["prompt_ids"] + r["answer_ids"] for r in chunk]
            width = max(len(s) for s in seqs)
            ids = torch.zeros((len(seqs), width), dtype=torch.long)
            mask = torch.zeros((len(seqs), width), dtype=torch.long)
            for j, s in enumerate(seqs):  # right padding: causal attention keeps each row's prefix exact
                ids[j, : len(s)] = torch.tensor(s)
                mask[j, : len(s)] = 1
            captured.clear()
            model.model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
            stacked = torch.stack([captured[i] for i in [*aux, len(layers)]], dim=2)  # [b, seq, 4, hidden]
            for j, (index, s) in enumerate(zip(chunk_ids, seqs, strict=True)):
                save_file(
                    {
                        "hidden_states": stacked[j, : len(s)].to(torch.bfloat16).contiguous(),
                        "token_ids": torch.tensor(s, dtype=torch.long),
                    },
                    str(hs_dir / f"hs_{index}.safetensors"),
                )
            if (start // batch) % 20 == 0:
                log(f"hidden states {start + len(chunk)}/{len(rows)}")
    for h in handles:
        h.remove()
    table = {
        "input_ids": [r["prompt_ids"] + r["answer_ids"] for r in rows],
        "loss_mask": [[0] * len(r["prompt_ids"]) + [1] * len(r["answer_ids"]) for r in rows],
        "seq_len": [len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows],
    }
    Dataset.from_dict(table).with_format("torch").save_to_disk(str(data_dir))
    return data_dir


def seq_len(row: dict[str, list[int]]) -> int:
    return len(row["prompt_ids"]) + len(row["answer_ids"])


def select_shortest(rows: list[dict[str, list[int]]], limit: int | None) -> list[dict[str, list[int]]]:
    if limit is None or limit >= len(rows):
        return rows
    keep = sorted(sorted(range(len(rows)), key=lambda i: (seq_len(rows[i]), i))[:limit])
    return [rows[i] for i in keep]


def token_frequencies(responses: Path, vocab_size: int, out: Path, limit: int | None = None) -> Path:
    """Answer-token counts as speculators' token_freq.pt ({token id: count}; picks the draft vocabulary).

    Every id of the vocabulary is listed (unseen ones with 0) so that a small data set still fills a
    draft vocabulary larger than its distinct tokens.
    """
    from collections import Counter

    import torch

    counts: Counter[int] = Counter(dict.fromkeys(range(vocab_size), 0))
    for r in select_shortest(read_responses(responses), limit):
        counts.update(r["answer_ids"])
    torch.save(dict(counts), out)
    return out


def main(argv: list[str]) -> None:
    """``python -m tuner.models.eagle3_data TARGET PROMPTS.jsonl WORK MAX_TOKENS SEED DEVICE DTYPE``: the
    generation step in a process of its own (tuner.models.eagle3.generate_command)."""
    target, prompts, work, max_tokens, seed, device, dtype = argv
    conversations = [json.loads(line) for line in Path(prompts).read_text().splitlines() if line.strip()]
    generate(Path(target), conversations, Path(work), int(max_tokens), int(seed), device=device, dtype=dtype)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
