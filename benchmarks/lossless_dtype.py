"""Are speculative greedy outputs the target's own, in float32 and in bfloat16? (vLLM, one engine per row.)

    python -m benchmarks.lossless_dtype [--dtypes float32 bfloat16] [--max-tokens 96]

Greedy speculative decoding is lossless in exact arithmetic: every emitted token is the target's argmax. In
floating point the target's logits for a token depend on the shape of the forward pass that computed them
(one token a step without speculation, k+1 tokens a step when verifying drafts), so two near-tied logits can
flip, the more often the coarser the dtype (bfloat16 on the GPU studies). This runs, per dtype, no
speculation twice (the same engine configuration: is the engine deterministic at all?), n-gram lookup and the
4-layer draft at k=3, on the demo's prompts, and counts the prompts whose output equals no speculation's,
with the first position where each other one differs. The GPU grids' speculative outputs matched no
speculation's on only part of the prompts (docs/benchmarks.md, the head on the wide target); this tells
whether bfloat16 alone does that to a drafter that cannot change the target's function.
Prints a table and writes JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.common import RESULTS, print_table, small_engine, write_result_to
from benchmarks.eagle3_head import load_prompts

PROMPTS = "studies/prompts/smollm2-demo.jsonl"  # under the repository root, as eagle3_head.load_prompts reads it


def configurations() -> dict[str, dict[str, Any] | None]:
    from tuner.models.demo import demo_path, draft_name

    return {
        "none": None,
        "none again": None,
        "ngram k=3 lookup 2-4": {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        },
        "draft-4l k=3": {"method": "draft_model", "model": str(demo_path(draft_name(4))), "num_speculative_tokens": 3},
    }


def run(dtype: str, spec: dict[str, Any] | None, prompts: list[Any], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    from tuner.models.demo import TARGET_NAME, demo_path

    llm = small_engine(str(demo_path(TARGET_NAME)), dtype, spec)
    outputs = llm.chat(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    del llm
    return tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ (a length counts), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--max-tokens", type=int, default=96)
    args = p.parse_args()
    prompts = load_prompts([PROMPTS])
    rows, results = [], []
    for dtype in args.dtypes:
        outputs = {name: run(dtype, spec, prompts, args.max_tokens) for name, spec in configurations().items()}
        base = outputs["none"]
        for name, tokens in outputs.items():
            if name == "none":
                continue
            diffs = [first_difference(a, b) for a, b in zip(base, tokens, strict=True)]
            same = sum(d is None for d in diffs)
            where = sorted(d for d in diffs if d is not None)
            results.append({"dtype": dtype, "configuration": name, "identical": same, "first_differences": where})
            rows.append([dtype, name, f"{same}/{len(prompts)}", " ".join(map(str, where)) or "-"])
    headers = ["dtype", "against no speculation", "identical outputs", "first differing position (others)"]
    print_table(headers, rows)
    path = write_result_to(
        RESULTS,
        "lossless-dtype",
        "lossless-dtype",
        "benchmarks.lossless_dtype",
        {"prompts": PROMPTS, "max_tokens": args.max_tokens, "results": results},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
