"""The batch-size schedule's rules: derivation, boundaries, validation, config, pre-flight and export format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import study_dict, write_study
from tuner.engine.serve_file import serve_yaml
from tuner.errors import UserError
from tuner.results.schedule import Option, StaticBest, choose_k, decide, derive, ranges
from tuner.study.config import StudyConfig
from tuner.study.loader import load_study

NOISE = {1: 0.03, 4: 0.03, 16: 0.03}


def _opt(k: int, trial: int, **levels: float) -> Option:
    return Option(k=k, trial=trial, tokens_per_s={int(bs[2:]): v for bs, v in levels.items()})


def test_each_level_takes_the_fastest_k_and_k0_where_the_baseline_wins() -> None:
    options = [_opt(0, 0, bs1=40, bs4=100), _opt(1, 1, bs1=45, bs4=96), _opt(3, 2, bs1=52, bs4=90)]
    d = derive("ngram lookup 1-3 eager", 2, options, [1, 4], NOISE, cap=256)
    assert d.schedule is not None
    assert [(c.level, c.k, c.trial) for c in d.schedule.levels] == [(1, 3, 2), (4, 0, 0)]
    assert d.schedule.vllm_value() == [[1, 1, 3], [2, 256, 0]]
    assert d.schedule.max_k == 3


def test_within_noise_the_smaller_k_is_preferred() -> None:
    # k=3 is fastest at batch 1 but k=2 is 2% behind (inside 3% noise): k=2; k=1 is 5% behind: out.
    options = [_opt(0, 0, bs1=40), _opt(1, 1, bs1=95), _opt(2, 2, bs1=98), _opt(3, 3, bs1=100)]
    choice = choose_k(1, options, 0.03)
    assert choice is not None and (choice.k, choice.fastest_k) == (2, 3)
    # The baseline within noise of the fastest: no speculation.
    assert choose_k(1, [_opt(0, 0, bs1=99), _opt(3, 3, bs1=100)], 0.03).k == 0  # type: ignore[union-attr]
    assert choose_k(1, [_opt(0, 0, bs1=99), _opt(3, 3, bs1=100)], 0.005).k == 3  # type: ignore[union-attr]


def test_boundaries_cover_from_just_above_the_level_below_up_to_the_level() -> None:
    # A level is measured at its size and below (requests finish, the batch shrinks): its k takes the sizes
    # above the measured level below it.
    assert [r.model_dump() for r in ranges([(4, 1), (1, 3), (16, 0)], cap=1024)] == [
        {"start": 1, "end": 1, "k": 3},
        {"start": 2, "end": 4, "k": 1},
        {"start": 5, "end": 1024, "k": 0},
    ]
    # Equal neighbours merge; the first range starts at 1 even when the first level does not.
    assert [r.model_dump() for r in ranges([(2, 3), (4, 3), (16, 0)], cap=64)] == [
        {"start": 1, "end": 4, "k": 3},
        {"start": 5, "end": 64, "k": 0},
    ]
    # The H100 study's levels (2026-12-07): batch 64's k holds 17-64, not only 64 and up.
    assert [r.text() for r in ranges([(1, 3), (4, 3), (16, 0), (64, 3)], cap=1024)] == [
        "1-4: k=3",
        "5-16: k=0",
        "17-1024: k=3",
    ]
    # A cap below the last level: the last range still holds it.
    assert ranges([(1, 2), (512, 0)], cap=256)[-1].model_dump() == {"start": 2, "end": 512, "k": 0}


def test_a_constant_schedule_is_no_schedule() -> None:
    options = [_opt(0, 0, bs1=40, bs4=100), _opt(3, 2, bs1=52, bs4=130)]
    d = derive("ngram", 2, options, [1, 4], NOISE)
    assert d.schedule is None and "constant: k=3" in d.note and [c.k for c in d.levels] == [3, 3]
    d = derive("ngram", 2, [_opt(0, 0, bs1=50, bs4=100), _opt(3, 2, bs1=40, bs4=80)], [1, 4], NOISE)
    assert d.schedule is None and "no speculation" in d.note and d.drafter == "ngram"
    # what k=0 won against, kept for the export's numbers
    assert [(c.best_spec_k, c.best_spec_tokens_per_s) for c in d.levels] == [(3, 40), (3, 80)]
    assert derive("ngram", 2, options, [1], NOISE).note.startswith("one measured level")


def test_derived_ranges_mean_the_chosen_k_in_vllms_own_lookup() -> None:
    """vLLM expands the ranges into a dense batch size -> k table (vllm/v1/spec_decode/dynamic/utils.py)."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    options = [
        _opt(0, 0, bs1=40, bs4=100, bs16=300),
        _opt(1, 1, bs1=45, bs4=110, bs16=290),
        _opt(4, 2, bs1=60, bs4=104, bs16=250),
    ]
    d = derive("ngram", 2, options, [1, 4, 16], NOISE, cap=64)
    assert d.schedule is not None
    dense = build_dynamic_sd_schedule_lookup(d.schedule.vllm_value(), 64, d.schedule.max_k)
    assert [dense[bs] for bs in (1, 2, 3, 4, 5, 15, 16, 64)] == [4, 1, 1, 1, 0, 0, 0, 0]


