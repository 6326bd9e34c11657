"""Noise: one configuration measured in N fresh engines.

    python -m benchmarks.noise --study studies/smollm2-cpu.yaml --candidate none --engines 3

Prints, per engine, the median output tokens/s and the within-engine CV over repeats, then the
coefficient of variation of the medians across engines (what separates two trials of one config).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import load_with_overrides, print_table, write_result
from tuner.cli import quiet_libraries
from tuner.engine.process import run_engine
from tuner.engine.request import TrialRequest
from tuner.models.demo import prepare_demo
from tuner.results.scoring import score_result
from tuner.results.stats import coefficient_of_variation, median
from tuner.study.loader import load_study
from tuner.study.prompts import load_prompts
from tuner.study.space import find_candidate
from tuner.study.spec import baseline_spec, llm_kwargs, resolve_model, spec_from_candidate


def main() -> None:
    quiet_libraries()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, default=Path("studies/smollm2-cpu.yaml"))
    parser.add_argument("--candidate", default="none", help="candidate name from the study")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="override, e.g. workload.max_tokens=32")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = load_with_overrides(args.study, args.set, Path(tmp), "noise")
        study = load_study(path)
        prepare_demo(log=lambda m: None)
        candidate = find_candidate(study, args.candidate)
        eager = study.search.enforce_eager[0]
        if candidate is None or candidate.method == "none":
            spec = baseline_spec(eager)
        else:
            values: dict[str, Any] = {"enforce_eager": eager, "num_speculative_tokens": args.num_speculative_tokens}
            if candidate.method == "ngram":
                values.update(prompt_lookup_max=4, prompt_lookup_min=2)
            spec = spec_from_candidate(candidate, **values)
        prompts = load_prompts(study.workload.prompts)
        w = study.workload
        request = TrialRequest.for_study(
            study, prompts, llm_kwargs(study.target, resolve_model(study.target.model), spec)
        )
        rows, engines = [], []
        for i in range(args.engines):
            outcome = run_engine(request, Path(tmp) / f"engine-{i}", study.budget.trial_timeout_s)
            assert outcome.result is not None, outcome.message
            metrics = score_result(outcome.result, study)
            for level in metrics.levels:
                rows.append([i, level.batch_size, level.tokens_per_s, level.tokens_per_s_cv, metrics.engine_start_s])
            engines.append(metrics.model_dump(mode="json"))

    summary = []
    for bs in study.workload.batch_sizes:
        medians = [r[2] for r in rows if r[1] == bs]
        summary.append(
            {
                "batch_size": bs,
                "medians": medians,
                "median_of_medians": median(medians),
                "cv_of_medians": coefficient_of_variation(medians),
            }
        )
    print(
        f"configuration: {spec.label()}  workload: {len(prompts)} prompts, max_tokens {w.max_tokens}, "
        f"{w.repeats} repeats"
    )
    print_table(["engine", "batch", "median tok/s", "CV within engine", "engine start s"], rows)
    print()
    print_table(
        ["batch", "median of medians", "CV of medians across engines"],
        [[s["batch_size"], s["median_of_medians"], s["cv_of_medians"]] for s in summary],
    )
    out = write_result(
        "noise",
        {
            "configuration": spec.model_dump(mode="json"),
            "per_engine": engines,
            "summary": summary,
            "overrides": args.set,
        },
    )
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
