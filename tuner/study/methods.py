"""Per-method rules: which knobs a speculative method takes, their defaults, validation and vLLM form.

Space, pre-flight, the trial spec, the study file's validators and labels all ask this registry, so a
method's rules live here once. Light on purpose: no vLLM, no pydantic models (the study config imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

# Methods the runner knows how to turn into a ``speculative_config``. ``eagle``/``eagle3``/``mtp``/
# ``suffix`` are passed through by name: vLLM validates them.
Method = Literal["none", "ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"]

K = "num_speculative_tokens"
LOOKUP_MAX = "prompt_lookup_max"
LOOKUP_MIN = "prompt_lookup_min"
# vLLM's batch-size schedule of k (tuner.results.schedule): [[start, end, k], ...], inclusive ranges.
SCHEDULE = "num_speculative_tokens_per_batch_size"
# n-gram lookup window when the study file leaves it out (vLLM's own defaults differ between versions).
LOOKUP_MAX_DEFAULT = 4
LOOKUP_MIN_DEFAULT = 2
# Every per-trial knob, in the order the space suggests them (Optuna's sampler sees this order).
KNOBS = (K, LOOKUP_MAX, LOOKUP_MIN)
# speculative_config keys the tuner writes itself, each with where the study file sets it instead: a
# candidate's ``extra`` that set one would measure (and export) something other than the trial's label.
TUNER_KEYS: dict[str, str] = {
    "method": "the candidate's method",
    K: "the candidate's num_speculative_tokens (or search.num_speculative_tokens)",
    "model": "the candidate's model",
    LOOKUP_MAX: "the candidate's prompt_lookup_max",
    LOOKUP_MIN: "the candidate's prompt_lookup_min",
    SCHEDULE: "schedule: {enabled: true} (the tuner derives the schedule and measures it)",
}


class Bounds(Protocol):
    """An inclusive integer range (``IntRange`` of the study file)."""

    @property
    def low(self) -> int: ...
    @property
    def high(self) -> int: ...


@dataclass(frozen=True)
class MethodRules:
    name: Method
    draft_model: Literal["required", "forbidden", "optional"]
    speculates: bool = True  # takes num_speculative_tokens
    lookup: bool = False  # takes prompt_lookup_min/max (n-gram)
    # vLLM passes the schedule's k to this method's proposer (vllm/v1/worker/gpu_model_runner.py,
    # propose_draft_token_ids: ngram, suffix, and the eagle/draft-model branch that mtp takes too).
    batch_schedule: bool = True
    # The model is an EAGLE head (vLLM's EAGLE or speculators layout), fed with the target's hidden states:
    # it has no tokenizer of its own, so pre-flight checks its shapes against the target instead.
    head: bool = False

    @property
    def knobs(self) -> tuple[str, ...]:
        return tuple(k for k in KNOBS if (k == K and self.speculates) or (k != K and self.lookup))

    @property
    def checkable_without_model(self) -> bool:
        """vLLM can build its ``SpeculativeConfig`` without loading any model (pre-flight probes it)."""
        return self.speculates and self.draft_model == "forbidden"


METHODS: dict[Method, MethodRules] = {
    "none": MethodRules("none", draft_model="forbidden", speculates=False, batch_schedule=False),
    "ngram": MethodRules("ngram", draft_model="forbidden", lookup=True),
    "draft_model": MethodRules("draft_model", draft_model="required"),
    "eagle": MethodRules("eagle", draft_model="required", head=True),
    "eagle3": MethodRules("eagle3", draft_model="required", head=True),
    # MTP drafts with the target's own heads; a separate checkpoint may be given.
    "mtp": MethodRules("mtp", draft_model="optional"),
    "suffix": MethodRules("suffix", draft_model="forbidden"),
}


def rules(method: Method) -> MethodRules:
    return METHODS[method]


def check_candidate(method: Method, model: str | None, has_k: bool, has_lookup: bool) -> str | None:
    """The one-line error for a candidate's method-specific settings (field and fix), or None."""
    rule = METHODS[method]
    if rule.draft_model == "required" and not model:
        return f"method {method} needs a draft model; fix: add model: PATH"
    if rule.draft_model == "forbidden" and model:
        return f"method {method} takes no model; fix: remove model"
    if has_lookup and not rule.lookup:
        return "prompt_lookup_min/max are n-gram settings; fix: remove them or use method: ngram"
    if has_k and not rule.speculates:
        return f"method {method} speculates nothing; fix: remove {K}"
    return None


