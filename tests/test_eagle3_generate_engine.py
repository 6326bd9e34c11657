"""The head's generation step in a real CPU vLLM, as build_head runs it: a process of its own with a limit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.models.demo import TARGET_NAME, demo_path
from tuner.models.eagle3 import HeadRecipe, generate_command, run_step, tuner_env

pytestmark = pytest.mark.engine


def test_the_generation_step_answers_greedily_in_its_own_process(tmp_path: Path, demo_models: None) -> None:
    prompts = tmp_path / "prompts.jsonl"
    conversations = [[{"role": "user", "content": "Name a prime number."}], [{"role": "user", "content": "Hi!"}]]
    prompts.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    recipe = replace(HeadRecipe(), max_tokens=4)
    cmd = generate_command(demo_path(TARGET_NAME), prompts, tmp_path, recipe)
    run_step(cmd, tuner_env(), lambda m: None, timeout_s=600)
    rows = [json.loads(line) for line in (tmp_path / "responses.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["answer_ids"]) == 4 and r["prompt_ids"] for r in rows)
    assert rows[0]["prompt_ids"] != rows[1]["prompt_ids"]
