"""check-pair and the pre-flight check on real checkpoints: the demo pair, and a draft made incompatible.

The commands run in this process (``tuner.cli.main``, output captured): the tokenizer loads import
transformers' auto classes, torch and scikit-learn, 7 s of each command's 9 s when every command was a
new process (2026-12-04, 2-core machine); here they are imported once. ``python -m tuner``'s own start
has its tests in test_cli."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, CliResult, study_dict, write_study
from tuner.cli import main
from tuner.models.demo import DRAFT_LAYERS, TARGET_NAME, demo_path, draft_name

pytestmark = pytest.mark.usefixtures("demo_models")


@pytest.fixture(scope="module")
def resized_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer draft whose vocabulary was resized: the classic mismatch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("bad-draft") / "draft-resized"
    source = demo_path(draft_name(DRAFT_LAYERS[0]))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(64)])
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def cli(
    args: list[str], capsys: pytest.CaptureFixture[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> CliResult:
    """``python -m tuner ARGS`` in this process, in ``cwd`` with ``env`` added: exit code, stdout and stderr."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        if cwd is not None:
            mp.chdir(cwd)
        for key, value in {"PYTHONPATH": str(ROOT), **(env or {})}.items():
            mp.setenv(key, value)
        code = main(args)
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)


# Two tokens no probe text uses: swapping their ids keeps the size and every probe encoding.
SWAPPED = ("Ġmeltdown", "ĠMama")


def _tokenizer_copy(out: Path) -> Path:
    """The demo target's tokenizer and config, without weights (the pair check reads no weights)."""
    out.mkdir(parents=True)
    for file in demo_path(TARGET_NAME).iterdir():
        if file.suffix != ".safetensors" and file.is_file():
            shutil.copy(file, out / file.name)
    return out


@pytest.fixture(scope="module")
def swapped_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo tokenizer with two tokens' ids swapped in tokenizer.json (and vocab.json if there is one)."""
    out = _tokenizer_copy(tmp_path_factory.mktemp("swapped") / "draft-swapped")
    first, second = SWAPPED
    for name, vocab_of in (("tokenizer.json", lambda d: d["model"]["vocab"]), ("vocab.json", lambda d: d)):
        path = out / name
        if not path.exists():
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = vocab_of(data)
        vocab[first], vocab[second] = vocab[second], vocab[first]
        path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return out


@pytest.mark.parametrize("layers", DRAFT_LAYERS)
def test_demo_pair_is_compatible(layers: int, capsys: pytest.CaptureFixture[str]) -> None:
    res = cli(["check-pair", "--target", f"demo:{TARGET_NAME}", "--draft", f"demo:{draft_name(layers)}"], capsys)
    assert res.returncode == 0, res.stderr
    assert "verdict: compatible" in res.stdout
    assert "token ids of probe texts" in res.stdout and "size ratio" in res.stdout
    for check in ("vocabulary (token → id)", "BPE merges", "added tokens", "special tokens (besides PAD)"):
        assert check in res.stdout


