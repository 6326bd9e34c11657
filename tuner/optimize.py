"""``tuner optimize``: run (or resume) an Optuna study whose trials are real vLLM engines."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner import study_store as store
from tuner.coordination import Heartbeat, study_lock
from tuner.errors import UserError
from tuner.hardware import Hardware
from tuner.hardware import describe as describe_hardware
from tuner.measurement import ProgressEvent, TrialRequest
from tuner.plots import log_acceptance_plot
from tuner.preflight import Preflight, run_preflight
from tuner.progress import ProgressView
from tuner.prompts import Prompt, load_prompts
from tuner.redaction import redact
from tuner.runner import RunOutcome, log_tail, run_engine
from tuner.scoring import TrialMetrics, score_result
from tuner.space import baseline_params, first_trial_params, suggest
from tuner.study_config import StudyConfig
from tuner.tracking import Tracker
from tuner.trial_spec import TrialSpec, llm_kwargs

MAX_ATTEMPTS = 3


class TrialFailed(Exception):
    """The engine failed; Optuna records the trial as FAIL and the study goes on."""


@dataclass
class OptimizeOptions:
    n_trials: int | None = None
    storage: str | None = None
    tracking_uri: str | None = None
    workdir: Path | None = None
    show_progress: bool = True


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class StudyRunner:
    def __init__(self, config: StudyConfig, study_text: str, options: OptimizeOptions) -> None:
        self.config = config
        self.study_text = study_text
        self.budget = options.n_trials or config.budget.trials
        self.storage_url = options.storage or config.storage
        self.tracking_uri = options.tracking_uri or config.tracking.uri
        self.workdir = ((options.workdir or Path("tuner-runs")) / config.name).resolve()
        self.show_progress = options.show_progress
        self.prompts: list[Prompt] = []
        self.preflight: Preflight | None = None
        self.study: optuna.Study | None = None
        self.tracker: Tracker | None = None
        self.parent_run: str = ""
        self.view: ProgressView | None = None
        self.hardware = Hardware(host="", accelerator="")
        self.storage: Any = None
        self._mlflow_closed: set[int] = set()  # trials whose MLflow run is known to be closed
        self.multi_objective = config.workload.combine == "pareto"

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything that can refuse bad input runs before anything is written."""
        self.prompts = load_prompts(self.config.workload.prompts)
        if self.config.workload.max_prompts:
            self.prompts = self.prompts[: self.config.workload.max_prompts]
        self.preflight = run_preflight(self.config)
        for name, reason in self.preflight.rejected.items():
            print(f"warning: candidate '{name}' removed from the search space: {reason}", file=sys.stderr)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = storage = store.open_storage(self.storage_url)
        self.hardware = describe_hardware()
        with study_lock(storage, self.config.name):  # several workers may start at once
            self.tracker = open_tracker(self.tracking_uri, self.config.experiment_name)
            self.study = self._create_study(storage)
            self._check_hardware()
            self._open_parent()

    def _check_hardware(self) -> None:
        """Throughput from different hardware is not comparable: one study, one hardware class."""
        assert self.study is not None
        mine = self.hardware.hardware_class
        theirs = self.study.user_attrs.get(store.HARDWARE_CLASS)
        if theirs is None:
            self.study.set_user_attr(store.HARDWARE_CLASS, mine)
        elif theirs != mine:
            raise UserError(
                f"study '{self.config.name}' was measured on '{theirs}' but this worker has '{mine}'; "
                "fix: run this worker on the same hardware class, or start a study of its own (new name)"
            )

    def _create_study(self, storage: Any) -> optuna.Study:
        cfg = self.config
        sampler: optuna.samplers.BaseSampler
        if cfg.search.sampler == "random":
            sampler = optuna.samplers.RandomSampler(seed=cfg.search.seed)
        else:
            sampler = optuna.samplers.TPESampler(
                seed=cfg.search.seed,
                n_startup_trials=cfg.search.startup_trials,
                multivariate=True,
                group=True,
                constant_liar=True,
            )
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
        if cfg.pruning.enabled and not self.multi_objective:
            pruner = optuna.pruners.PercentilePruner(
                cfg.pruning.percentile, n_startup_trials=cfg.pruning.startup_trials, n_warmup_steps=0
            )
        study = optuna.create_study(
            study_name=cfg.name,
            storage=storage,
            sampler=sampler,
            pruner=pruner,
            directions=["maximize"] * (len(cfg.workload.batch_sizes) if self.multi_objective else 1),
            load_if_exists=True,
        )
        mark = store.fingerprint(cfg.model_dump(mode="json", exclude={"budget", "tracking", "storage", "description"}))
        existing = study.user_attrs.get(store.FINGERPRINT)
        if existing is None:
            study.set_user_attr(store.FINGERPRINT, mark)
            study.set_user_attr(store.STUDY_FILE, redact(self.study_text))
        elif existing != mark:
            raise UserError(
                f"name: study '{cfg.name}' already exists in {self.storage_url} with other settings "
                "(target, candidates, search or workload changed); fix: give the study a new name or use another storage"
            )
        return study

    def _open_parent(self) -> None:
        assert self.study is not None and self.tracker is not None
        previous = self.study.user_attrs.get(store.PARENT_RUN)
        self.parent_run = self.tracker.open_parent(
            previous, self.config.name, {"optuna.storage": _safe_url(self.storage_url)}
        )
        if previous != self.parent_run:
            self.study.set_user_attr(store.PARENT_RUN, self.parent_run)
            self.tracker.log_text(self.parent_run, self.study_text, "study.yaml")
            self.tracker.log_params(self.parent_run, _study_params(self.config))
        assert self.preflight is not None
        if self.preflight.rejected:
            self.tracker.log_dict(self.parent_run, self.preflight.rejected, "preflight_rejected.json")
            self.tracker.set_tags(self.parent_run, {"preflight.rejected": ", ".join(self.preflight.rejected)})

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        assert self.study is not None and self.tracker is not None
        with self._lock():
            self._reconcile()
            self._enqueue_baselines()
        self.view = ProgressView(self.config.name, self.budget, store.budget_used(self.study), self.show_progress)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        status = "KILLED"
        try:
            while (trial := self._next_trial()) is not None:
                self._run_trial(trial)
            status = "FINISHED"
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.view.close()
            self._summarise_parent(status)

    def _lock(self) -> AbstractContextManager[None]:
        assert self.study is not None
        return study_lock(self.storage, self.config.name)

    def _next_trial(self) -> Trial | None:
        """Atomically across workers: ask for a trial only while the budget has room.

        Trials other workers are running count against the budget; while they run, this worker
        waits rather than exits, so it can retry one whose worker dies.
        """
        assert self.study is not None
        while True:
            with self._lock():
                self._reconcile()
                trials = self.study.get_trials(deepcopy=False)
                used = sum(1 for t in trials if store.is_counted(t))
                running = sum(1 for t in trials if t.state == TrialState.RUNNING)
                if used >= self.budget:
                    return None
                if used + running < self.budget:
                    return self.study.ask()
            time.sleep(store.HEARTBEAT_S)

    def _run_trial(self, trial: Trial) -> None:
        assert self.study is not None
        with Heartbeat(self.storage, trial._trial_id, store.HEARTBEAT_S):
            try:
                value = self._objective(trial)
            except optuna.TrialPruned:
                self.study.tell(trial, state=TrialState.PRUNED)
            except TrialFailed:
                self.study.tell(trial, state=TrialState.FAIL)
            except BaseException:  # interrupts and tuner bugs: the trial is not a result; resume retries it
                self.study.tell(trial, state=TrialState.FAIL)
                raise
            else:
                self.study.tell(trial, value)

    def _reconcile(self) -> None:
        """Retry trials cut short by an interrupt or a dead worker; close their MLflow runs."""
        assert self.study is not None and self.tracker is not None
        optuna.storages.fail_stale_trials(self.study)
        trials = self.study.get_trials(deepcopy=False)
        retried = {t.user_attrs.get(store.RETRY_OF) for t in trials}
        cut_short = [t for t in trials if t.state == TrialState.FAIL and not store.is_counted(t) and t.params]
        for t in cut_short:
            attempts = sum(1 for other in cut_short if other.params == t.params)
            # A configuration that keeps killing its worker (not just its engine) is not retried forever.
            if t.number not in retried and attempts < MAX_ATTEMPTS:
                self.study.enqueue_trial(t.params, user_attrs={store.RETRY_OF: t.number})
        for t in trials:
            run_id = t.user_attrs.get(store.MLFLOW_RUN)
            if not run_id or t.state == TrialState.RUNNING or t.number in self._mlflow_closed:
                continue
            if self.tracker.status(run_id) == "RUNNING":
                self.tracker.end_trial(run_id, "KILLED" if t.state == TrialState.FAIL else "FINISHED")
            self._mlflow_closed.add(t.number)

    def _enqueue_baselines(self) -> None:
        assert self.study is not None
        for eager in self.config.search.enforce_eager:
            self.study.enqueue_trial(baseline_params(self.config, eager), skip_if_exists=True)
        for params in first_trial_params(self.config):
            self.study.enqueue_trial(params, skip_if_exists=True)

    # -- one trial ------------------------------------------------------------------------------
    def _objective(self, trial: Trial) -> float | list[float]:
        assert self.study is not None and self.tracker is not None and self.view is not None
        assert self.preflight is not None
        spec = suggest(trial, self.config, self.preflight.allowed)
        trial.set_user_attr(store.SPEC, spec.model_dump(mode="json"))
        duplicate = self._find_duplicate(spec, trial.number)
        if duplicate is not None:
            return self._reuse(trial, spec, duplicate)

        self.view.trial_started(trial.number, spec.label())
        run_id = self.tracker.start_trial(
            self.parent_run,
            self.config.name,
            trial.number,
            spec.label(),
            {
                "method": spec.method,
                "candidate": spec.candidate,
                "is_baseline": str(spec.is_baseline).lower(),
                **self._hardware_tags(),
            },
        )
        trial.set_user_attr(store.MLFLOW_RUN, run_id)
        trial.set_user_attr(store.HARDWARE, self.hardware.model_dump())
        kwargs = llm_kwargs(self.config.target, self.preflight.target_path, spec)
        trial.set_user_attr(store.LLM_KWARGS, redact(kwargs))
        self.tracker.log_params(run_id, spec.mlflow_params())
        self.tracker.log_dict(run_id, kwargs, "vllm_args.json")
        try:
            outcome = self._measure(trial, spec, kwargs)
            return self._record(trial, spec, run_id, outcome)
        except KeyboardInterrupt:
            trial.set_user_attr(store.FAILURE, "interrupted")
            self.tracker.set_tags(run_id, {"failure_class": "interrupted"})
            self.tracker.end_trial(run_id, "KILLED")
            raise

    def _hardware_tags(self) -> dict[str, str]:
        hw = self.hardware
        return {
            "host": hw.host,
            "worker": f"{hw.host}:{os.getpid()}",
            "accelerator": hw.accelerator,
            "gpu": hw.gpu_name,
            "driver": hw.driver,
        }

    def _measure(self, trial: Trial, spec: TrialSpec, kwargs: dict[str, Any]) -> RunOutcome:
        request = TrialRequest.for_study(self.config, self.prompts, kwargs)
        hook = _PruneHook(trial, spec, self.config, self.view, report=not self.multi_objective)
        return run_engine(request, self.workdir / f"trial-{trial.number:03d}", self.config.budget.trial_timeout_s, hook)

    def _record(self, trial: Trial, spec: TrialSpec, run_id: str, outcome: RunOutcome) -> float | list[float]:
        assert self.tracker is not None and self.view is not None and self.study is not None
        tracker = self.tracker
        # From the engine process's launch until its whole group is gone: spawn, start, warm-up,
        # measurement and shutdown. Study time outside these windows is the tuner's own overhead.
        trial.set_user_attr(store.ENGINE_WALL, outcome.wall_s)
        tracker.log_metrics(run_id, {"engine_wall_s": outcome.wall_s})
        if outcome.pruned_reason:
            saved = _pruning_saved_s(outcome, self.config)
            trial.set_user_attr(store.PRUNED_REASON, outcome.pruned_reason)
            trial.set_user_attr("pruning_saved_s", saved)
            partial = [e.measurement for e in outcome.events if e.measurement is not None]
            tracker.log_metrics(run_id, {"pruning_saved_s": saved})
            tracker.log_stepped(run_id, "tokens_per_s_partial", [m.tokens_per_s for m in partial])
            tracker.set_tags(run_id, {"state": "PRUNED", "pruned_reason": outcome.pruned_reason})
            tracker.log_text(run_id, log_tail(outcome.log_path), "engine_log_tail.txt")
            tracker.end_trial(run_id, "FINISHED")
            self.view.trial_finished(trial.number, f"pruned ({outcome.pruned_reason})", None)
            raise optuna.TrialPruned(outcome.pruned_reason)
        if outcome.result is None:
            trial.set_user_attr(store.FAILURE, outcome.failure)
            trial.set_user_attr(store.ERROR, outcome.message[:2000])
            tracker.set_tags(run_id, {"state": "FAIL", "failure_class": outcome.failure, "error": outcome.message})
            tracker.log_text(run_id, log_tail(outcome.log_path), "engine_log_tail.txt")
            tracker.end_trial(run_id, "FAILED")
            self.view.trial_finished(trial.number, f"failed: {outcome.failure}: {outcome.message[:120]}", None)
            raise TrialFailed(f"{outcome.failure}: {outcome.message}")

        result = outcome.result
        baseline = store.best_baseline(self.study)
        base_metrics = store.trial_metrics(baseline) if baseline else None
        tokens = store.baseline_tokens(baseline)
        if spec.is_baseline:
            metrics = score_result(result, self.config, None, tokens)
            if base_metrics is not None and base_metrics.score > metrics.score:
                metrics = score_result(result, self.config, base_metrics, tokens)
            else:  # this trial is the reference now
                metrics.speedup = 1.0
                for level in metrics.levels:
                    level.speedup = 1.0
            trial.set_user_attr(store.TOKENS, json.dumps({str(k): v for k, v in result.token_ids.items()}))
        else:
            metrics = score_result(result, self.config, base_metrics, tokens)
        trial.set_user_attr(store.METRICS, metrics.model_dump(mode="json"))
        trial.set_user_attr(
            store.ENGINE, {"vllm": result.vllm_version, "torch": result.torch_version, "device": result.device}
        )
        tracker.log_metrics(run_id, metrics.flat())
        tracker.log_stepped(run_id, "accepted_per_pos_rate", metrics.spec.per_position_rate)
        log_acceptance_plot(tracker, run_id, metrics, f"trial {trial.number}: {spec.label()}")
        for level in metrics.levels:
            tracker.log_stepped(run_id, f"tokens_per_s_repeats_bs{level.batch_size}", level.repeats)
        tracker.set_tags(run_id, {"state": "COMPLETE", "vllm_version": result.vllm_version, "device": result.device})
        self._flag_lossless(run_id, spec, metrics, result.device)
        tracker.end_trial(run_id, "FINISHED")
        best = self._best_label(metrics.score, spec)
        self.view.trial_finished(trial.number, f"{metrics.tokens_per_s:.1f} tok/s{_fmt_speedup(metrics.speedup)}", best)
        if self.multi_objective:
            return [level.score for level in metrics.levels]
        return metrics.score

    def _flag_lossless(self, run_id: str, spec: TrialSpec, metrics: TrialMetrics, device: str) -> None:
        if spec.is_baseline or self.config.workload.temperature != 0.0:
            return
        rates = [lv.lossless_match_rate for lv in metrics.levels if lv.lossless_match_rate is not None]
        if not rates:
            return
        worst = min(rates)
        assert self.tracker is not None and self.view is not None
        self.tracker.set_tags(run_id, {"lossless": "exact" if worst == 1.0 else f"{worst:.0%} of prompts match"})
        strict = device.startswith("cpu") and self.config.target.dtype in ("float32", "float")
        if worst < 1.0 and strict:
            self.tracker.set_tags(run_id, {"lossless_defect": "true"})
            self.view.note(
                f"WARNING: trial output differs from the baseline on {1 - worst:.0%} of prompts at temperature 0 "
                "(float32 on CPU should match exactly)"
            )

    def _best_label(self, score: float, spec: TrialSpec) -> str | None:
        assert self.study is not None
        best = store.best_trial(self.study)
        best_metrics = store.trial_metrics(best) if best else None
        best_score = best_metrics.score if best_metrics else float("-inf")
        if score >= best_score:
            return f"{spec.label()} ({score:.1f})"
        if best is not None:
            bspec = store.trial_spec(best)
            return f"{bspec.label() if bspec else best.number} ({best_score:.1f})"
        return None

    def _find_duplicate(self, spec: TrialSpec, number: int) -> FrozenTrial | None:
        """A finished trial of the same configuration; if another worker is measuring it right now,
        wait for that result rather than measure it twice."""
        assert self.study is not None
        deadline = time.monotonic() + self.config.budget.trial_timeout_s + 60
        while True:
            running = False
            for t in self.study.get_trials(deepcopy=False):
                other = store.trial_spec(t)
                if t.number == number or other is None or other.key() != spec.key():
                    continue
                if store.is_counted(t) and (t.state != TrialState.COMPLETE or store.METRICS in t.user_attrs):
                    return t
                running = running or t.state == TrialState.RUNNING
            if not running or time.monotonic() > deadline:
                return None
            if self.view is not None:
                self.view.note(f"trial {number}: same configuration is being measured by another worker; waiting")
            time.sleep(store.HEARTBEAT_S)

    def _reuse(self, trial: Trial, spec: TrialSpec, source: FrozenTrial) -> float | list[float]:
        """The sampler proposed a configuration already measured: reuse its outcome, spend no engine time."""
        assert self.tracker is not None and self.view is not None
        trial.set_user_attr(store.DUPLICATE_OF, source.number)
        trial.set_user_attr(store.HARDWARE, self.hardware.model_dump())
        for key in (store.METRICS, store.FAILURE, store.ERROR, store.PRUNED_REASON, store.ENGINE, store.LLM_KWARGS):
            if key in source.user_attrs:
                trial.set_user_attr(key, source.user_attrs[key])
        run_id = self.tracker.start_trial(
            self.parent_run,
            self.config.name,
            trial.number,
            spec.label() + f" (repeat of trial {source.number})",
            {
                "method": spec.method,
                "candidate": spec.candidate,
                "duplicate_of": str(source.number),
                **self._hardware_tags(),
            },
        )
        trial.set_user_attr(store.MLFLOW_RUN, run_id)
        self.tracker.log_params(run_id, spec.mlflow_params())
        self.tracker.end_trial(run_id, "FINISHED" if source.state == TrialState.COMPLETE else "FAILED")
        self.view.trial_finished(trial.number, f"same configuration as trial {source.number}; reused its result", None)
        if source.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"same configuration as trial {source.number}, which was pruned")
        if source.state == TrialState.FAIL:
            raise TrialFailed(f"same configuration as trial {source.number}, which failed")
        assert source.values is not None
        return list(source.values) if self.multi_objective else float(source.values[0])

    def finish(self) -> None:
        """Close the study's MLflow parent run with its summary (after workers ran the trials)."""
        self._summarise_parent("FINISHED")

    def _summarise_parent(self, status: str) -> None:
        assert self.study is not None and self.tracker is not None
        best = store.best_trial(self.study)
        base = store.best_baseline(self.study)
        summary: dict[str, float] = {"trials_counted": store.budget_used(self.study)}
        if best is not None and (m := store.trial_metrics(best)) is not None:
            summary["best_tokens_per_s"] = m.tokens_per_s
            summary["best_score"] = m.score
            if base is not None and (bm := store.trial_metrics(base)) is not None and bm.tokens_per_s:
                summary["baseline_tokens_per_s"] = bm.tokens_per_s
                summary["best_speedup"] = m.tokens_per_s / bm.tokens_per_s
            self.tracker.set_tags(self.parent_run, {"best_trial": best.number})
        saved = sum(t.user_attrs.get("pruning_saved_s", 0.0) for t in self.study.get_trials(deepcopy=False))
        summary["pruning_saved_s"] = saved
        self.tracker.log_metrics(self.parent_run, summary)
        self.tracker.close_parent(self.parent_run, status)


