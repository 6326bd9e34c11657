"""The offline engine records the scheduler values it resolved, and a served file pinned with them makes
``vllm serve`` resolve the same (its own defaults differ: vLLM 0.32 CPU serves max_num_seqs 128, not 256)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import study_dict
from tuner.engine import measure
from tuner.engine.offline import resolved_args
from tuner.engine.request import TrialRequest
from tuner.engine.serve_file import RESOLVED_ARGS, pin_resolved, serve_yaml
from tuner.engine.server import serve_args
from tuner.study.config import StudyConfig
from tuner.study.prompts import Prompt
from tuner.study.spec import baseline_spec, llm_kwargs, resolve_model


def test_pin_resolved_fills_only_what_the_arguments_leave_unset() -> None:
    kwargs = {"model": "/m", "max_num_seqs": 8, "max_num_batched_tokens": None}
    pinned = pin_resolved(kwargs, {"max_num_seqs": 256, "max_num_batched_tokens": 4096})
    assert pinned == {"model": "/m", "max_num_seqs": 8, "max_num_batched_tokens": 4096}
    assert kwargs["max_num_batched_tokens"] is None  # the caller's arguments are not changed
    assert pin_resolved(kwargs, {}) == kwargs


def test_resolved_args_reads_the_engine_config_and_nothing_else() -> None:
    scheduler = SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=4096, max_model_len=512)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=scheduler)))
    assert resolved_args(llm) == {"max_num_seqs": 256, "max_num_batched_tokens": 4096}
    # A vLLM that keeps its config elsewhere (or a value that is not a number): nothing is recorded.
    assert resolved_args(SimpleNamespace(llm_engine=SimpleNamespace())) == {}
    assert resolved_args(SimpleNamespace()) == {}
    odd = SimpleNamespace(max_num_seqs=None, max_num_batched_tokens=True)
    assert (
        resolved_args(SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=odd))))
        == {}
    )


def _served_resolution(config: Path) -> dict[str, int]:
    """What ``vllm serve --config FILE`` resolves, the way its own entry point does: its parser, then
    ``AsyncEngineArgs.from_cli_args(...).create_engine_config(usage_context=OPENAI_API_SERVER)``
    (vllm/entrypoints/cli/serve.py, launchers/api_server/entry.py); no server is started."""
    from vllm import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    command = ServeSubcommand()
    command.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(serve_args(config, 8000))
    command.validate(args)
    engine_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
        usage_context=UsageContext.OPENAI_API_SERVER
    )
    return {name: getattr(engine_config.scheduler_config, name) for name in RESOLVED_ARGS}


@pytest.mark.engine
def test_a_pinned_serve_file_resolves_as_the_measured_engine(tmp_path: Path, demo_models: None) -> None:
    study = StudyConfig.model_validate(study_dict(tmp_path))
    kwargs: dict[str, Any] = llm_kwargs(study.target, resolve_model(study.target.model), baseline_spec(True))
    assert not set(RESOLVED_ARGS) & set(kwargs)  # left to vLLM, as a study without engine_args for them does
    request = TrialRequest(
        llm_kwargs=kwargs,
        prompts=[Prompt(id="a", text="The capital of France is")],
        max_tokens=2,
        temperature=0.0,
        batch_sizes=[1],
        repeats=1,
        warmup_prompts=0,
    )
    result = measure.run(request, tmp_path)
    assert set(result.resolved_args) == set(RESOLVED_ARGS), result.resolved_args

    unpinned = tmp_path / "unpinned.yaml"
    unpinned.write_text(serve_yaml(kwargs))
    # The point of pinning, on this CPU build: left to themselves the two entry points differ.
    assert _served_resolution(unpinned) != result.resolved_args
    pinned = tmp_path / "serve.yaml"
    pinned.write_text(serve_yaml(pin_resolved(kwargs, result.resolved_args)))
    assert _served_resolution(pinned) == result.resolved_args