def _best(trial: int, tps: float) -> StaticBest:
    return StaticBest(trial=trial, label=f"trial {trial}", tokens_per_s=tps)


def test_validation_needs_the_fresh_engines_every_level_within_noise_and_a_higher_score() -> None:
    best = {1: _best(2, 52.0), 4: _best(0, 100.0)}
    won = (True, "its engines 1.20-1.25 beat the baseline engines up to 1.02")
    ok = decide({1: 51.0, 4: 99.0}, {1: 1.27, 4: 0.99}, 1.13, best, NOISE, (2, "ngram k=3", 1.10), won)
    assert ok.exported and all(c.within for c in ok.levels) and "over its 1.100" in ok.reason
    assert ok.reason.startswith(won[1])
    slow = decide({1: 49.0, 4: 99.0}, {}, 1.13, best, NOISE, (2, "ngram k=3", 1.10), won)
    assert not slow.exported and slow.reason.startswith("at level 1 ") and not slow.levels[0].within
    low = decide({1: 51.0, 4: 99.0}, {}, 1.10, best, NOISE, (2, "ngram k=3", 1.10), won)
    assert not low.exported and "not above" in low.reason
    missing = decide({1: 51.0}, {}, 1.2, best, NOISE, (2, "ngram k=3", 1.10), won)
    assert not missing.exported and "at level 4" in missing.reason
    lost = (False, "its engines 0.98-1.25 do not all beat the baseline engines up to 1.02")
    lucky = decide({1: 51.0, 4: 99.0}, {1: 1.27, 4: 0.99}, 1.13, best, NOISE, (2, "ngram k=3", 1.10), lost)
    assert not lucky.exported and lucky.reason == f"not confirmed in fresh engines: {lost[1]}"


# -- config and pre-flight ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({"enabled": True, "drafter": "nope"}, "schedule.drafter names candidate 'nope'"),
        ({"enabled": True, "drafter": "none"}, "method none takes no batch-size schedule"),
        ({"drafter": "ngram"}, "schedule.enabled is false"),
        ({"enabled": "sometimes"}, "schedule.enabled"),
        ({"enabled": True}, "validated among the confirmation's fresh engines"),
    ],
)
def test_schedule_settings_are_checked_in_one_line(tmp_path: Path, schedule: dict[str, Any], message: str) -> None:
    data = study_dict(tmp_path, schedule=schedule)
    with pytest.raises(UserError) as info:
        load_study(write_study(tmp_path, data))
    assert message in str(info.value) and "fix:" in str(info.value) and "\n" not in str(info.value)


