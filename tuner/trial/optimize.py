"""``tuner optimize``: run (or resume) an Optuna study whose trials are real vLLM engines.

This module sets the study up and runs its loop (budget, locking, retries, the MLflow parent run);
one trial's execution and record are in tuner.trial.execute.
"""

from __future__ import annotations

import hashlib
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tuner.engine.hardware import Hardware, gpus_per_engine
from tuner.engine.hardware import describe as describe_hardware
from tuner.engine.preflight import REJECTED_ATTR, Preflight
from tuner.engine.preflight_cache import CACHE_FILE, cached_preflight
from tuner.errors import UserError
from tuner.redaction import mask_url, redact
from tuner.results import store
from tuner.results.tracking import Tracker
from tuner.study.config import StudyConfig
from tuner.study.prompts import load_prompts
from tuner.study.space import baseline_params, first_trial_params, grid
from tuner.trial.coordination import Heartbeat, study_lock
from tuner.trial.deadline import Deadline, confirmation_s
from tuner.trial.execute import TrialExecutor
from tuner.trial.interrupts import sigterm_interrupts
from tuner.trial.prepared import PreparedStudy, TrialFailed
from tuner.trial.progress import ProgressView
from tuner.trial.rescored_sampler import RescoredSampler

__all__ = ["MAX_ATTEMPTS", "OptimizeOptions", "StudyRunner", "TrialFailed", "optimize", "prepare_only"]

MAX_ATTEMPTS = 3
# Repeats (reused results) before a study that still has budget stops: its sampler keeps to the measured.
MIN_REPEATS_TO_STOP = 20


@dataclass
class OptimizeOptions:
    n_trials: int | None = None
    storage: str | None = None
    tracking_uri: str | None = None
    workdir: Path | None = None
    show_progress: bool = True
    timeout_s: float | None = None  # --timeout: counted from `started`, the command's start
    started: float = field(default_factory=time.monotonic)


class NotPrepared(RuntimeError):
    """A StudyRunner used before prepare()."""


