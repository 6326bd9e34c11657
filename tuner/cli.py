"""Command line: ``python -m tuner COMMAND``. Heavy imports happen inside the commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import UserError

if TYPE_CHECKING:
    from tuner.optimize import OptimizeOptions

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description="Find the fastest speculative-decoding setup for a vLLM deployment, by measurement.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    opt = sub.add_parser("optimize", help="run or resume a study and log every trial to MLflow")
    opt.add_argument("--study", required=True, type=Path, help="study YAML file (studies/*.yaml)")
    opt.add_argument("--n-trials", type=int, help="total trials for the study (default: budget.trials)")
    opt.add_argument("--storage", help="Optuna storage URL (default: the study's, sqlite:///optuna.db)")
    opt.add_argument("--tracking-uri", help="MLflow tracking URI (default: the study's, sqlite:///mlflow.db)")
    opt.add_argument("--export", type=Path, help="write the best configuration to this YAML file at the end")
    opt.add_argument("--workdir", type=Path, help="per-trial engine logs and results (default: tuner-runs/)")
    opt.add_argument("--no-progress", action="store_true", help="print nothing while trials run")
    opt.add_argument("--workers", type=int, default=1, help="run N local worker processes on one study")
    opt.add_argument("--gpus-per-worker", type=int, default=1, help="GPUs each worker owns (with --workers)")

    work = sub.add_parser("worker", help="join a study's shared storage and run trials until its budget is spent")
    work.add_argument("--study", required=True, type=Path, help="study YAML file")
    work.add_argument("--storage", help="shared Optuna storage URL, e.g. postgresql://user:pw@host/db")
    work.add_argument("--tracking-uri", help="shared MLflow tracking URI, e.g. http://mlflow:5000")
    work.add_argument("--n-trials", type=int, help="total trials for the study (default: budget.trials)")
    work.add_argument("--workdir", type=Path, help="per-trial engine logs and results (default: tuner-runs/)")
    work.add_argument("--no-progress", action="store_true")

    exp = sub.add_parser("export", help="write the best trial as a `vllm serve --config` YAML")
    exp.add_argument("--study", required=True, type=Path)
    exp.add_argument("--storage", help="Optuna storage URL (default: the study's)")
    exp.add_argument("--output", required=True, type=Path)

    rep = sub.add_parser("report", help="write a self-contained HTML (or Markdown) report of a study")
    rep.add_argument("--study", required=True, type=Path, help="study YAML file")
    rep.add_argument("--storage", help="Optuna storage URL (default: the study's)")
    rep.add_argument("--output", type=Path, help="report file (default: report.html; Markdown goes to stdout)")
    rep.add_argument(
        "--format", choices=["html", "md"], help="html (default) or md for a pull request (default: from --output)"
    )

    models = sub.add_parser("models", help="demo model management")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    prep = models_sub.add_parser(
        "prepare-demo", help="build SmolLM2-135M-Instruct and its drafts from the packaged GGUF"
    )
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")

    pair = sub.add_parser("check-pair", help="check that a draft model can serve a target model")
    pair.add_argument("--target", required=True)
    pair.add_argument("--draft", required=True)
    pair.add_argument("--trust-remote-code", action="store_true")
    return parser


def _check_positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise UserError(f"{flag}: must be at least 1 (got {value}); fix: pass a positive number")


def _options(args: argparse.Namespace) -> OptimizeOptions:
    from tuner.optimize import OptimizeOptions

    _check_positive(args.n_trials, "--n-trials")
    return OptimizeOptions(
        n_trials=args.n_trials,
        storage=args.storage,
        tracking_uri=args.tracking_uri,
        workdir=args.workdir,
        show_progress=not args.no_progress,
    )


def cmd_worker(args: argparse.Namespace) -> int:
    from tuner.optimize import optimize

    optimize(args.study, _options(args))
    return EXIT_OK


def cmd_optimize(args: argparse.Namespace) -> int:
    from tuner.optimize import optimize, prepare_only

    options = _options(args)
    _check_positive(args.workers, "--workers")
    _check_positive(args.gpus_per_worker, "--gpus-per-worker")
    if args.workers > 1:
        from tuner.workers import run_workers

        runner = prepare_only(args.study, options)
        codes = run_workers(runner, args.study, args.workers, args.gpus_per_worker, runner.workdir / "workers")
        if any(codes):
            print(f"error: worker exit codes {codes}; see {runner.workdir / 'workers'}", file=sys.stderr)
            return EXIT_FAILURE
        runner.finish()
    else:
        runner = optimize(args.study, options)
    if runner.study is not None and runner.tracker is not None:
        from tuner.report import log_study_artifacts

        log_study_artifacts(runner.tracker, runner.parent_run, runner.study, runner.config)
    if runner.study is not None:
        from tuner.export import export_best, render_export

        text = export_best(runner.study, args.export) if args.export else render_export(runner.study)
        if args.export:
            print(f"best configuration written to {args.export}", file=sys.stderr)
        print(text)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from tuner import study_store
    from tuner.export import export_best
    from tuner.study_loader import load_study

    config = load_study(args.study)
    study = study_store.load_existing(args.storage or config.storage, config.name)
    text = export_best(study, args.output)
    print(text)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import report_command

    print(report_command(args.study, args.storage, args.output, args.format))
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from tuner.models.demo import prepare_demo

    models = prepare_demo(force=args.force, log=lambda m: print(m, file=sys.stderr))
    print(models.target)
    for path in models.drafts.values():
        print(path)
    return EXIT_OK


def cmd_check_pair(args: argparse.Namespace) -> int:
    from tuner.pair_check import compare_pair, render
    from tuner.trial_spec import local_path_missing, resolve_model

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    for flag, path in (("--target", target), ("--draft", draft)):
        if local_path_missing(path):
            raise UserError(f"{flag}: {path} does not exist; fix: give a checkpoint directory or demo:NAME")
    report = compare_pair(target, draft, trust_remote_code=args.trust_remote_code)
    print(render(report, target, draft))
    return EXIT_OK if report.compatible else EXIT_BAD_INPUT


COMMANDS = {
    "optimize": cmd_optimize,
    "worker": cmd_worker,
    "export": cmd_export,
    "report": cmd_report,
    "models": cmd_models,
    "check-pair": cmd_check_pair,
}


def quiet_libraries() -> None:
    """Library chatter (experimental-API warnings, MLflow's table creation) hides the progress display."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r".*experimental.*")
    # The tuner drives Optuna with ask/tell and records heartbeats itself (tuner.coordination).
    warnings.filterwarnings("ignore", message=r"Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ("mlflow", "alembic", "optuna"):
        logging.getLogger(name).setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: measured trials are kept; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
