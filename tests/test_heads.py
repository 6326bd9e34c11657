"""EAGLE heads as candidates: check-pair and pre-flight check a head's shapes against the target (no
tokenizer: a head has none), in both layouts vLLM loads, by path and by hub id from an offline cache.

The heads are tiny random-weight ones shaped for the demo target (tests/tiny_heads.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli, study_dict, write_study
from tests.test_pair_check import cli
from tests.tiny_heads import VOCAB, write_eagle1_head, write_head
from tuner.models.demo import TARGET_NAME, demo_path

pytestmark = pytest.mark.usefixtures("demo_models")

TARGET = f"demo:{TARGET_NAME}"


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    made = {
        "good": write_head(root / "good"),
        "speculators": write_head(root / "speculators", layout="speculators"),
        "wide": write_head(root / "wide", hidden=1152),
        "d2t": write_head(root / "d2t", d2t_shift=VOCAB),
        "aux": write_head(root / "aux", aux_ids=[2, 15, 31]),
        "arch": write_head(root / "arch", architecture="Qwen2ForCausalLM"),
        "fc": write_head(root / "fc", aux_ids=[2, 15, 27, 29]),
    }
    # weights for four auxiliary layers, a config that names three
    config = json.loads((made["fc"] / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]
    (made["fc"] / "config.json").write_text(json.dumps(config))
    return made


@pytest.mark.parametrize("layout", ["good", "speculators"])
def test_a_matching_head_passes_and_says_what_was_checked(
    layout: str, heads: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    res = cli(["check-pair", "--target", TARGET, "--draft", str(heads[layout])], capsys)
    assert res.returncode == 0, res.stdout + res.stderr
    text = " ".join(res.stdout.split())
    assert "verdict: compatible" in text
    kind = "speculators" if layout == "speculators" else "eagle"
    assert f"checked as an eagle3 head ({kind} layout): architecture, target hidden size" in text
    for check in ("auxiliary layers", "fc.weight shape", "vocabulary (vocab_size)", "draft-to-target ids (d2t)"):
        assert check in text
    assert "tokenizer vocabulary size" not in text  # a head has no tokenizer to compare


@pytest.mark.parametrize(
    ("head", "line"),
    [
        ("wide", "head hidden size 1152 does not match the target's 576 (target_hidden_size); fix: "),
        ("d2t", "head d2t maps draft tokens to target id 51199, outside the target's 0-49151 (d2t); fix: "),
        ("aux", "head auxiliary layer 31 is outside the target's 30 layers (0-30) (eagle_aux_hidden_state_layer_ids)"),
        ("arch", "head architecture Eagle3Qwen2ForCausalLM is not one vLLM loads as a speculative head"),
        ("fc", "head fc.weight is [576, 2304], its config says [576, 1728] ("),
    ],
)
def test_a_mismatched_head_exits_2_naming_the_field(
    head: str, line: str, heads: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    res = cli(["check-pair", "--target", TARGET, "--draft", str(heads[head])], capsys)
    assert res.returncode == 2, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --draft: " + line), res.stderr
    assert "; fix: " in lines[0]


@pytest.mark.parametrize(("hidden", "code"), [(576, 0), (1152, 2)])
def test_an_eagle1_head_is_checked_as_one(
    hidden: int, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = write_eagle1_head(tmp_path / "eagle1", hidden=hidden)
    res = cli(["check-pair", "--target", TARGET, "--draft", str(head)], capsys)
    assert res.returncode == code, res.stdout + res.stderr
    if code == 0:
        text = " ".join(res.stdout.split())
        assert "checked as an eagle head (eagle layout): architecture, hidden size (hidden_size)" in text
        assert "EagleLlamaForCausalLM (llama_eagle)" in text
    else:
        assert res.stderr.startswith(
            "error: --draft: head hidden size 1152 does not match the target's 576 (hidden_size)"
        )


def test_preflight_keeps_the_matching_head_and_removes_the_wrong_ones(
    tmp_path: Path, heads: dict[str, Path], fake_engine: str
) -> None:
    from tuner.engine.preflight import run_preflight
    from tuner.study.loader import load_study

    data = study_dict(tmp_path)
    for name in ("good", "speculators", "wide", "d2t", "aux"):
        data["candidates"].append({"name": f"head-{name}", "method": "eagle3", "model": str(heads[name])})
    data["candidates"].append({"name": "as-eagle", "method": "eagle", "model": str(heads["good"])})
    synthetic = {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0}
    data["candidates"].append(
        {"name": "synthetic", "method": "eagle3", "model": str(heads["good"]), "extra": synthetic}
    )
    result = run_preflight(load_study(write_study(tmp_path, data)))
    assert {"head-good", "head-speculators", "draft-4l"} <= set(result.allowed)
    assert result.rejected["head-wide"].startswith("head hidden size 1152 does not match the target's 576")
    assert "(d2t)" in result.rejected["head-d2t"]
    assert "(eagle_aux_hidden_state_layer_ids)" in result.rejected["head-aux"]
    # an EAGLE-3 head named as method eagle: vLLM would build it as EAGLE-1
    assert "is not an eagle head" in result.rejected["as-eagle"]
    # vLLM's CPU rejection sampler has no synthetic mode (this machine has no GPU)
    assert result.rejected["synthetic"].startswith("vLLM on CPU has no synthetic rejection sampling")


def test_a_head_named_as_a_draft_model_is_refused_not_a_traceback(
    tmp_path: Path, heads: dict[str, Path], fake_engine: str
) -> None:
    from tuner.engine.preflight import run_preflight
    from tuner.study.loader import load_study

    data = study_dict(tmp_path)
    data["candidates"].append({"name": "head-as-draft", "method": "draft_model", "model": str(heads["good"])})
    result = run_preflight(load_study(write_study(tmp_path, data)))
    assert "has no tokenizer files" in result.rejected["head-as-draft"]
    assert "method: eagle3" in result.rejected["head-as-draft"]


def test_labels_name_the_head() -> None:
    from tuner.study.spec import TrialSpec

    spec = TrialSpec(candidate="smol-head", method="eagle3", draft_model="/x", num_speculative_tokens=4)
    assert spec.label() == "eagle3 smol-head k=4 eager"


def _hub_cache(home: Path, repo: str, source: Path) -> Path:
    """``source``'s files as the hub snapshot of ``repo`` in HF_HOME ``home`` (huggingface_hub's layout)."""
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        if file.is_file() and not (file.suffix == ".safetensors" and file.stat().st_size > 100_000_000):
            shutil.copy(file, snapshot / file.name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_hub_ids_are_checked_from_the_offline_cache(tmp_path: Path, heads: dict[str, Path]) -> None:
    """Target and heads named by hub id, resolved offline from a cache (the target's weights left out:
    the checks read configs, tokenizers and the head's headers)."""
    home = tmp_path / "hf"
    _hub_cache(home, "demo-org/smollm2", demo_path(TARGET_NAME))
    _hub_cache(home, "demo-org/head-good", heads["good"])
    _hub_cache(home, "demo-org/head-wide", heads["wide"])
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    good = run_cli(["check-pair", "--target", "demo-org/smollm2", "--draft", "demo-org/head-good"], tmp_path, env)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "verdict: compatible" in good.stdout and "checked as an eagle3 head" in " ".join(good.stdout.split())
    wide = run_cli(["check-pair", "--target", "demo-org/smollm2", "--draft", "demo-org/head-wide"], tmp_path, env)
    assert wide.returncode == 2, wide.stdout
    assert wide.stderr.strip().startswith("error: --draft: head hidden size 1152 does not match the target's 576")
    # a head on the hub whose weights are not in the cache: its config is checked, its weights are said unchecked
    (_hub_cache(home, "demo-org/head-config-only", heads["good"]) / "model.safetensors").unlink()
    config_only = run_cli(
        ["check-pair", "--target", "demo-org/smollm2", "--draft", "demo-org/head-config-only"], tmp_path, env
    )
    assert config_only.returncode == 0, config_only.stdout + config_only.stderr
    assert "│ weights " in config_only.stdout and "not local:" in config_only.stdout
    # a draft model by hub id: the tokenizer comparison, no longer skipped
    _hub_cache(home, "demo-org/smollm2-4l", demo_path(f"{TARGET_NAME}-4L"))
    draft = run_cli(["check-pair", "--target", "demo-org/smollm2", "--draft", "demo-org/smollm2-4l"], tmp_path, env)
    assert draft.returncode == 0, draft.stdout + draft.stderr
    assert "vocabulary (token → id)" in draft.stdout and "verdict: compatible" in draft.stdout
    missing = run_cli(["check-pair", "--target", "demo-org/smollm2", "--draft", "demo-org/absent"], tmp_path, env)
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr.strip().startswith("error: --draft: demo-org/absent is not in the local Hugging Face cache")
    assert "HF_HUB_OFFLINE" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_a_study_naming_a_hub_id_an_offline_engine_could_not_load_exits_2(tmp_path: Path, fake_engine: str) -> None:
    """Offline, a hub id missing from the cache fails every engine that names it (vLLM reads HF_HUB_OFFLINE
    too): pre-flight says so before any engine, naming the field, and stores nothing."""
    home = tmp_path / "hf"
    _hub_cache(home, "demo-org/smollm2", demo_path(TARGET_NAME))
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    data = study_dict(tmp_path)
    data["target"]["model"] = "demo-org/smollm2"
    data["candidates"][2]["model"] = "demo-org/absent-draft"
    res = run_cli(["optimize", "--study", str(write_study(tmp_path, data))], tmp_path, env)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: candidates.2.model: demo-org/absent-draft is not in"), lines
    assert "fix: download it first" in lines[0]
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()
    # the same study with the draft in the cache passes pre-flight and measures
    _hub_cache(home, "demo-org/absent-draft", demo_path(f"{TARGET_NAME}-4L"))
    ok = run_cli(["optimize", "--study", str(write_study(tmp_path, data)), "--n-trials", "1"], tmp_path, env)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_preflight_compares_the_tokenizers_of_a_draft_named_by_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-flight no longer skips hub ids: the draft's cached tokenizer files are compared with the target's.
    (In this process huggingface_hub has read HF_HOME already: its cache folder and offline flag are set.)"""
    from huggingface_hub import constants

    from tuner.engine.preflight import check_draft_pair

    home = tmp_path / "hf"
    _hub_cache(home, "demo-org/smollm2", demo_path(TARGET_NAME))
    snapshot = _hub_cache(home, "demo-org/eos-draft", demo_path(f"{TARGET_NAME}-4L"))
    config = json.loads((snapshot / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|endoftext|>"
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    reason = check_draft_pair("demo-org/smollm2", "demo-org/eos-draft", trust_remote_code=False)
    assert reason is not None and "special tokens (besides PAD) differs" in reason
    assert check_draft_pair("demo-org/smollm2", "demo-org/smollm2", trust_remote_code=False) is None
