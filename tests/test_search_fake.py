"""The search loop end to end with a fake engine: fast, deterministic, real Optuna and MLflow."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import study_dict, write_study
from tuner.cli import main
from tuner.outputs.export import render_export
from tuner.results import confirmation, outcome, store


def _run(tmp_path: Path, data: dict, *extra: str) -> int:
    path = write_study(tmp_path, data)
    return main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs"), *extra])


def _load(data: dict) -> optuna.Study:
    return optuna.load_study(study_name=data["name"], storage=data["storage"])


def test_study_runs_baseline_first_and_logs_every_trial(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 6, "trial_timeout_s": 60})
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    study = _load(data)
    trials = study.get_trials()
    assert store.budget_used(study) == 6  # measured configurations; the sampler's repeats spend no budget
    first = store.trial_spec(trials[0])
    assert first is not None and first.is_baseline
    assert (
        sum(
            1
            for t in trials
            if (s := store.trial_spec(t)) and s.is_baseline and store.trial_record(t).duplicate_of is None
        )
        == 1
    )

    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(store.PARENT_TAG_KEY) is None]
    children = [r for r in runs if r.data.tags.get(store.PARENT_TAG_KEY)]
    assert len(parents) == 1 and len(children) == len(trials)
    assert all(r.data.tags[store.PARENT_TAG_KEY] == parents[0].info.run_id for r in children)
    assert parents[0].info.status == "FINISHED"
    measured = [r for r in children if r.data.tags.get("state") == "COMPLETE"]
    assert len(measured) >= 2
    assert all({"tokens_per_s", "speedup", "engine_start_s"} <= set(r.data.metrics) for r in measured)
    assert all(r.data.params["method"] in ("none", "ngram", "draft_model") for r in children)
    text = (tmp_path / "best.yaml").read_text()
    assert "speedup over no speculation" in text and "speculative-config" in text


def test_failures_are_classified_and_the_study_goes_on(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 4, "trial_timeout_s": 5})
    data["target"]["engine_args"].update({"fake_crash_k": 1, "fake_invalid_k": 2, "fake_hang_k": 3})
    data["candidates"] = [{"name": "ngram", "method": "ngram", "num_speculative_tokens": [1, 6]}]
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": k} for k in (1, 2, 3)]
    assert _run(tmp_path, data) == 0
    study = _load(data)
    by_k = {}
    for t in study.get_trials():
        spec = store.trial_spec(t)
        if spec and not spec.is_baseline:
            by_k[spec.num_speculative_tokens] = t
    assert store.trial_record(by_k[1]).failure_class == "engine_error"
    assert store.trial_record(by_k[2]).failure_class == "invalid_config"
    assert store.trial_record(by_k[3]).failure_class == "timeout"
    assert all(by_k[k].state == optuna.trial.TrialState.FAIL for k in (1, 2, 3))
    client = MlflowClient(data["tracking"]["uri"])
    run = client.get_run(store.trial_record(by_k[3]).mlflow_run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_class"] == "timeout"
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "engine_log_tail.txt" in artifacts


def test_hopeless_draft_is_pruned(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["workload"]["repeats"] = 4
    data["target"]["engine_args"]["fake_repeat_s"] = 0.3
    data["pruning"] = {"enabled": True, "min_acceptance_rate": 0.05}
    data["search"]["first_trials"] = [{"candidate": "draft-4l", "num_speculative_tokens": 2}]
    assert _run(tmp_path, data) == 0
    trial = _load(data).get_trials()[1]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert "acceptance" in store.trial_record(trial).pruned_reason
    assert (store.trial_record(trial).pruning_saved_s or 0) > 0


def test_resume_keeps_trials_and_reaches_the_budget(
    tmp_path: Path, fake_engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = study_dict(tmp_path)
    assert _run(tmp_path, data, "--n-trials", "2") == 0
    capsys.readouterr()
    path = write_study(tmp_path, data)
    argv = ["optimize", "--study", str(path), "--workdir", str(tmp_path / "runs"), "--n-trials", "4"]
    assert main(argv) == 0  # with progress lines (plain: stderr is no terminal here)
    lines = [line for line in capsys.readouterr().err.splitlines() if "; best: " in line]
    assert lines and "best: -" not in lines[0]  # a resumed study shows its best from the first line on
    study = _load(data)
    assert store.budget_used(study) == 4
    baselines = [t for t in study.get_trials() if (s := store.trial_spec(t)) and s.is_baseline]
    assert len({t.number for t in baselines if store.trial_record(t).duplicate_of is None}) == 1
    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    parents = [r for r in client.search_runs([exp.experiment_id]) if store.PARENT_TAG_KEY not in r.data.tags]
    assert len(parents) == 1


def test_changed_study_is_refused(tmp_path: Path, fake_engine: str, capsys: pytest.CaptureFixture[str]) -> None:
    data = study_dict(tmp_path, budget={"trials": 1, "trial_timeout_s": 60})
    assert _run(tmp_path, data) == 0
    data["workload"]["max_tokens"] = 99
    assert _run(tmp_path, data) == 2
    assert "already exists" in capsys.readouterr().err


def test_export_says_when_speculation_does_not_pay(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["pruning"] = {"enabled": False}
    data["search"]["first_trials"] = [{"candidate": "draft-4l", "num_speculative_tokens": 2}]
    assert _run(tmp_path, data) == 0
    text = render_export(_load(data))
    assert "no speculative configuration beat the baseline" in text
    assert "speculative-config" not in text


def test_per_level_metrics(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 4, "trial_timeout_s": 60})
    data["workload"].update({"batch_sizes": [1, 8]})
    assert _run(tmp_path, data) == 0
    study = _load(data)
    complete = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(len(t.values) == 1 for t in complete)
    metrics = store.trial_metrics(complete[0])
    assert metrics is not None
    for bs in (1, 8):
        level = metrics.level(bs)
        assert level is not None
        assert level.tokens_per_s > 0 and level.ttft_median_s is not None and level.tpot_p90_s is not None
    assert "speedup over no speculation" in render_export(study)


def test_pareto_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = study_dict(tmp_path)
    data["workload"]["combine"] = "pareto"
    assert _run(tmp_path, data) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "workload.combine: " in err[0] and "fix:" in err[0], err


def test_secrets_stay_out_of_mlflow_and_exports(
    tmp_path: Path, fake_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_SUPERSECRETVALUE123"
    monkeypatch.setenv("HF_TOKEN", secret)
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["target"]["engine_args"]["hf_token"] = secret
    monkeypatch.chdir(tmp_path)
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    exported = (tmp_path / "best.yaml").read_text()
    assert secret not in exported and "hf-token" not in exported
    study_file = tmp_path / f"{data['name']}.yaml"  # the user's own file: the only place the secret may be
    for path in tmp_path.rglob("*"):
        if path.is_file() and path != study_file:
            assert secret.encode() not in path.read_bytes(), path


def _confirm_study(tmp_path: Path, gain: float) -> dict:
    """Baseline and one n-gram trial measured at factor 1; the four confirmation engines (A, B, A, B)
    then run at 1.10, 1.10, 0.90, 0.90: a between-engine spread of about 20%."""
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["pruning"] = {"enabled": False}
    data["confirm"] = {"rounds": 2}
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 3}]
    data["target"]["engine_args"].update(
        {
            "fake_spec_gain": gain,
            "fake_launch_file": str(tmp_path / "launches"),
            "fake_engine_factors": [1.0, 1.0, 1.10, 1.10, 0.90, 0.90],
        }
    )
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    assert (tmp_path / "launches").read_text() == "6"
    return data


def test_speculative_win_inside_the_engine_spread_is_not_exported(tmp_path: Path, fake_engine: str) -> None:
    data = _confirm_study(tmp_path, gain=1.05)  # 5% faster in its trial, but engines differ by 20%
    study = _load(data)
    conf = outcome.read(study).confirmation
    assert conf is not None and conf.complete and [e.round for e in conf.engines] == [0, 0, 1, 1]
    decision = conf.decide()
    assert decision.winner is None and decision.baseline is not None and decision.baseline.spread > 0.15
    text = (tmp_path / "best.yaml").read_text()
    assert "speculative-config" not in text and "does NOT win beyond the spread" in text
    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`specdec.role` = 'confirmation'")
    assert len(runs) == 4 and all("confirm_value" in r.data.metrics for r in runs)
    parent = client.get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["confirm.winner"] == "none"


def test_speculative_win_beyond_the_engine_spread_is_exported(tmp_path: Path, fake_engine: str) -> None:
    data = _confirm_study(tmp_path, gain=1.5)
    conf = outcome.read(_load(data)).confirmation
    assert conf is not None
    decision = conf.decide()
    assert decision.winner == 1 and decision.speculative[0].low > decision.baseline.high  # type: ignore[union-attr]
    text = (tmp_path / "best.yaml").read_text()
    assert "speculative-config" in text and "WINS beyond the between-engine spread" in text
    from tuner.outputs.report import build_report, render_markdown

    report = build_report(_load(data))
    assert report.paid and report.chosen is not None and report.chosen.number == 1
    assert "**Confirmation in fresh engines**" in render_markdown(report)
    assert any("WINS beyond" in line for line in report.confirmation)


def test_confirmation_is_skipped_when_speculation_is_clearly_behind(tmp_path: Path, fake_engine: str) -> None:
    """At half the baseline's throughput no pair of fresh engines could honestly reverse the order: no engine
    is started, the baseline is served and the file says why; switching the skip off measures them."""
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["pruning"] = {"enabled": False}
    data["confirm"] = {"rounds": 2}
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 3}]
    data["target"]["engine_args"].update(
        {"fake_spec_gain": 0.5, "fake_launch_file": str(tmp_path / "launches"), "fake_engine_factors": [1.0] * 6}
    )
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    assert (tmp_path / "launches").read_text() == "2"  # the two trials, no confirmation engine
    study = _load(data)
    conf = outcome.read(study).confirmation
    assert conf is not None and conf.complete and conf.engines == [] and "trial 1" in conf.skipped
    assert conf.decide().winner is None
    text = (tmp_path / "best.yaml").read_text()
    assert "speculative-config" not in text and "more than the study's noise below it" in text
    assert "none needed" in text and "confirm.skip_when_behind" in text
    parent = MlflowClient(data["tracking"]["uri"]).get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["confirm.winner"] == "none"

    data["confirm"] = {"rounds": 2, "skip_when_behind": False}
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "6"  # now the four engines
    conf = outcome.read(_load(data)).confirmation
    assert conf is not None and not conf.skipped and conf.complete and len(conf.engines) == 4


def test_interrupted_confirmation_resumes_without_remeasuring(tmp_path: Path, fake_engine: str) -> None:
    data = _confirm_study(tmp_path, gain=1.5)
    study = _load(data)
    stored = study.user_attrs[confirmation.CONFIRMATION]
    stored["engines"] = stored["engines"][:3]  # as if interrupted during the fourth engine
    study.set_user_attr(confirmation.CONFIRMATION, stored)
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "7"  # one engine more, not four
    conf = outcome.read(_load(data)).confirmation
    assert conf is not None and conf.complete and conf.engines[:3] == confirmation.load(study).engines[:3]  # type: ignore[union-attr]


def test_repeats_spend_no_budget_and_a_measured_space_ends_the_study(
    tmp_path: Path, fake_engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three configurations, a budget of ten: the study measures each once, reuses the sampler's
    repeats without counting them, and stops when nothing new is left to measure."""
    data = study_dict(tmp_path, budget={"trials": 10, "trial_timeout_s": 60})
    data["candidates"] = [
        {"name": "none", "method": "none"},
        {"name": "ngram", "method": "ngram", "num_speculative_tokens": [1, 2], "prompt_lookup_max": 3},
    ]
    assert _run(tmp_path, data) == 0
    study = _load(data)
    measured = [t for t in study.get_trials() if store.spends_budget(t)]
    assert len({store.trial_spec(t).key() for t in measured}) == len(measured) == 3  # type: ignore[union-attr]
    assert store.budget_used(study) == 3
    numbers = {t.number for t in measured}
    assert all(store.is_repeat(t) for t in study.get_trials() if t.number not in numbers)
    assert "stopping before the budget: every configuration of the space (3) is measured" in capsys.readouterr().err
