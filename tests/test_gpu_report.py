"""benchmarks/gpu_report.py: the study and the grid are compared by configuration, whatever machine's model
cache their draft paths point into."""

from __future__ import annotations

from benchmarks.gpu_report import portable_key


def test_keys_from_different_model_caches_match() -> None:
    there = "('draft_model', '/root/wide/cache/models/SmolLM2-135M-Instruct', 2, None, None, True, ())"
    here = "('draft_model', '/root/.cache/specdec-tuner/models/SmolLM2-135M-Instruct/', 2, None, None, True, ())"
    assert portable_key(there) == portable_key(here) == (
        "('draft_model', 'SmolLM2-135M-Instruct', 2, None, None, True, ())"
    )
    other = "('draft_model', '/root/wide/cache/models/SmolLM2-135M-Instruct-8L', 2, None, None, True, ())"
    assert portable_key(other) != portable_key(there)
    assert portable_key("('ngram', None, 4, 2, 5, False, ())") == "('ngram', None, 4, 2, 5, False, ())"