class _PruneHook:
    """Reports each measured repeat to Optuna and stops hopeless trials early."""

    def __init__(
        self, trial: Trial, spec: TrialSpec, config: StudyConfig, view: ProgressView | None, report: bool = True
    ) -> None:
        self.report = report  # Optuna's intermediate values exist for single-objective studies only
        self.trial = trial
        self.spec = spec
        self.config = config
        self.view = view
        self.step = 0

    def __call__(self, event: ProgressEvent) -> str | None:
        if event.event == "engine_ready":
            if self.view:
                self.view.note(f"trial {self.trial.number}: engine ready after {event.elapsed_s:.0f} s")
            return None
        m = event.measurement
        if m is None:
            return None
        step = self.step
        self.step += 1
        if self.view:
            rate = m.spec.acceptance_rate
            acc = f", {rate:.0%} accepted" if rate is not None else ""
            self.view.note(
                f"trial {self.trial.number}: batch {m.batch_size} repeat {m.repeat + 1}: {m.tokens_per_s:.1f} tok/s{acc}"
            )
        if self.spec.is_baseline or not self.config.pruning.enabled:
            return None
        rate = m.spec.acceptance_rate
        if rate is not None and rate < self.config.pruning.min_acceptance_rate:
            return f"acceptance {rate:.1%} below pruning.min_acceptance_rate"
        if not self.report:
            return None
        self.trial.report(m.tokens_per_s, step)
        if self.trial.should_prune():
            return f"throughput {m.tokens_per_s:.1f} tok/s at step {step} in the study's bottom {self.config.pruning.percentile:.0f}%"
        return None


