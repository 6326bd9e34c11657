"""The search loop end to end with a fake engine: fast, deterministic, real Optuna and MLflow."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import study_dict, write_study
from tuner import study_store as store
from tuner.cli import main
from tuner.export import render_export


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
    assert len(trials) == 6
    first = store.trial_spec(trials[0])
    assert first is not None and first.is_baseline
    assert (
        sum(
            1 for t in trials if (s := store.trial_spec(t)) and s.is_baseline and store.DUPLICATE_OF not in t.user_attrs
        )
        == 1
    )

    client = MlflowClient(data["tracking"]["uri"])
    exp = client.get_experiment_by_name(data["name"])
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(store.PARENT_TAG_KEY) is None]
    children = [r for r in runs if r.data.tags.get(store.PARENT_TAG_KEY)]
    assert len(parents) == 1 and len(children) == 6
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
    assert by_k[1].user_attrs[store.FAILURE] == "engine_error"
    assert by_k[2].user_attrs[store.FAILURE] == "invalid_config"
    assert by_k[3].user_attrs[store.FAILURE] == "timeout"
    assert all(by_k[k].state == optuna.trial.TrialState.FAIL for k in (1, 2, 3))
    client = MlflowClient(data["tracking"]["uri"])
    run = client.get_run(by_k[3].user_attrs[store.MLFLOW_RUN])
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
    assert "acceptance" in trial.user_attrs[store.PRUNED_REASON]
    assert trial.user_attrs["pruning_saved_s"] > 0


def test_resume_keeps_trials_and_reaches_the_budget(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path)
    assert _run(tmp_path, data, "--n-trials", "2") == 0
    assert _run(tmp_path, data, "--n-trials", "4") == 0
    study = _load(data)
    assert len(study.get_trials()) == 4
    baselines = [t for t in study.get_trials() if (s := store.trial_spec(t)) and s.is_baseline]
    assert len({t.number for t in baselines if store.DUPLICATE_OF not in t.user_attrs}) == 1
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


def test_per_level_metrics_and_pareto_objectives(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 4, "trial_timeout_s": 60})
    data["workload"].update({"batch_sizes": [1, 8], "combine": "pareto"})
    assert _run(tmp_path, data) == 0
    study = _load(data)
    assert len(study.directions) == 2
    complete = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert complete and all(len(t.values) == 2 for t in complete)
    metrics = store.trial_metrics(complete[0])
    assert metrics is not None
    for bs in (1, 8):
        level = metrics.level(bs)
        assert level is not None
        assert level.tokens_per_s > 0 and level.ttft_median_s is not None and level.tpot_p90_s is not None
    assert study.best_trials
    assert "speedup over no speculation" in render_export(study)


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
