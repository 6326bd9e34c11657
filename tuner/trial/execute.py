"""One trial: suggest a configuration, run its engine, score and record the outcome (Optuna, MLflow)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import Trial

from tuner.engine.process import RunOutcome, log_tail, run_engine
from tuner.engine.request import TrialRequest
from tuner.engine.runner_log import workdir_runner
from tuner.redaction import redact
from tuner.results import record, store
from tuner.results.record import RETRY_OF, TrialRecord
from tuner.results.scoring import TrialMetrics, apply_reference, reference_levels, score_result
from tuner.study.space import suggest
from tuner.study.spec import TrialSpec, llm_kwargs
from tuner.trial.acceptance_plot import log_acceptance_plot
from tuner.trial.dedup import find_duplicate, reuse
from tuner.trial.prepared import PreparedStudy, TrialFailed
from tuner.trial.progress import ProgressView
from tuner.trial.pruning import PruneHook, pruning_saved_s


class TrialExecutor:
    def __init__(self, ps: PreparedStudy, view: ProgressView) -> None:
        self.ps = ps
        self.view = view

    def objective(self, trial: Trial) -> float:
        ps = self.ps
        spec = suggest(trial, ps.config, ps.preflight.allowed)
        rec = TrialRecord(spec=spec, retry_of=trial.user_attrs.get(RETRY_OF))
        record.write(trial, rec)  # other workers look for this configuration while it runs
        duplicate = find_duplicate(ps, self.view, spec, trial.number)
        if duplicate is not None:
            return reuse(ps, self.view, trial, spec, rec, duplicate)

        self.view.trial_started(trial.number, spec.label())
        run_id = ps.tracker.start_trial(
            ps.parent_run,
            ps.config.name,
            trial.number,
            spec.label(),
            {
                "method": spec.method,
                "candidate": spec.candidate,
                "is_baseline": str(spec.is_baseline).lower(),
                "workload_mode": ps.config.workload.mode,
                **ps.hardware_tags(),
            },
        )
        rec.mlflow_run_id = run_id
        rec.hardware = ps.hardware.model_dump()
        record.write(trial, rec)
        kwargs = llm_kwargs(ps.config.target, ps.preflight.target_path, spec)
        rec.llm_kwargs = redact(kwargs)
        rec.env = dict(ps.config.target.env) or None
        record.write(trial, rec)
        ps.tracker.log_params(run_id, spec.mlflow_params())
        ps.tracker.log_dict(run_id, kwargs, "vllm_args.json")
        try:
            outcome = self._measure(trial, spec, kwargs)
            return self._record(trial, spec, rec, run_id, outcome)
        except KeyboardInterrupt:
            rec.failure_class = "interrupted"
            record.write(trial, rec)
            ps.tracker.set_tags(run_id, {"failure_class": "interrupted"})
            ps.tracker.end_trial(run_id, "KILLED")
            raise

    def _measure(self, trial: Trial, spec: TrialSpec, kwargs: dict[str, Any]) -> RunOutcome:
        ps = self.ps
        request = TrialRequest.for_study(ps.config, ps.prompts, kwargs)
        hook = PruneHook(trial, spec, ps.config, self.view)
        return run_engine(request, ps.workdir / f"trial-{trial.number:03d}", ps.config.budget.trial_timeout_s, hook)

    def _record(self, trial: Trial, spec: TrialSpec, rec: TrialRecord, run_id: str, outcome: RunOutcome) -> float:
        ps, tracker = self.ps, self.ps.tracker
        # From the engine process's launch until its whole group is gone: spawn, start, warm-up,
        # measurement and shutdown. Study time outside these windows is the tuner's own overhead.
        rec.engine_wall_s = outcome.wall_s
        tracker.log_metrics(run_id, {"engine_wall_s": outcome.wall_s})
        # model_runner, cudagraph_mode: what the engine's log says it ran with (tuner.engine.runner_log)
        if outcome.result is not None:
            runner = dict(outcome.result.runner)
        else:
            runner = workdir_runner(outcome.log_path.parent) if outcome.log_path else {}
            rec.engine = runner or None
        if outcome.pruned_reason:
            baseline = store.best_baseline(ps.study)
            saved = pruning_saved_s(outcome, ps.config, store.trial_metrics(baseline) if baseline else None)
            rec.pruned_reason = outcome.pruned_reason
            rec.pruning_saved_s = saved
            record.write(trial, rec)
            partial = [e.measurement for e in outcome.events if e.measurement is not None]
            tracker.log_metrics(run_id, {"pruning_saved_s": saved})
            tracker.log_stepped(run_id, "tokens_per_s_partial", [m.tokens_per_s for m in partial])
            tracker.set_tags(run_id, {"state": "PRUNED", "pruned_reason": outcome.pruned_reason, **runner})
            tracker.log_text(run_id, log_tail(outcome.log_path), "engine_log_tail.txt")
            tracker.end_trial(run_id, "FINISHED")
            self.view.trial_finished(trial.number, f"pruned ({outcome.pruned_reason})", None)
            raise optuna.TrialPruned(outcome.pruned_reason)
        if outcome.result is None:
            rec.failure_class = outcome.failure
            rec.error = outcome.message[:2000]
            record.write(trial, rec)
            tracker.set_tags(
                run_id, {"state": "FAIL", "failure_class": outcome.failure, "error": outcome.message, **runner}
            )
            tracker.log_text(run_id, log_tail(outcome.log_path), "engine_log_tail.txt")
            tracker.end_trial(run_id, "FAILED")
            self.view.trial_finished(trial.number, f"failed: {outcome.failure}: {outcome.message[:120]}", None)
            raise TrialFailed(f"{outcome.failure}: {outcome.message}")

        result = outcome.result
        baseline = store.best_baseline(ps.study)
        tokens = store.baseline_tokens(baseline)
        metrics = score_result(result, ps.config, baseline_tokens=tokens)
        # Every level's speedup is against the best baseline at that level, this trial included when it is one.
        references = [m for t in store.baselines(ps.study) if (m := store.trial_metrics(t)) is not None]
        if spec.is_baseline:
            references.append(metrics)
            rec.token_ids = dict(result.token_ids)
        metrics = apply_reference(metrics, reference_levels(references))
        rec.metrics = metrics
        rec.engine = {"vllm": result.vllm_version, "torch": result.torch_version, "device": result.device, **runner}
        rec.resolved_args = dict(result.resolved_args) or None
        record.write(trial, rec)
        tracker.log_metrics(run_id, metrics.flat())
        tracker.log_stepped(run_id, "accepted_per_pos_rate", metrics.spec.per_position_rate)
        log_acceptance_plot(tracker, run_id, metrics, f"trial {trial.number}: {spec.label()}")
        for level in metrics.levels:
            tracker.log_stepped(run_id, f"tokens_per_s_repeats_bs{level.batch_size}", level.repeats)
        if metrics.slo is not None:
            tracker.log_stepped(run_id, "slo_probe_rate_rps", [p.rate_rps for p in metrics.slo.probes])
            tracker.log_stepped(run_id, "slo_probe_held", [float(p.held) for p in metrics.slo.probes])
            tracker.log_dict(run_id, metrics.slo.model_dump(mode="json"), "slo_search.json")
        tracker.set_tags(
            run_id, {"state": "COMPLETE", "vllm_version": result.vllm_version, "device": result.device, **runner}
        )
        self._flag_lossless(run_id, spec, metrics, result.device)
        tracker.end_trial(run_id, "FINISHED")
        best = self._best_label(metrics.score, spec)
        slo = f", SLO kept up to {metrics.slo.max_rate_rps:g} requests/s" if metrics.slo is not None else ""
        self.view.trial_finished(
            trial.number, f"{metrics.tokens_per_s:.1f} tok/s{_fmt_speedup(metrics.speedup)}{slo}", best
        )
        return metrics.score

    def _flag_lossless(self, run_id: str, spec: TrialSpec, metrics: TrialMetrics, device: str) -> None:
        config = self.ps.config
        if spec.is_baseline or config.workload.temperature != 0.0:
            return
        rates = [lv.lossless_match_rate for lv in metrics.levels if lv.lossless_match_rate is not None]
        if not rates:
            return
        worst = min(rates)
        self.ps.tracker.set_tags(run_id, {"lossless": "exact" if worst == 1.0 else f"{worst:.0%} of prompts match"})
        strict = device.startswith("cpu") and config.target.dtype in ("float32", "float")
        if worst < 1.0 and strict:
            self.ps.tracker.set_tags(run_id, {"lossless_defect": "true"})
            self.view.note(
                f"WARNING: trial output differs from the baseline on {1 - worst:.0%} of prompts at temperature 0 "
                "(float32 on CPU should match exactly)"
            )

    def _best_label(self, score: float, spec: TrialSpec) -> str | None:
        held = self.best_so_far()
        if held is None or score >= held[1]:
            return f"{spec.label()} (score {score:.3f})"
        return held[0]

    def best_so_far(self) -> tuple[str, float] | None:
        """The study's best trial as the progress line shows it, and its score (a resumed study has one)."""
        study = self.ps.study
        best = store.best_trial(study)
        metrics = store.scored_metrics(study, best) if best else None
        if best is None or metrics is None:
            return None
        spec = store.trial_spec(best)
        return f"{spec.label() if spec else best.number} (score {metrics.score:.3f})", metrics.score


def _fmt_speedup(value: float | None) -> str:
    return f", {value:.2f}x vs no speculation" if value is not None else ""