def test_swapped_token_ids_are_incompatible_and_named(swapped_draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = cli(["check-pair", "--target", f"demo:{TARGET_NAME}", "--draft", str(swapped_draft)], capsys)
    assert res.returncode == 2, res.stdout
    verdict = res.stdout[res.stdout.index("verdict:") :]
    assert "INCOMPATIBLE" in verdict and "vocabulary (token → id) differs" in verdict
    assert repr(SWAPPED[0]) in " ".join(verdict.split())  # the first differing token, by name
    assert "token ids of probe texts" in res.stdout  # the probes alone did not see it


def test_reordered_merges_are_incompatible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    draft = _tokenizer_copy(tmp_path / "draft-merges")
    data = json.loads((draft / "tokenizer.json").read_text(encoding="utf-8"))
    merges = data["model"]["merges"]
    merges[-1], merges[-2] = merges[-2], merges[-1]
    (draft / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    res = cli(["check-pair", "--target", f"demo:{TARGET_NAME}", "--draft", str(draft)], capsys)
    assert res.returncode == 2, res.stdout
    assert f"BPE merges differs (target merge {len(merges) - 2}:" in " ".join(res.stdout.split())


def test_special_tokens_are_compared_and_pad_only_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for role, verdict in (("eos_token", 2), ("pad_token", 0)):
        draft = _tokenizer_copy(tmp_path / f"draft-{role}")
        config = json.loads((draft / "tokenizer_config.json").read_text())
        config[role] = "<|endoftext|>"
        (draft / "tokenizer_config.json").write_text(json.dumps(config))
        res = cli(["check-pair", "--target", f"demo:{TARGET_NAME}", "--draft", str(draft)], capsys)
        assert res.returncode == verdict, (role, res.stdout)
        if role == "eos_token":
            assert "special tokens (besides PAD) differs (target eos_token '<|im_end|>', draft eos_token" in " ".join(
                res.stdout.split()
            )
        else:
            assert "differs (warning)" in res.stdout and "verdict: compatible" in res.stdout


def test_a_changed_checkpoint_is_compared_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A process keeps its reports by the folders' files (tuner.study.pair_check): a changed file is a new pair."""
    draft = _tokenizer_copy(tmp_path / "draft")
    args = ["check-pair", "--target", f"demo:{TARGET_NAME}", "--draft", str(draft)]
    assert cli(args, capsys).returncode == 0
    config = json.loads((draft / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|endoftext|>"
    (draft / "tokenizer_config.json").write_text(json.dumps(config))
    res = cli(args, capsys)
    assert res.returncode == 2 and "special tokens (besides PAD) differs" in " ".join(res.stdout.split()), res.stdout


def test_preflight_removes_the_swapped_draft(tmp_path: Path, swapped_draft: Path, fake_engine: str) -> None:
    from tuner.engine.preflight import run_preflight
    from tuner.study.loader import load_study

    data = study_dict(tmp_path)
    data["candidates"].append({"name": "swapped", "method": "draft_model", "model": str(swapped_draft)})
    result = run_preflight(load_study(write_study(tmp_path, data)))
    assert "swapped" not in result.allowed and "draft-4l" in result.allowed
    assert repr(SWAPPED[0]) in result.rejected["swapped"]


def test_resized_vocabulary_is_incompatible(resized_draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = cli(["check-pair", "--target", "demo:SmolLM2-135M-Instruct", "--draft", str(resized_draft)], capsys)
    assert res.returncode == 2
    assert "INCOMPATIBLE" in res.stdout and "vocabulary" in res.stdout


def test_check_pair_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = cli(["check-pair", "--target", "demo:SmolLM2-135M-Instruct", "--draft", str(tmp_path / "nope")], capsys)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: --draft:") and len(res.stderr.strip().splitlines()) == 1


def test_preflight_drops_incompatible_draft(
    tmp_path: Path, resized_draft: Path, fake_engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["candidates"].append({"name": "bad", "method": "draft_model", "model": str(resized_draft)})
    res = cli(
        ["optimize", "--study", str(write_study(tmp_path, data)), "--no-progress"],
        capsys,
        tmp_path,
        env={"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"},
    )
    assert res.returncode == 0, res.stderr
    assert "bad" in res.stderr and "removed" in res.stderr
    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    parent = next(r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags)
    assert "bad" in parent.data.tags["preflight.rejected"]


def test_study_report_says_preflight_removed_the_swapped_draft(
    tmp_path: Path, swapped_draft: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["candidates"].append({"name": "swapped", "method": "draft_model", "model": str(swapped_draft)})
    study = write_study(tmp_path, data)
    env = {"SPECDEC_TUNER_ENGINE_MODULE": "tests.fake_engine"}
    res = cli(["optimize", "--study", str(study), "--no-progress"], capsys, tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert "candidate 'swapped' removed" in res.stderr and repr(SWAPPED[0]) in res.stderr
    report = cli(["report", "--study", str(study), "--format", "md"], capsys, tmp_path)
    assert report.returncode == 0, report.stderr
    line = next(x for x in report.stdout.splitlines() if x.startswith("- swapped:"))
    assert "removed by pre-flight" in line and "vocabulary (token → id) differs" in line and repr(SWAPPED[0]) in line


def test_nothing_valid_left_exits_2(tmp_path: Path, resized_draft: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = study_dict(tmp_path)
    data["candidates"] = [{"name": "bad", "method": "draft_model", "model": str(resized_draft)}]
    res = cli(["optimize", "--study", str(write_study(tmp_path, data))], capsys, tmp_path)
    assert res.returncode == 2
    assert "no speculative candidate passed" in res.stderr
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()


def test_missing_draft_path_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = study_dict(tmp_path)
    data["candidates"][2]["model"] = str(tmp_path / "missing-draft")
    res = cli(["optimize", "--study", str(write_study(tmp_path, data))], capsys, tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip().startswith("error: candidates.2.model:")
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "optuna.db").exists()


def test_a_missing_tokenizer_is_said_of_the_side_that_lacks_it(tmp_path: Path) -> None:
    from tuner.study.pair_check import compare_pair

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((demo_path(TARGET_NAME) / "config.json").read_text())
    draft = str(demo_path(draft_name(DRAFT_LAYERS[0])))
    (row,) = compare_pair(str(bare), draft).rows
    assert (row.check, row.target, row.draft, row.ok) == ("tokenizer files", "none", "present", False)
    assert (
        row.problem is not None
        and f"the target {bare} has no tokenizer" in row.problem
        and "draft" not in (row.problem.split("; fix:")[0])
    )
    (both,) = compare_pair(str(bare), str(bare)).rows
    assert (both.target, both.draft) == ("none", "none") and both.problem is not None
    assert both.problem.count("has no tokenizer files") == 2 and both.problem.count("fix:") == 1
