"""What limits the demo EAGLE-3 head's acceptance, from a training run's responses (no vLLM engine).

    python -m benchmarks.eagle3_limits --head DIR --responses RUN/responses.jsonl [--sequences 400]

Two measurements, float32 on CPU, written as one JSON under benchmarks/results/<--out-dir>/:

* ``leak``: speculators' validation split (the last 5% of the ``sequences`` shortest rows) against its
  training split: the share of the validation answers' positions whose 8-gram (7 tokens before and the
  token to draft) occurs in the training answers, and the head's step-0 acceptance (benchmarks.eagle3_offline's
  head, vLLM's forward) on those positions and on the others.
* ``coverage``: a draft vocabulary of V tokens picked like tuner.models.eagle3_data.token_frequencies (the
  training answers' most frequent tokens, then unseen ids in id order) for V in 8192, 16384, 32768: the
  share of the target's greedy answer tokens (transformers, ``--max-tokens``) inside it, and of 3-token
  windows all inside (a draft of 3 is accepted whole only then), per prompt set.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import write_result_to
from benchmarks.eagle3_head import RESULTS, load_prompts, training_prompts
from benchmarks.eagle3_offline import Head

STUDY_SETS = [
    "studies/prompts/smollm2-demo.jsonl",
    "studies/prompts/wide-h200.jsonl",
    "studies/prompts/smollm2-h200.jsonl",
]


def leak(model: Any, head: Head, train: list[dict], val: list[dict], n: int = 8) -> dict[str, Any]:
    grams: set[tuple[int, ...]] = set()
    for r in train:
        a = r["answer_ids"]
        grams |= {tuple(a[i : i + n]) for i in range(len(a) - n + 1)}
    layers = model.model.layers
    aux_ids = head.cfg["eagle_aux_hidden_state_layer_ids"]
    cap: dict[int, torch.Tensor] = {}

    def entering(i: int) -> Any:
        return lambda _m, a, kw: cap.__setitem__(i, (a[0] if a else kw["hidden_states"])[0])

    handles = [layers[i].register_forward_pre_hook(entering(i), with_kwargs=True) for i in aux_ids]
    counts = {"seen": [0, 0], "unseen": [0, 0]}
    with torch.inference_mode():
        for r in val:
            seq = r["prompt_ids"] + r["answer_ids"]
            p = len(r["prompt_ids"])
            gen = torch.tensor(seq)
            greedy = model(gen[None], use_cache=False).logits[0].argmax(-1)
            drafts = head.draft(torch.cat([cap[i] for i in aux_ids], -1), gen, 1)[:, 0]
            for t in range(p - 1, len(seq) - 2):  # row t drafts token t + 2
                key = "seen" if t + 3 - n >= p and tuple(seq[t + 3 - n : t + 3]) in grams else "unseen"
                counts[key][0] += int(drafts[t] == greedy[t + 1])
                counts[key][1] += 1
    for h in handles:
        h.remove()
    return {"ngram": n, **{k: {"positions": v[1], "acc0": v[0] / max(v[1], 1)} for k, v in counts.items()}}


def coverage(model: Any, tok: Any, rows: list[dict], sets: dict[str, list], max_tokens: int) -> dict[str, Any]:
    freq: Counter[int] = Counter()
    for r in rows:
        freq.update(r["answer_ids"])
    ranked = [t for t, _ in freq.most_common()]
    unseen = [i for i in range(model.config.vocab_size) if freq[i] == 0]
    answers: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        for name, prompts in sets.items():
            answers[name] = []
            for m in prompts:
                enc: Any = tok.apply_chat_template(m, add_generation_prompt=True, return_tensors="pt")
                ids = enc if isinstance(enc, torch.Tensor) else enc["input_ids"]
                out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)[0, ids.shape[1] :]
                answers[name].append(out.tolist())
    result: dict[str, Any] = {"distinct_answer_tokens": len(ranked), "by_vocab_size": {}}
    for v in (8192, 16384, 32768):
        vocab = set(ranked[:v]) | set(unseen[: max(0, v - len(ranked))])
        per: dict[str, Any] = {}
        for name, outs in answers.items():
            toks = [t for o in outs for t in o]
            windows = [all(t in vocab for t in o[i : i + 3]) for o in outs for i in range(len(o) - 2)]
            per[name] = {
                "answer_tokens": len(toks),
                "in_vocab": sum(t in vocab for t in toks) / len(toks),
                "3_windows_in_vocab": sum(windows) / max(len(windows), 1),
            }
        result["by_vocab_size"][str(v)] = per
    return result


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tuner.models.demo import TARGET_NAME, demo_path
    from tuner.models.eagle3_data import read_responses, select_shortest

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head", required=True)
    p.add_argument("--target")
    p.add_argument("--responses", required=True)
    p.add_argument("--sequences", type=int, default=400)
    p.add_argument("--train-ratio", type=float, default=0.95)
    p.add_argument("--heldout", type=int, default=40, help="held-out training-builder prompts for coverage")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out-dir", default="eagle3-head-20261205")
    args = p.parse_args()
    torch.set_num_threads(1)
    target = str(args.target or demo_path(TARGET_NAME))
    tok: Any = AutoTokenizer.from_pretrained(target)
    model: Any = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    head = Head(Path(args.head), model.model.embed_tokens.weight.detach().float())
    rows = select_shortest(read_responses(Path(args.responses)), args.sequences)
    split = int(len(rows) * args.train_ratio)
    leaked = leak(model, head, rows[:split], rows[split:])
    print(json.dumps(leaked))
    sets = {Path(f).stem: load_prompts([f]) for f in STUDY_SETS}
    sets["train-heldout"] = training_prompts(0, 600, args.heldout)
    covered = coverage(model, tok, rows, sets, args.max_tokens)
    for v, per in covered["by_vocab_size"].items():
        print(v, "  ".join(f"{n}: {x['in_vocab']:.3f} / {x['3_windows_in_vocab']:.3f}" for n, x in per.items()))
    payload = {
        "head": args.head,
        "responses": args.responses,
        "sequences": args.sequences,
        "max_tokens": args.max_tokens,
        "leak": leaked,
        "coverage": covered,
    }
    path = write_result_to(
        RESULTS / args.out_dir,
        "limits",
        "eagle3-head limits (validation leak, draft-vocabulary coverage)",
        "benchmarks.eagle3_limits",
        payload,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
