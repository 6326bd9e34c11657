"""The head's training prompts: reproducible from a seed, built from the standard library, never a benchmark's."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.models.eagle3_data import select_shortest
from tuner.models.eagle3_prompts import build_prompts, stdlib_snippets

STUDY_PROMPTS = Path(__file__).resolve().parent.parent / "studies" / "prompts"


def _texts(prompts: list[list[dict[str, str]]]) -> list[str]:
    return [p[0]["content"] for p in prompts]


def test_same_seed_same_prompts_other_seed_other_prompts() -> None:
    assert _texts(build_prompts(300, seed=0)) == _texts(build_prompts(300, seed=0))
    assert _texts(build_prompts(300, seed=0)) != _texts(build_prompts(300, seed=1))


def test_prompts_are_code_and_chat_from_the_standard_library() -> None:
    snippets = stdlib_snippets()
    assert len(snippets) > 100
    texts = _texts(build_prompts(400, seed=0))
    assert len(set(texts)) > 300
    code = [t for t in texts if "def " in t]
    assert 0.5 < len(code) / len(texts) < 0.9
    assert any(s.source in t or s.source.splitlines()[0] in t for s in snippets for t in code[:5])


def test_no_benchmark_prompt_is_in_the_training_set() -> None:
    """No study prompt's text, nor any of its code lines longer than 30 characters, is a training prompt."""
    training = "\n".join(_texts(build_prompts(600, seed=0)))
    for text in _bench_texts():
        assert text not in training
        for code_line in text.splitlines():
            if len(code_line.strip()) > 30:
                assert code_line not in training, code_line


def test_select_shortest_keeps_order_and_breaks_ties_by_position() -> None:
    rows = [{"prompt_ids": [0] * n, "answer_ids": [1]} for n in (5, 2, 9, 2, 1)]
    kept = select_shortest(rows, 3)
    assert [len(r["prompt_ids"]) for r in kept] == [2, 2, 1]
    assert select_shortest(rows, None) == rows


def test_unique_prompts_keep_the_cpu_recipes_600_and_reach_the_gpu_recipes_count() -> None:
    """build_head took the distinct prompts of build_prompts(2 n): enough for 600, not for the GPU's 4,000."""
    from tuner.models.eagle3 import GPU_RECIPE
    from tuner.models.eagle3_prompts import unique_prompts

    seen: set[str] = set()
    old: list[str] = []
    for t in _texts(build_prompts(1200, seed=0)):
        if t not in seen and len(old) < 600:
            seen.add(t)
            old.append(t)
    assert _texts(unique_prompts(600, seed=0)) == old
    many = _texts(unique_prompts(GPU_RECIPE.prompts, seed=0))
    assert len(many) == len(set(many)) == GPU_RECIPE.prompts
    assert len(set(_texts(build_prompts(2 * GPU_RECIPE.prompts, seed=0)))) < GPU_RECIPE.prompts


def _bench_texts() -> list[str]:
    bench = []
    for f in STUDY_PROMPTS.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                bench += [m["content"] for m in json.loads(line)["messages"]]
    assert bench
    return bench


def test_the_gpu_recipes_broad_mix_holds_no_benchmark_prompt_and_is_not_mostly_code() -> None:
    """The GPU recipe's 4,000 prompts and the 200 after them (the held-out set): no study prompt's text or
    longer code line, and chat is a third or more of them (the stdlib mix had 224 distinct chat prompts)."""
    from tuner.models.eagle3 import GPU_RECIPE
    from tuner.models.eagle3_prompts import unique_prompts

    assert GPU_RECIPE.prompt_mix == "broad"
    texts = _texts(unique_prompts(GPU_RECIPE.prompts + 200, seed=GPU_RECIPE.seed, mix=GPU_RECIPE.prompt_mix))
    assert len(set(texts)) == len(texts)
    training = "\n".join(texts)
    for text in _bench_texts():
        assert text not in training
        for code_line in text.splitlines():
            if len(code_line.strip()) > 30:
                assert code_line not in training, code_line
    code_like = [t for t in texts if "def " in t or "class " in t or "SQL" in t or "`" in t]
    assert len(texts) - len(code_like) > len(texts) / 3


def test_broad_mix_same_seed_same_prompts_and_the_stdlib_mix_is_unchanged() -> None:
    from tuner.models.eagle3_prompts import unique_prompts

    assert _texts(unique_prompts(200, seed=0, mix="broad")) == _texts(unique_prompts(200, seed=0, mix="broad"))
    assert _texts(unique_prompts(200, seed=0, mix="broad")) != _texts(unique_prompts(200, seed=1, mix="broad"))
    assert _texts(unique_prompts(50, seed=0)) == _texts(unique_prompts(50, seed=0, mix="stdlib"))


def test_with_bug_swaps_one_operator_and_local_names_leave_out_the_arguments() -> None:
    import ast
    import random

    from tuner.models.eagle3_prompts_broad import local_names, with_bug

    source = "def f(a, b):\n    total = a + b\n    return total < 10\n"
    buggy = with_bug(source, random.Random(0))
    assert buggy is not None and buggy != source
    ops = [type(n).__name__ for n in ast.walk(ast.parse(buggy)) if isinstance(n, (ast.operator, ast.cmpop))]
    assert sorted(ops) in (["Lt", "Sub"], ["Add", "LtE"])
    assert with_bug("def g(x):\n    return x\n", random.Random(0)) is None
    assert local_names(source) == ["total"]


def test_a_recipe_of_another_mix_works_in_its_own_folder() -> None:
    from dataclasses import replace

    from tuner.models.eagle3 import GPU_RECIPE, work_dir

    root = Path("/cache")
    assert work_dir(root, GPU_RECIPE) != work_dir(root, replace(GPU_RECIPE, prompt_mix="stdlib"))
