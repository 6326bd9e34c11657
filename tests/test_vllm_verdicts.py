"""vLLM's pre-flight verdicts are kept on disk per vLLM installation, so a second tuner process does not
import vLLM again (40 s on a 2-core machine) for probes already answered."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.engine import vllm_checks


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> list[list[dict[str, Any]]]:
    monkeypatch.setenv("SPECDEC_TUNER_CACHE", str(tmp_path))
    monkeypatch.setattr(vllm_checks, "_vllm_identity", lambda: "vllm-a")
    calls: list[list[dict[str, Any]]] = []

    def ask(configs: list[dict[str, Any]], timeout_s: float) -> list[str | None]:
        calls.append(configs)
        return ["bad k" if c.get("num_speculative_tokens") == 0 else None for c in configs]

    monkeypatch.setattr(vllm_checks, "_ask_vllm", ask)
    return calls


def test_a_second_process_reuses_stored_verdicts(asked: list[list[dict[str, Any]]]) -> None:
    good, bad = {"method": "ngram", "num_speculative_tokens": 2}, {"method": "ngram", "num_speculative_tokens": 0}
    assert vllm_checks.validate_in_subprocess([good, bad]) == [None, "bad k"]
    assert vllm_checks.validate_in_subprocess([bad, good, bad]) == ["bad k", None, "bad k"]
    assert len(asked) == 1
    other = {"method": "ngram", "num_speculative_tokens": 3}
    assert vllm_checks.validate_in_subprocess([good, other]) == [None, None]
    assert asked[1] == [other]  # only the new probe goes to vLLM


def test_another_vllm_is_asked_again(asked: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    probe = {"method": "ngram", "num_speculative_tokens": 2}
    vllm_checks.validate_in_subprocess([probe])
    monkeypatch.setattr(vllm_checks, "_vllm_identity", lambda: "vllm-b")
    vllm_checks.validate_in_subprocess([probe])
    assert len(asked) == 2


def test_no_vllm_means_no_verdict(asked: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_checks, "_vllm_identity", lambda: None)
    assert vllm_checks.validate_in_subprocess([{"method": "ngram", "num_speculative_tokens": 2}]) is None
    assert asked == []


def test_an_unanswered_probe_is_not_stored(asked: list[list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    probe = {"method": "ngram", "num_speculative_tokens": 2}
    monkeypatch.setattr(vllm_checks, "_ask_vllm", lambda configs, timeout_s: None)  # timed out
    assert vllm_checks.validate_in_subprocess([probe]) is None
    assert vllm_checks._load_verdicts("vllm-a") == {}


def test_the_installed_vllm_has_an_identity() -> None:
    assert vllm_checks._vllm_identity() is not None
