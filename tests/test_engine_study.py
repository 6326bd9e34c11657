"""The real thing: CPU vLLM, the packaged demo model, Optuna and MLflow on SQLite.

All tests here share one study (session fixture ``real_study``): baseline, an n-gram trial and a
draft-model trial, run through the CLI exactly as a user runs it.
"""

from __future__ import annotations

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ENV_PREFIX, RealStudy
from tuner.results import store

pytestmark = pytest.mark.engine


def test_cli_finished(real_study: RealStudy) -> None:
    assert real_study.result.returncode == 0, real_study.result.stderr[-3000:]
    assert real_study.export_path.exists()


def test_optuna_trials(real_study: RealStudy) -> None:
    study = optuna.load_study(study_name="real-study", storage=real_study.storage)
    trials = study.get_trials()
    assert len(trials) == 3
    specs = [store.trial_spec(t) for t in trials]
    assert [s.method for s in specs if s] == ["none", "ngram", "draft_model"]
    for t in trials:
        assert t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED), t.user_attrs
    baseline = store.trial_metrics(trials[0])
    assert baseline is not None and baseline.tokens_per_s > 0 and baseline.speedup == 1.0
    assert baseline.engine_start_s > 0
    ngram = store.trial_metrics(trials[1])
    assert ngram is not None
    # vLLM's own counters, diffed over the measured window: n-gram lookup accepts something on copy tasks.
    assert ngram.spec.drafts > 0 and ngram.spec.accepted_tokens > 0
    assert 1.0 < (ngram.spec.mean_acceptance_length or 0) <= 4.0
    assert len(ngram.spec.accepted_per_pos) == 3
    assert ngram.speedup is not None and ngram.speedup > 0
    for batch_size in (1, 4):
        level = ngram.level(batch_size)
        assert level is not None and level.tokens_per_s > 0 and level.speedup
        assert level.ttft_median_s and level.ttft_p90_s and level.tpot_median_s and level.tpot_p90_s
        assert len(level.repeats) == 2 and level.tokens_per_s_cv >= 0
        # float32 on CPU at temperature 0: speculation must not change the output.
        assert level.lossless_match_rate == 1.0, level.first_divergence


def test_mlflow_parent_and_children(real_study: RealStudy) -> None:
    client = MlflowClient(real_study.tracking_uri)
    exp = client.get_experiment_by_name("real-study")
    runs = client.search_runs([exp.experiment_id])
    parent = [r for r in runs if store.PARENT_TAG_KEY not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("specdec.role") == "trial"]
    assert len(parent) == 1 and len(children) == 3
    assert parent[0].info.status == "FINISHED"
    assert "study.yaml" in [a.path for a in client.list_artifacts(parent[0].info.run_id)]
    by_method = {r.data.params["method"]: r for r in children}
    assert set(by_method) == {"none", "ngram", "draft_model"}
    ngram = by_method["ngram"]
    assert ngram.data.params["num_speculative_tokens"] == "3"
    assert ngram.data.params["enforce_eager"] == "True"
    assert ngram.data.metrics["acceptance_rate"] > 0
    history = client.get_metric_history(ngram.info.run_id, "accepted_per_pos_rate")
    assert sorted(m.step for m in history) == [0, 1, 2]
    artifacts = [a.path for a in client.list_artifacts(ngram.info.run_id)]
    assert "vllm_args.json" in artifacts


def test_export_reads_back_through_vllms_own_parser(real_study: RealStudy) -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.26
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]

    text = real_study.export_path.read_text()
    exported = yaml.safe_load(text)
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(dest="subparser")
    make_arg_parser(sub.add_parser("serve"))
    args = top.parse_args(["serve", "--config", str(real_study.export_path)])
    assert args.model == exported["model"]
    assert args.dtype == "float32" and args.max_model_len == 512
    study = optuna.load_study(study_name="real-study", storage=real_study.storage)
    chosen = next(t for t in study.get_trials() if t.number == int(text.split("(trial ")[1].split(")")[0]))
    spec = store.trial_spec(chosen)
    assert spec is not None
    assert args.speculative_config == spec.speculative_config()
    # every engine argument the trial ran with, false booleans included
    for key, value in store.trial_record(chosen).llm_kwargs.items():
        assert getattr(args, key) == value, key
    assert "speedup over no speculation" in text


def test_finalists_confirmed_in_fresh_engines(real_study: RealStudy) -> None:
    from tuner.results import outcome

    study = optuna.load_study(study_name="real-study", storage=real_study.storage)
    conf = outcome.read(study).confirmation
    assert conf is not None and conf.complete
    assert [f.is_baseline for f in conf.finalists] == [False, True]  # A (best speculative), then the baseline
    assert all(e.failure is None and set(e.levels) == {1, 4} for e in conf.engines)
    decision = conf.decide()
    assert decision.baseline is not None and decision.baseline.median == 1.0
    text = real_study.export_path.read_text()
    assert "confirmed in 1 fresh engine(s) per finalist" in text
    assert ("speculative-config" in text) == (decision.winner is not None)
    client = MlflowClient(real_study.tracking_uri)
    exp = client.get_experiment_by_name("real-study")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`specdec.role` = 'confirmation'")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    parent = client.get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["confirm.winner"] == (str(decision.winner) if decision.winner is not None else "none")


def test_every_trial_records_the_model_runner_its_engine_logged(real_study: RealStudy) -> None:
    # vLLM CPU 0.32.0 has no Triton: "Model Runner V2 requires Triton; using the V1 model runner instead.",
    # and a CPU captures no CUDA graphs (tuner.engine.runner_log reads both from each trial's engine.log)
    study = optuna.load_study(study_name="real-study", storage=real_study.storage)
    client = MlflowClient(real_study.tracking_uri)
    expected = {"model_runner": "V1", "cudagraph_mode": "NONE"}
    for t in study.get_trials():
        rec = store.trial_record(t)
        assert {k: (rec.engine or {}).get(k) for k in expected} == expected, (t.number, rec.engine)
        assert rec.mlflow_run_id is not None
        tags = client.get_run(rec.mlflow_run_id).data.tags
        assert {k: tags.get(k) for k in expected} == expected, (t.number, tags)


def test_every_engine_runs_with_the_study_env_and_the_export_names_it(real_study: RealStudy) -> None:
    # target.env: VLLM_LOGGING_PREFIX marks every line vLLM logs in that engine, trials' and confirmation's
    logs = sorted((real_study.dir / "tuner-runs" / "real-study").glob("*/engine.log"))
    names = [p.parent.name for p in logs]
    assert any(n.startswith("trial-") for n in names) and any(n.startswith("confirm-") for n in names), names
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        assert any(line.startswith(ENV_PREFIX) and " INFO " in line for line in lines), log
    study = optuna.load_study(study_name="real-study", storage=real_study.storage)
    assert all(store.trial_record(t).env == {"VLLM_LOGGING_PREFIX": ENV_PREFIX} for t in study.get_trials())
    assert "# measured with the environment VLLM_LOGGING_PREFIX='[specdec-env] ' (target.env)" in (
        real_study.export_path.read_text()
    )
