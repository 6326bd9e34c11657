"""Pruning: what `pruning.percentile` means, the noise guard, and the time pruning saves."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

from tests.conftest import study_dict, write_study
from tuner.cli import main
from tuner.engine.process import RunOutcome
from tuner.engine.request import ProgressEvent, RepeatMeasurement
from tuner.results import store
from tuner.results.scoring import LevelMetrics, TrialMetrics
from tuner.study.loader import load_study
from tuner.trial.pruning import NOISE_FLOOR, decide, judge, step_of
from tuner.trial.pruning import pruning_saved_s as _pruning_saved_s


def test_percentile_prunes_below_it_not_above() -> None:
    earlier = [10.0, 20.0, 30.0, 40.0, 50.0]
    # 25th percentile is 20: 35 is in the upper three quarters and survives (Optuna's
    # PercentilePruner(25) keeps only the top quarter and would prune it).
    assert not decide(35.0, earlier, 25.0, NOISE_FLOOR, 1).prune
    assert decide(15.0, earlier, 25.0, NOISE_FLOOR, 1).prune


def test_within_the_noise_of_the_best_is_never_pruned() -> None:
    earlier = [150.0, 149.0, 149.5]  # every earlier trial is near the best: the 25th percentile is 149.25
    assert not decide(147.0, earlier, 25.0, NOISE_FLOOR, 1).prune  # 2% below the best
    assert not decide(140.0, earlier, 25.0, 0.08, 1).prune  # a noisier study tolerates more
    assert decide(140.0, earlier, 25.0, NOISE_FLOOR, 1).prune
    assert not decide(10.0, earlier, 25.0, NOISE_FLOOR, 4).prune  # fewer than startup_trials reported


def _done(value_by_step: dict[int, float], cv: float = 0.01) -> optuna.trial.FrozenTrial:
    level = LevelMetrics(
        batch_size=1, tokens_per_s=value_by_step[0], tokens_per_s_mad=0, tokens_per_s_cv=cv, score=0, repeats=[]
    )
    metrics = TrialMetrics(levels=[level], score=1.0, tokens_per_s=value_by_step[0])
    return optuna.trial.create_trial(
        params={"k": 1},
        distributions={"k": IntDistribution(1, 8)},
        value=1.0,
        intermediate_values=value_by_step,
        user_attrs={store.METRICS: metrics.model_dump(mode="json")},
    )


def _interim(study: optuna.Study, value: float, step: int = 0) -> bool:
    """What the engine's progress hook (PruneHook) asks for a running trial's repeat at this step."""
    batch_size = [1, 8][step // 3]
    return judge(study, len(study.trials), step, value, batch_size, 25.0, 3).prune


def test_pruning_compares_like_with_like_in_an_optuna_study() -> None:
    study = optuna.create_study(direction="maximize")
    for values in ({0: 100.0, 3: 400.0}, {0: 150.0, 3: 300.0}, {0: 148.0, 3: 310.0}):  # baseline, two n-gram
        study.add_trial(_done(values))
    # 2% below the best at batch 1, repeat 1 (step 0): survives; mixed with batch 8's values it would not
    assert not _interim(study, 147.0)
    assert _interim(study, 75.0)  # half the best
    assert not _interim(study, 390.0, step=3)  # batch 8, repeat 1: against batch 8's own values
    assert _interim(study, 200.0, step=3)
    noisy = optuna.create_study(direction="maximize")
    for values in ({0: 100.0}, {0: 150.0}, {0: 149.0}):
        noisy.add_trial(_done(values, cv=0.10))  # the study's repeats vary by 10%
    assert not _interim(noisy, 140.0)
    assert step_of([1, 8], 3, 8, 0) == 3


def test_stand_in_trials_near_the_best_survive_and_hopeless_ones_are_pruned(tmp_path: Path, fake_engine: str) -> None:
    data = study_dict(tmp_path, budget={"trials": 5, "trial_timeout_s": 60})
    data["workload"].update({"batch_sizes": [1], "repeats": 3})
    data["target"]["engine_args"].update(
        {"fake_repeat_s": 0.3, "fake_gain": {"4": 1.5, "3": 1.48, "5": 1.47, "2": 0.75}}
    )
    data["pruning"] = {"enabled": True, "min_acceptance_rate": 0.0, "percentile": 25, "startup_trials": 3}
    data["search"]["first_trials"] = [
        {"candidate": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
        for k in (4, 3, 5, 2)
    ]
    path = write_study(tmp_path, data)
    assert main(["optimize", "--study", str(path), "--no-progress", "--workdir", str(tmp_path / "runs")]) == 0
    study = optuna.load_study(study_name=data["name"], storage=data["storage"])
    by_k = {}
    for t in study.get_trials():
        spec = store.trial_spec(t)
        assert spec is not None
        by_k[spec.num_speculative_tokens] = t
    assert by_k[None].intermediate_values  # the baseline reported its repeats for comparison
    assert by_k[None].state == TrialState.COMPLETE
    assert by_k[5].state == TrialState.COMPLETE  # 2% below the best: inside the noise
    assert by_k[2].state == TrialState.PRUNED  # half the best
    assert "percentile" in store.trial_record(by_k[2]).pruned_reason
    assert (store.trial_record(by_k[2]).pruning_saved_s or 0) > 0


def _event(batch_size: int, repeat: int, seconds: float) -> ProgressEvent:
    m = RepeatMeasurement(batch_size=batch_size, repeat=repeat, output_tokens=100, elapsed_s=seconds)
    return ProgressEvent(event="repeat", elapsed_s=0.0, measurement=m)


def _reference(repeat_s: dict[int, list[float]]) -> TrialMetrics:
    levels = [
        LevelMetrics(
            batch_size=bs, tokens_per_s=1, tokens_per_s_mad=0, tokens_per_s_cv=0, score=1, repeats=[], repeat_s=s
        )
        for bs, s in repeat_s.items()
    ]
    return TrialMetrics(levels=levels, score=1.0, tokens_per_s=1.0)


def test_pruning_saved_s_is_estimated_per_batch_size(tmp_path: Path) -> None:
    data = study_dict(tmp_path)
    data["workload"].update({"batch_sizes": [1, 8], "repeats": 3})
    config = load_study(write_study(tmp_path, data))
    outcome = RunOutcome(events=[_event(1, 0, 10.0)])  # pruned after its first batch-1 repeat
    baseline = _reference({1: [5.0, 5.0, 5.0], 8: [2.0, 2.0, 2.0]})
    # 2 batch-1 repeats at its own 10 s, 3 batch-8 repeats at the baseline's 2 s x (10 / 5): not 5 x 10 s
    assert _pruning_saved_s(outcome, config, baseline) == pytest.approx(2 * 10.0 + 3 * 2.0 * 2.0)
    assert _pruning_saved_s(outcome, config, None) == pytest.approx(5 * 10.0)  # no pace known for batch 8
    two = RunOutcome(events=[_event(1, r, 10.0) for r in range(3)] + [_event(8, 0, 3.0)])
    assert _pruning_saved_s(two, config, baseline) == pytest.approx(2 * 3.0)