def _pruning_saved_s(outcome: RunOutcome, config: StudyConfig) -> float:
    """Engine time not spent: the repeats left, at the pace of the ones measured."""
    measured = [e.measurement for e in outcome.events if e.measurement is not None]
    if not measured:
        return 0.0
    total = len(config.workload.batch_sizes) * config.workload.repeats
    per_repeat = sum(m.elapsed_s for m in measured) / len(measured)
    return per_repeat * (total - len(measured))


def _fmt_speedup(value: float | None) -> str:
    return f", {value:.2f}x vs no speculation" if value is not None else ""


def _study_params(config: StudyConfig) -> dict[str, Any]:
    w = config.workload
    return {
        "target_model": config.target.model,
        "dtype": config.target.dtype,
        "max_model_len": config.target.max_model_len,
        "candidates": ",".join(c.name for c in config.candidates),
        "enforce_eager_choices": ",".join(str(x) for x in config.search.enforce_eager),
        "prompts": w.prompts.name,
        "max_tokens": w.max_tokens,
        "temperature": w.temperature,
        "batch_sizes": ",".join(str(b) for b in w.batch_sizes),
        "repeats": w.repeats,
        "sampler": config.search.sampler,
        "pruning": config.pruning.enabled,
    }


def _safe_url(url: str) -> str:
    """Storage URL without its password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def open_tracker(uri: str, experiment: str) -> Tracker:
    try:
        return Tracker(uri, experiment)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"tracking.uri: cannot open MLflow at '{uri}' ({first[:200]}); fix: check --tracking-uri or tracking.uri"
        ) from None


def prepare_only(study_path: Path, options: OptimizeOptions) -> StudyRunner:
    """Create (or load) the study, its MLflow parent run and its baseline, measuring nothing:
    what ``optimize --workers`` does before its workers join."""
    from tuner.study_loader import load_study

    runner = StudyRunner(load_study(study_path), study_path.read_text(), options)
    runner.prepare()
    assert runner.study is not None
    with runner._lock():
        runner._reconcile()
        runner._enqueue_baselines()
    return runner


def optimize(study_path: Path, options: OptimizeOptions) -> StudyRunner:
    from tuner.study_loader import load_study

    config = load_study(study_path)
    runner = StudyRunner(config, study_path.read_text(), options)
    started = time.monotonic()
    runner.prepare()
    runner.run()
    if runner.study is not None:
        runner.study.set_user_attr("last_run_wall_s", time.monotonic() - started)
    return runner