def check_extra(extra: dict[str, Any]) -> tuple[str, str] | None:
    """(key, problem and fix) for the first ``extra`` key that the tuner sets itself, or None."""
    for key in extra:
        if key in TUNER_KEYS:
            return key, f"set by the tuner; fix: remove it from extra and set {TUNER_KEYS[key]}"
    return None


def clip_lookup(lookup_max: int | None, lookup_min: int | None) -> tuple[int, int]:
    """(max, min) with defaults for what is unset; vLLM requires min <= max, so min is clipped rather
    than a trial wasted."""
    hi = lookup_max if lookup_max is not None else LOOKUP_MAX_DEFAULT
    lo = lookup_min if lookup_min is not None else LOOKUP_MIN_DEFAULT
    return hi, min(lo, hi)


def lookup_grid(lookup_max: Bounds | None, lookup_min: Bounds | None) -> list[tuple[int, int]]:
    """Every (max, min) pair the space can produce; mins above a max are left out (suggest clips them)."""
    pairs = []
    for hi in range(lookup_max.low, lookup_max.high + 1) if lookup_max else [LOOKUP_MAX_DEFAULT]:
        if lookup_min:
            pairs += [(hi, lo) for lo in range(lookup_min.low, min(lookup_min.high, hi) + 1)]
        else:
            pairs.append(clip_lookup(hi, None))
    return pairs


def lookup_probe(lookup_max: Bounds | None, lookup_min: Bounds | None) -> tuple[int, int]:
    """The widest lookup window of the ranges (largest max, smallest min): the corner pre-flight checks."""
    return clip_lookup(lookup_max.high if lookup_max else None, lookup_min.low if lookup_min else None)


def speculative_config(
    method: Method,
    num_speculative_tokens: int | None,
    draft_model: str | None = None,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` (None: no speculation), in the keys of vLLM 0.32, the version the project
    is tested with (README, "Installing elsewhere"); ``extra`` is the study file's own keys (and the schedule
    under validation), passed as given after the tuner's. An ``extra`` key that this function sets itself
    raises ValueError."""
    if not METHODS[method].speculates:
        return None
    config: dict[str, Any] = {"method": method, K: num_speculative_tokens}
    if draft_model is not None:
        config["model"] = draft_model
    if prompt_lookup_max is not None:
        config[LOOKUP_MAX] = prompt_lookup_max
    if prompt_lookup_min is not None:
        config[LOOKUP_MIN] = prompt_lookup_min
    # The batch-size schedule under validation comes through extra (the study file cannot set it: config.py).
    clash = [key for key in extra or {} if key in TUNER_KEYS and key != SCHEDULE]
    if clash:
        raise ValueError(f"extra.{clash[0]}: set by the tuner; fix: set {TUNER_KEYS[clash[0]]} instead")
    config.update(extra or {})
    return config


def label(
    method: Method,
    candidate: str,
    num_speculative_tokens: int | None,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> str:
    """How reports, exports and the progress view name a configuration (without enforce_eager)."""
    rule = METHODS[method]
    if not rule.speculates:
        return "no speculation"
    if rule.lookup:
        return f"{method} k={num_speculative_tokens} lookup {prompt_lookup_min}-{prompt_lookup_max}"
    if rule.head:
        return f"{method} {candidate} k={num_speculative_tokens}"
    return f"{candidate} k={num_speculative_tokens}"