def _fake_vllm(monkeypatch: pytest.MonkeyPatch, schedule_error: str | None = None) -> list[dict[str, Any]]:
    from tuner.engine import preflight, vllm_checks

    seen: list[dict[str, Any]] = []

    def validate(configs: list[dict[str, Any]], timeout_s: float = 0.0) -> list[str | None]:
        seen.extend(configs)
        return [schedule_error if "num_speculative_tokens_per_batch_size" in c else None for c in configs]

    monkeypatch.setattr(vllm_checks, "validate_in_subprocess", validate)
    monkeypatch.setattr(preflight, "_VERDICTS", {})
    return seen


def _config(tmp_path: Path, **schedule: Any) -> StudyConfig:
    data = study_dict(tmp_path, schedule={"enabled": True, **schedule}, confirm={"enabled": True})
    data["workload"]["batch_sizes"] = [1, 4]
    data["target"]["engine_args"]["data_parallel_size"] = 2
    return StudyConfig.model_validate(data)


def test_data_parallel_skips_the_schedule_with_a_note_or_fails_when_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.engine.preflight import check_schedule

    _fake_vllm(monkeypatch)
    note = check_schedule(_config(tmp_path))
    assert note is not None and "data_parallel_size > 1 (here 2)" in note
    with pytest.raises(UserError, match=r"^schedule: vLLM drops .*; fix: "):
        check_schedule(_config(tmp_path, drafter="ngram"))


def test_a_vllm_without_the_key_is_found_before_any_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.engine.preflight import check_schedule

    seen = _fake_vllm(monkeypatch, schedule_error="unexpected keyword argument")
    data = study_dict(tmp_path, schedule={"enabled": True}, confirm={"enabled": True})
    data["workload"]["batch_sizes"] = [1, 4]
    note = check_schedule(StudyConfig.model_validate(data))
    assert note is not None and "rejects num_speculative_tokens_per_batch_size (unexpected keyword" in note
    assert seen[-1]["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 2, 0]]
    data["workload"]["batch_sizes"] = [4]
    assert "one batch size" in (check_schedule(StudyConfig.model_validate(data)) or "")


def test_enabling_the_schedule_keeps_the_studys_fingerprint(tmp_path: Path) -> None:
    """A finished study can be given a schedule afterwards: its trials stay comparable."""
    from tuner.trial.optimize import OptimizeOptions, StudyRunner

    def mark(schedule: dict[str, Any]) -> str:
        config = load_study(write_study(tmp_path, study_dict(tmp_path, schedule=schedule, confirm={"enabled": True})))
        runner = StudyRunner(config, "", OptimizeOptions())
        study = runner._create_study(__import__("optuna").storages.InMemoryStorage())
        return str(study.user_attrs["fingerprint"])

    assert mark({"enabled": False}) == mark({"enabled": True, "drafter": "ngram"})


# -- export format -------------------------------------------------------------------------------------
SCHEDULED: dict[str, Any] = {
    "model": "/models/SmolLM2-135M-Instruct",
    "dtype": "float32",
    "enforce_eager": True,
    "disable_log_stats": False,
    "max_model_len": 512,
    "speculative_config": {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
        "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 1024, 0]],
    },
}


def parse_with_vllm(path: Path) -> Any:
    """The file as ``vllm serve --config`` reads it, then vLLM's own SpeculativeConfig of it."""
    from vllm.config import SpeculativeConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(["--config", str(path)]))
    return SpeculativeConfig(**engine_args.speculative_config)


def test_a_schedule_survives_vllms_parser(tmp_path: Path) -> None:
    text = serve_yaml(SCHEDULED)
    assert "  - [1, 3, 3]\n  - [4, 1024, 0]\n" in text
    assert yaml.safe_load(text)["speculative-config"] == SCHEDULED["speculative_config"]
    path = tmp_path / "best.yaml"
    path.write_text("# header\n" + text)
    spec = parse_with_vllm(path)
    assert spec.uses_dynamic_speculative_decoding()
    assert [list(r) for r in spec.num_speculative_tokens_per_batch_size] == [[1, 3, 3], [4, 1024, 0]]
    assert spec.num_speculative_tokens == 3
