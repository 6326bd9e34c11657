"""The study's one answer (tuner.results.outcome): the rules it applies when baselines fail, references move,
the confirmation is re-planned, and what export, report and MLflow read from it. Stand-in engines
(tests.fake_engine) and hand-made Optuna studies: no vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tests.conftest import study_dict, write_study
from tuner.cli import main
from tuner.outputs.report import build_report, render_markdown
from tuner.results import confirmation, outcome, store
from tuner.results.confirmation import Confirmation, EngineRun, Finalist
from tuner.results.record import RECORD
from tuner.results.scoring import SLO_RATE_LEVEL, LevelMetrics, TrialMetrics
from tuner.study.spec import TrialSpec
from tuner.trial.rescored_sampler import RescoredSampler, rescored_trials


def _run(tmp_path: Path, data: dict[str, Any], *extra: str) -> int:
    path = write_study(tmp_path, data)
    return main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs"), *extra])


def _load(data: dict[str, Any]) -> optuna.Study:
    return optuna.load_study(study_name=data["name"], storage=data["storage"])


# -- a failed baseline ------------------------------------------------------------------------------------
def test_a_compiled_draft_is_not_credited_with_the_cuda_graph_gain(tmp_path: Path, fake_engine: str) -> None:
    """The compiled baseline never completes: a compiled n-gram trial that only matches no speculation in its
    own mode (CUDA graphs make it 1.8x the eager baseline) must not be exported as a 1.8x speedup."""
    data = study_dict(tmp_path, budget={"trials": 6, "trial_timeout_s": 60})
    data["search"]["enforce_eager"] = [True, False]
    data["search"]["first_trials"] = [
        {
            "candidate": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 2,
            "enforce_eager": False,
        }
    ]
    data["pruning"] = {"enabled": False}
    data["target"]["engine_args"].update(
        {"fake_spec_gain": 1.0, "fake_compiled_gain": 1.8, "fake_crash_baseline": "compiled"}
    )
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    study = _load(data)
    compiled = [t for t in study.trials if (s := store.trial_spec(t)) and s.is_baseline and not s.enforce_eager]
    assert [t.state for t in compiled] == [TrialState.FAIL] * 3  # retried up to MAX_ATTEMPTS
    text = (tmp_path / "best.yaml").read_text()
    assert "speculative-config" not in text and "serves WITHOUT speculation" in text
    assert "speedup unknown for trials" in text
    out = outcome.read(study)
    assert out.verdict == "no speculation" and out.unknown_speedup and out.speedup is None
    assert next(b.failures for b in out.baselines if not b.enforce_eager)[0].endswith("engine_error")


def test_no_completed_baseline_declares_no_winner(
    tmp_path: Path, fake_engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = study_dict(tmp_path, budget={"trials": 4, "trial_timeout_s": 60})
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 3}]
    data["target"]["engine_args"]["fake_crash_baseline"] = "all"
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "no baseline without speculation completed" in err[0] and "fix:" in err[0]
    assert not (tmp_path / "best.yaml").exists()
    report = build_report(_load(data))
    assert not report.paid and report.best_config is None and "no baseline" in report.best_config_note


# -- the reference moves ------------------------------------------------------------------------------
def _metrics(tps: float, cv: float = 0.0) -> TrialMetrics:
    level = LevelMetrics(
        batch_size=1, tokens_per_s=tps, tokens_per_s_mad=0.0, tokens_per_s_cv=cv, score=tps, repeats=[tps]
    )
    return TrialMetrics(levels=[level], score=0.0, tokens_per_s=tps)


def _trial(spec: TrialSpec, tps: float, stored_value: float) -> optuna.trial.FrozenTrial:
    record = {"spec": spec.model_dump(mode="json"), "metrics": _metrics(tps).model_dump(mode="json")}
    return optuna.trial.create_trial(
        params={"candidate": spec.candidate},
        distributions={"candidate": CategoricalDistribution(["none", "ngram", "draft"])},
        value=stored_value,
        user_attrs={RECORD: record},
    )


def _moved_reference_study() -> optuna.Study:
    """Trial 1 was scored 1.375 against the eager baseline (100 tok/s); the compiled baseline (200 tok/s)
    came later. Against it, trial 1 is 0.69x and trial 2 (stored 0.90) is 0.95x."""
    study = optuna.create_study(direction="maximize")
    eager = TrialSpec(candidate="none", method="none", enforce_eager=True)
    compiled = TrialSpec(candidate="none", method="none", enforce_eager=False)
    ngram = TrialSpec(candidate="ngram", method="ngram", num_speculative_tokens=3, enforce_eager=False)
    draft = TrialSpec(candidate="draft", method="draft_model", num_speculative_tokens=2, enforce_eager=False)
    study.add_trial(_trial(eager, 100.0, 1.0))
    study.add_trial(_trial(ngram, 137.5, 1.375))
    study.add_trial(_trial(draft, 190.0, 0.90))
    study.add_trial(_trial(compiled, 200.0, 1.0))
    return study


def test_the_finalist_is_ranked_by_its_score_against_the_current_reference() -> None:
    study = _moved_reference_study()
    assert [t.number for t in confirmation.speculative_finalists(study, 1)] == [2]


def test_the_sampler_sees_every_value_against_the_current_reference() -> None:
    study = _moved_reference_study()
    values = {t.number: t.value for t in rescored_trials(study, study.trials)}
    assert values == pytest.approx({0: 0.5, 1: 0.6875, 2: 0.95, 3: 1.0})
    seen: list[dict[int, float | None]] = []

    class Spy(optuna.samplers.RandomSampler):
        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            seen.append({t.number: t.value for t in study._get_trials(deepcopy=False, states=(TrialState.COMPLETE,))})
            return {}

    study.sampler = RescoredSampler(Spy())
    study.ask().suggest_categorical("candidate", ["none", "ngram", "draft"])
    assert seen and seen[0] == pytest.approx({0: 0.5, 1: 0.6875, 2: 0.95, 3: 1.0})


# -- the confirmation -----------------------------------------------------------------------------------
def _ngram_against_baseline(
    weights: dict[int, float], rounds: list[tuple[dict[int, float], dict[int, float]]]
) -> Confirmation:
    """A confirmation of one n-gram finalist (trial 1) against the baseline (trial 0): per round, each one's
    engine levels."""
    return Confirmation(
        finalists=[
            Finalist(trial=1, label="ngram k=3", is_baseline=False),
            Finalist(trial=0, label="none", is_baseline=True),
        ],
        rounds=len(rounds),
        repeats=1,
        weights=weights,
        engines=[
            EngineRun(round=r, trial=t, levels=levels)
            for r, (spec, base) in enumerate(rounds)
            for t, levels in ((1, spec), (0, base))
        ],
    )


def test_the_engines_left_are_the_planned_ones_not_yet_measured() -> None:
    conf = _ngram_against_baseline({1: 1.0}, [({1: 26.0}, {1: 20.0})] * 3)
    assert conf.engines_to_run() == 0 and conf.complete
    conf.engines = [e for e in conf.engines if not (e.round == 1 and e.trial == 1) and e.round != 2]
    assert conf.engines_to_run() == 3 and not conf.complete  # round 1's n-gram, round 2's two
    conf.skipped = "behind the baseline"
    assert conf.engines_to_run() == 0  # a skipped confirmation plans no engine


def test_goodput_confirmation_passes_when_the_baseline_keeps_the_slo_at_no_rate() -> None:
    conf = _ngram_against_baseline({SLO_RATE_LEVEL: 1.0}, [({SLO_RATE_LEVEL: 2.0}, {SLO_RATE_LEVEL: 0.0})] * 2)
    decision = conf.decide()
    assert decision.winner == 1 and decision.baseline is not None and decision.baseline.high == 0.0
    assert "kept it at no rate tried" in conf.summary_lines()[0]


def test_the_confirmation_states_each_levels_speedup_over_the_baseline_engines() -> None:
    """A drafter that wins at batch 1 and loses at batch 8: the weighted median hides that, the per-level
    line says it (median over the finalist's engines of its tokens/s over the baseline engines' median)."""
    conf = _ngram_against_baseline(
        {1: 0.75, 8: 0.25},
        [
            ({1: 26.0, 8: 90.0}, {1: 20.0, 8: 100.0}),
            ({1: 28.0, 8: 94.0}, {1: 21.0, 8: 98.0}),
            ({1: 30.0, 8: 80.0}, {1: 19.0, 8: 102.0}),
        ],
    )
    (spec,) = conf.decide().speculative
    assert spec.per_level == pytest.approx({1: 28.0 / 20.0, 8: 90.0 / 100.0})
    lines = conf.summary_lines("concurrency")
    assert "confirmed per level (median over its engines): concurrency 1: 1.40x, concurrency 8: 0.90x" in lines[-1]


def _confirmed(tmp_path: Path, **confirm: Any) -> dict[str, Any]:
    data = study_dict(tmp_path, budget={"trials": 3, "trial_timeout_s": 60})
    data["pruning"] = {"enabled": False}
    data["confirm"] = {"rounds": 1, "skip_when_behind": False, **confirm}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
        for k in (3, 2)
    ]
    data["target"]["engine_args"].update(
        {
            "fake_gain": {"3": 1.3, "2": 1.2},
            "fake_launch_file": str(tmp_path / "launches"),
            "fake_engine_factors": [1.0],
        }
    )
    return data


def test_a_new_finalist_set_or_repeats_keeps_the_engines_measured_before(tmp_path: Path, fake_engine: str) -> None:
    data = _confirmed(tmp_path)
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "5"  # 3 trials, k=3 and the baseline
    first = confirmation.load(_load(data))
    assert first is not None and first.complete and len(first.engines) == 2

    data["confirm"]["repeats"] = 1  # was workload.repeats (2): the engines measured another thing
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "7"
    data["confirm"]["speculative"] = 2
    assert _run(tmp_path, data) == 0
    assert (tmp_path / "launches").read_text() == "10"  # k=3, k=2 and the baseline
    study = _load(data)
    kept = confirmation.history(study)
    assert [len(c.engines) for c in kept] == [2, 2] and kept[0].engines == first.engines
    assert [c.repeats for c in kept] == [2, 1]
    out = outcome.read(study)
    assert out.confirmation is not None and len(out.confirmation.finalists) == 3


def test_export_report_and_mlflow_render_the_stored_outcome(tmp_path: Path, fake_engine: str) -> None:
    data = _confirmed(tmp_path)
    data["workload"]["batch_sizes"] = [1, 4]
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    study = _load(data)
    stored = outcome.load(study)
    assert stored is not None and stored == outcome.read(study) and stored.verdict == "speculation"
    assert stored.exported is not None and stored.exported.trial == 1 and stored.confirmed
    assert (
        "confirmed per level (median over its engines): batch 1: 1.30x, batch 4: 1.30x"
        in (tmp_path / "best.yaml").read_text()
    )
    # Every renderer reads that object: a changed stored outcome changes all of them, recomputing nothing.
    stored.reason = "SENTINEL reason"
    stored.verdict, stored.chosen = "no speculation", stored.baseline
    base_kwargs = store.trial_record(study.trials[0]).llm_kwargs
    stored.exported = stored.exported.model_copy(
        update={"trial": 0, "label": "none eager", "speculative": False, "llm_kwargs": base_kwargs}
    )
    outcome.save(study, stored)
    report = build_report(study)
    assert not report.paid and report.chosen is not None and report.chosen.number == 0
    assert "speculative-config" not in (report.best_config or "")
    assert "SENTINEL reason" in render_markdown(report)
    parent = MlflowClient(data["tracking"]["uri"]).get_run(study.user_attrs[store.PARENT_RUN])
    assert parent.data.tags["outcome.verdict"] == "speculation" and parent.data.tags["confirm.winner"] == "1"
    assert parent.data.metrics["confirm_speedup_trial1_level1"] == pytest.approx(1.3, abs=0.01)
    best = MlflowClient(data["tracking"]["uri"]).search_runs(
        [parent.info.experiment_id], filter_string="tags.best = 'true'"
    )
    assert [r.data.tags["optuna.trial_number"] for r in best] == ["1"]


def test_a_rate_search_cut_by_its_time_limit_is_exported_as_a_lower_bound(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 2, "trial_timeout_s": 60})
    data["search"]["first_trials"] = [{"candidate": "ngram", "num_speculative_tokens": 3}]
    data["pruning"] = {"enabled": False}
    data["workload"].update(
        {
            "mode": "serve",
            "batch_sizes": [1],
            "serve": {
                "objective": "goodput",
                "slo": {"percentile": 90, "ttft_ms": 100, "tpot_ms": 30},
                "rate_search": {"start_rps": 1, "max_rps": 64, "time_limit_s": 0.5},
            },
        }
    )
    data["target"]["engine_args"]["fake_probe_s"] = 0.3
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    text = (tmp_path / "best.yaml").read_text()
    line = next(line for line in text.splitlines() if line.startswith("# SLO "))
    assert "or more (a lower bound: the search stopped at its time limit)" in line, line


@pytest.mark.parametrize(
    ("factors", "verdict", "speedup"), [([1.0], "speculation", 1.3), ([1, 1, 1, 0.5, 1], "no speculation", 1.0)]
)
def test_the_parent_run_states_the_served_answer_not_the_best_trial(
    tmp_path: Path, fake_engine: str, factors: list[float], verdict: str, speedup: float
) -> None:
    data = _confirmed(tmp_path)
    # Engines 0-2 are the trials (k=3 at 1.3x the baseline leads); 3 and 4 the confirmation of k=3, then the baseline.
    data["target"]["engine_args"]["fake_engine_factors"] = factors
    assert _run(tmp_path, data) == 0
    study = _load(data)
    out = outcome.read(study)
    assert out.verdict == verdict and out.confirmed
    parent = MlflowClient(data["tracking"]["uri"]).get_run(study.user_attrs[store.PARENT_RUN])
    metrics = parent.data.metrics
    assert metrics["answer_speedup"] == pytest.approx(speedup, rel=0.05) and metrics["answer_confirmed"] == 1.0
    assert metrics["trials_best_speedup"] == pytest.approx(1.3, rel=0.05)  # the trials alone said speculation
    assert "best_speedup" not in metrics


@pytest.mark.parametrize(("gains", "served"), [({"3": 1.30, "2": 1.28}, 2), ({"3": 1.40, "2": 1.20}, 3)])
def test_winners_within_the_noise_serve_the_fewest_speculative_tokens(
    tmp_path: Path, fake_engine: str, gains: dict[str, float], served: int
) -> None:
    # k=3 and k=2 both beat the baseline in fresh engines; 1.30x against 1.28x is inside the study's noise
    # (3%: the fake engine's repeats do not vary), so the one that drafts less is served; 1.40x against 1.20x is not
    data = _confirmed(tmp_path, speculative=2)
    data["target"]["engine_args"]["fake_gain"] = gains
    assert _run(tmp_path, data, "--export", str(tmp_path / "best.yaml")) == 0
    study = _load(data)
    out = outcome.read(study)
    assert out.verdict == "speculation" and out.chosen is not None
    chosen = store.trial_spec(study.trials[out.chosen])
    assert chosen is not None and chosen.num_speculative_tokens == served
    text = (tmp_path / "best.yaml").read_text()
    assert yaml.safe_load(text)["speculative-config"]["num_speculative_tokens"] == served
    assert ("with fewer speculative tokens" in text) == (served == 2)


@pytest.mark.parametrize(
    ("gains", "finalist"), [({"4": 1.31, "3": 1.30, "2": 1.29}, 2), ({"4": 1.40, "3": 1.2, "2": 1.1}, 4)]
)
def test_trials_within_the_noise_send_the_fewest_speculative_tokens_to_the_fresh_engines(
    tmp_path: Path, fake_engine: str, gains: dict[str, float], finalist: int
) -> None:
    # One finalist: k=4, 3 and 2 scored within the study's noise (3%) are a tie, so the one the confirmation
    # would serve among tied winners (the fewest tokens) gets the fresh engines, not the top score by a hair
    data = _confirmed(tmp_path, speculative=1)
    data["budget"]["trials"] = 4
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
        for k in (4, 3, 2)
    ]
    data["target"]["engine_args"]["fake_gain"] = gains
    assert _run(tmp_path, data) == 0
    study = _load(data)
    conf = confirmation.load(study)
    assert conf is not None and conf.complete
    confirmed = [store.trial_spec(study.trials[f.trial]) for f in conf.finalists if not f.is_baseline]
    assert [s.num_speculative_tokens for s in confirmed if s is not None] == [finalist]
    assert outcome.read(study).verdict == "speculation"