class StudyRunner:
    def __init__(self, config: StudyConfig, study_text: str, options: OptimizeOptions) -> None:
        self.config = config
        self.study_text = study_text
        self.budget = options.n_trials or config.budget.trials
        self._space_keys: set[tuple[Any, ...]] | None = None
        self._stop_noted = False
        self.storage_url = options.storage or config.storage
        self.tracking_uri = options.tracking_uri or config.tracking.uri
        self.workdir = ((options.workdir or Path("tuner-runs")) / config.name).resolve()
        self.show_progress = options.show_progress
        self.deadline = Deadline(options.timeout_s, options.started)
        self.study: optuna.Study | None = None  # set by prepare(); what the CLI's end-of-study steps read
        self.tracker: Tracker | None = None
        self.parent_run: str = ""
        self.hardware = Hardware(host="", accelerator="")
        self.storage: Any = None
        self.prepared: PreparedStudy | None = None
        self._mlflow_closed: set[int] = set()  # trials whose MLflow run is known to be closed

    # -- set-up ---------------------------------------------------------------------------------
    def prepare(self) -> PreparedStudy:
        """Everything that can refuse bad input runs before anything is written."""
        store.check_url(self.storage_url)
        prompts = load_prompts(self.config.workload.prompts)
        if self.config.workload.max_prompts:
            prompts = prompts[: self.config.workload.max_prompts]
        preflight, reused = cached_preflight(self.config, self.workdir)
        if reused:
            print(
                f"pre-flight: reused {self.workdir / CACHE_FILE} (same study settings, vLLM and model files)",
                file=sys.stderr,
            )
        for name, reason in preflight.rejected.items():
            print(f"warning: candidate '{name}' removed from the search space: {reason}", file=sys.stderr)
        if preflight.schedule_skipped:
            print(f"note: no batch-size schedule: {preflight.schedule_skipped}", file=sys.stderr)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = storage = store.open_storage(self.storage_url)
        self.hardware = describe_hardware()
        with study_lock(storage, self.config.name):  # several workers may start at once
            self.tracker = tracker = open_tracker(self.tracking_uri, self.config.experiment_name)
            self.study = study = self._create_study(storage)
            self._check_hardware()
            self.parent_run = self._open_parent(study, tracker, preflight)
        self.prepared = PreparedStudy(
            self.config, study, tracker, preflight, self.parent_run, self.hardware, prompts, self.workdir
        )
        return self.prepared

    def ready(self) -> PreparedStudy:
        if self.prepared is None:
            raise NotPrepared("StudyRunner.prepare() must run first")
        return self.prepared

    def _check_hardware(self) -> None:
        """Throughput from different hardware is not comparable: one study, one hardware class."""
        if self.study is None:
            raise NotPrepared("the study is not open")
        mine = self.hardware.engine_class(gpus_per_engine(self.config.target.engine_args))
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
        study = optuna.create_study(
            study_name=cfg.name,
            storage=storage,
            sampler=RescoredSampler(sampler),
            # The engine's progress hook prunes (tuner.trial.pruning.PruneHook), not Optuna's should_prune().
            pruner=optuna.pruners.NopPruner(),
            direction="maximize",
            load_if_exists=True,
        )
        settings = cfg.fingerprinted_settings()
        legacy = store.fingerprint(settings)  # studies made before scores were per-level speedups
        # The prompts' content, not their path: workers on other hosts have other checkout paths.
        settings["workload"]["prompts"] = hashlib.sha256(cfg.workload.prompts.read_bytes()).hexdigest()
        settings["score_version"] = store.SCORE_VERSION
        mark = store.fingerprint(settings)
        existing = study.user_attrs.get(store.FINGERPRINT)
        if existing is None:
            study.set_user_attr(store.FINGERPRINT, mark)
        elif existing == legacy:
            # Its Optuna values are raw tokens/s; new trials' are speedups: the sampler would compare apples and pears.
            raise UserError(
                f"name: study '{cfg.name}' in {mask_url(self.storage_url)} was scored by an older tuner (raw tokens/s, "
                "not per-level speedups), so new trials cannot join it; fix: give the study a new name "
                "(report and export still read the old one)"
            )
        elif existing != mark:
            raise UserError(
                f"name: study '{cfg.name}' already exists in {mask_url(self.storage_url)} with other settings "
                "(target, candidates, search or workload changed); fix: give the study a new name or use another storage"
            )
        # The file last run: its confirm and schedule settings are the ones export and report decide by.
        if study.user_attrs.get(store.STUDY_FILE) != (text := redact(self.study_text)):
            study.set_user_attr(store.STUDY_FILE, text)
        return study

    def _open_parent(self, study: optuna.Study, tracker: Tracker, preflight: Preflight) -> str:
        previous = study.user_attrs.get(store.PARENT_RUN)
        parent_run = tracker.open_parent(previous, self.config.name, {"optuna.storage": mask_url(self.storage_url)})
        if previous != parent_run:
            study.set_user_attr(store.PARENT_RUN, parent_run)
            tracker.log_text(parent_run, self.study_text, "study.yaml")
            tracker.log_params(parent_run, _study_params(self.config))
        study.set_user_attr(REJECTED_ATTR, redact(preflight.rejected))
        if preflight.rejected:
            tracker.log_dict(parent_run, preflight.rejected, "preflight_rejected.json")
            tracker.set_tags(parent_run, {"preflight.rejected": ", ".join(preflight.rejected)})
        return parent_run

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        ps = self.ready()
        with self._lock():
            self._reconcile(ps)
            self._enqueue_baselines(ps)
        view = ProgressView(
            self.config.name,
            self.budget,
            store.budget_used(ps.study),
            self.show_progress,
            after_trials=lambda: confirmation_s(ps.study.get_trials(deepcopy=False), self.config),
        )
        executor = TrialExecutor(ps, view)
        if (held := executor.best_so_far()) is not None:
            view.best = held[0]  # resumed: the best so far, not "-" until the next trial ends
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        status = "KILLED"
        try:
            with sigterm_interrupts():
                while (trial := self._next_trial(ps)) is not None:
                    self._run_trial(ps, executor, trial)
            status = "FINISHED"
        finally:
            view.close()
            self._summarise_parent(ps, status)

    def _lock(self) -> AbstractContextManager[None]:
        return study_lock(self.storage, self.config.name)

    def _next_trial(self, ps: PreparedStudy) -> Trial | None:
        """Atomically across workers: ask for a trial only while the budget has room.

        Trials other workers are running count against the budget; while they run, this worker
        waits rather than exits, so it can retry one whose worker dies. With ``--timeout``, no trial
        starts that is expected to overrun it (tuner.trial.deadline).
        """
        while True:
            with self._lock():
                self._reconcile(ps)
                self._retry_baselines(ps)
                trials = ps.study.get_trials(deepcopy=False)
                used = sum(1 for t in trials if store.spends_budget(t))
                running = sum(1 for t in trials if t.state == TrialState.RUNNING)
                if used >= self.budget or self._nothing_new(ps, trials):
                    return None
                if used + running < self.budget:
                    return ps.study.ask() if self.deadline.allows(trials, "a trial") else None
            if self.deadline.expired():
                return None
            time.sleep(store.HEARTBEAT_S)

    def _nothing_new(self, ps: PreparedStudy, trials: list[FrozenTrial]) -> bool:
        """Repeats spend no budget, so the loop ends on its own when every configuration of the space is
        measured, or when the sampler has proposed measured ones many times (it has settled)."""
        measured = {s.key() for t in trials if store.spends_budget(t) and (s := store.trial_spec(t))}
        repeats = sum(1 for t in trials if store.is_counted(t) and store.is_repeat(t))
        if self._space_keys is None:
            self._space_keys = {s.key() for s in grid(ps.config, ps.preflight.allowed)}
        if self._space_keys <= measured:
            reason = f"every configuration of the space ({len(self._space_keys)}) is measured"
        elif repeats >= max(MIN_REPEATS_TO_STOP, 2 * self.budget):
            reason = f"the sampler proposed measured configurations {repeats} times"
        else:
            return False
        if not self._stop_noted:
            print(f"note: stopping before the budget: {reason}", file=sys.stderr)
            self._stop_noted = True
        return True

    def _run_trial(self, ps: PreparedStudy, executor: TrialExecutor, trial: Trial) -> None:
        with Heartbeat(self.storage, trial._trial_id, store.HEARTBEAT_S):
            try:
                value = executor.objective(trial)
            except optuna.TrialPruned:
                ps.study.tell(trial, state=TrialState.PRUNED)
            except TrialFailed:
                ps.study.tell(trial, state=TrialState.FAIL)
            except BaseException:  # interrupts and tuner bugs: the trial is not a result; resume retries it
                ps.study.tell(trial, state=TrialState.FAIL)
                raise
            else:
                ps.study.tell(trial, value)

    def _reconcile(self, ps: PreparedStudy) -> None:
        """Retry trials cut short by an interrupt or a dead worker; close their MLflow runs."""
        optuna.storages.fail_stale_trials(ps.study)
        trials = ps.study.get_trials(deepcopy=False)
        retried = {store.record_value(t, "retry_of") for t in trials}
        cut_short = [t for t in trials if t.state == TrialState.FAIL and not store.is_counted(t) and t.params]
        for t in cut_short:
            attempts = sum(1 for other in cut_short if other.params == t.params)
            # A configuration that keeps killing its worker (not just its engine) is not retried forever.
            if t.number not in retried and attempts < MAX_ATTEMPTS:
                ps.study.enqueue_trial(t.params, user_attrs={store.RETRY_OF: t.number})
        for t in trials:
            run_id = store.record_value(t, "mlflow_run_id")
            if not run_id or t.state == TrialState.RUNNING or t.number in self._mlflow_closed:
                continue
            if ps.tracker.status(run_id) == "RUNNING":
                ps.tracker.end_trial(run_id, "KILLED" if t.state == TrialState.FAIL else "FINISHED")
            self._mlflow_closed.add(t.number)

    def _retry_baselines(self, ps: PreparedStudy) -> None:
        """A baseline that failed (a compiled engine's cold start past trial_timeout_s, an OOM) is measured
        again, up to MAX_ATTEMPTS per mode: without it no speculative trial of that mode has a speedup."""
        trials = ps.study.get_trials(deepcopy=False)
        for eager in self.config.search.enforce_eager:
            params = baseline_params(self.config, eager)
            mine = [t for t in trials if t.params == params or t.system_attrs.get("fixed_params") == params]
            if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in mine):
                continue
            if any(t.state == TrialState.COMPLETE and store.has_metrics(t) for t in mine):
                continue
            failed = [t for t in mine if t.state == TrialState.FAIL and store.is_counted(t)]
            if failed and len(failed) < MAX_ATTEMPTS:
                ps.study.enqueue_trial(params, skip_if_exists=False)

    def _enqueue_baselines(self, ps: PreparedStudy) -> None:
        for eager in self.config.search.enforce_eager:
            ps.study.enqueue_trial(baseline_params(self.config, eager), skip_if_exists=True)
        self._retry_baselines(ps)
        for params in first_trial_params(self.config):
            ps.study.enqueue_trial(params, skip_if_exists=True)

    def finish(self) -> None:
        """Close the study's MLflow parent run with its summary (after workers ran the trials)."""
        self._summarise_parent(self.ready(), "FINISHED")

    def _summarise_parent(self, ps: PreparedStudy, status: str) -> None:
        best = store.best_trial(ps.study)
        base = store.best_baseline(ps.study)
        # The trials' best by score, before any confirmation: the study's answer is logged by conclude
        # (answer_speedup), so these keys must not read as what is served.
        summary: dict[str, float] = {"trials_counted": store.budget_used(ps.study)}
        if best is not None and (m := store.scored_metrics(ps.study, best)) is not None:
            summary["trials_best_tokens_per_s"] = m.tokens_per_s
            summary["trials_best_score"] = m.score
            if base is not None and (bm := store.trial_metrics(base)) is not None:
                summary["baseline_tokens_per_s"] = bm.tokens_per_s
            if m.speedup is not None:
                summary["trials_best_speedup"] = m.speedup
        trials = ps.study.get_trials(deepcopy=False)
        summary["pruning_saved_s"] = sum(store.record_value(t, "pruning_saved_s") or 0.0 for t in trials)
        ps.tracker.log_metrics(ps.parent_run, summary)
        # The run's status says how this command ended; the tag says whether the study is done.
        if self.deadline.stopped:
            state = "unfinished: stopped by --timeout; run the same command again to resume"
        elif status == "FINISHED":
            state = "trials done"
        else:
            state = "unfinished: interrupted; run the same command again to resume"
        ps.tracker.set_tags(ps.parent_run, {"study.state": state})
        ps.tracker.close_parent(ps.parent_run, status)


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
        "schedule": config.schedule.enabled,
    }


def open_tracker(uri: str, experiment: str) -> Tracker:
    try:
        return Tracker(uri, experiment)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(
            f"tracking.uri: cannot open MLflow at '{mask_url(uri)}' ({mask_url(first[:200])}); "
            "fix: check --tracking-uri or tracking.uri"
        ) from None


def prepare_only(study_path: Path, options: OptimizeOptions) -> StudyRunner:
    """Create (or load) the study, its MLflow parent run and its baseline, measuring nothing:
    what ``optimize --workers`` does before its workers join."""
    from tuner.study.loader import load_study

    runner = StudyRunner(load_study(study_path), study_path.read_text(), options)
    ps = runner.prepare()
    with runner._lock():
        runner._reconcile(ps)
        runner._enqueue_baselines(ps)
    return runner


def optimize(study_path: Path, options: OptimizeOptions) -> StudyRunner:
    from tuner.study.loader import load_study

    config = load_study(study_path)
    runner = StudyRunner(config, study_path.read_text(), options)
    started = time.monotonic()
    ps = runner.prepare()
    runner.run()
    ps.study.set_user_attr("last_run_wall_s", time.monotonic() - started)
    return runner
