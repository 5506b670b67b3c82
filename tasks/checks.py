"""Suite options checked without a model: the sweep calls `check_suite_options` for every task before it loads
anything, so a typo (`protocol=slidng`, `num_docs=0`, `depths=[1.5]`) fails at once with one line instead of in
every cell after the model loaded.

The rules restate the checks at the top of each suite's `run` (same choices and ranges); an option without a rule
here is checked against the type of its default in the suite's signature.
"""
from __future__ import annotations

import inspect
import math

from .errors import TaskError

NOT_OPTIONS = ("model", "tokenizer", "tok", "lengths", "seed", "progress")


def _positive(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return "must be a positive integer — e.g. 1, 2 or 4"
    return None


def _positive_or_none(value) -> str | None:
    return None if value is None else _positive(value)


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _optional_flag(value) -> str | None:
    return None if value is None or isinstance(value, bool) else "must be true, false or unset (the tokenizer decides)"


def _choice(*choices):
    def check(value) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"
    return check


def _optional_choice(*choices):
    def check(value) -> str | None:
        return None if value is None or value in choices else f"must be one of {', '.join(choices)} (or unset)"
    return check


def _fraction_open(value) -> str | None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 < value < 1.0
    return None if ok else "must be a number strictly between 0 and 1 — e.g. 0.5"


def _depths(value) -> str | None:
    values = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or not values:
        return "must be a non-empty list of fractions in [0, 1] — e.g. [0.0, 0.5, 1.0]"
    for d in values:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or not 0.0 <= d <= 1.0:
            return (f"holds {d!r}, not a fraction in [0, 1] — 0 puts the needle first, 1 last, e.g. "
                    "[0.0, 0.5, 1.0]")
    return None


RULES = {
    "perplexity": {"protocol": _choice("truncate", "sliding"), "num_docs": _positive, "chunk_size": _positive,
                   "stride": _positive_or_none, "span": _positive_or_none, "add_bos": _optional_flag,
                   "join_docs": _flag},
    "passkey": {"depths": _depths, "trials": _positive, "max_new_tokens": _positive,
                "haystack": _choice("filler", "corpus"), "chat_template": _flag, "add_bos": _optional_flag},
    "classification": {"mode": _choice("zero-shot", "many-shot"), "num_docs": _positive,
                       "excerpt_tokens": _positive, "demo_fraction": _fraction_open,
                       "label": _optional_choice("era", "party", "label"), "add_bos": _optional_flag},
}


def _by_default(default, value) -> str | None:
    """The value against the type of the option's default (None or no default: anything goes)."""
    if default is None or default is inspect.Parameter.empty:
        return None
    if isinstance(default, bool):
        return _flag(value)
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "must be an integer"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "must be a number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "must be a string"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, (list, tuple)) else "must be a list"
    return None


def check_suite_options(task: str, suite, options: dict) -> None:
    """Raise TaskError for the first bad option value of `task` (suite function `suite`), e.g.
    "perplexity option num_docs=0 must be a positive integer — e.g. 1, 2 or 4"."""
    params = inspect.signature(suite).parameters
    rules = RULES.get(task, {})
    for key, value in options.items():
        if key in NOT_OPTIONS:
            continue
        rule = rules.get(key)
        if rule is not None:
            problem = rule(value)
        else:
            p = params.get(key)
            problem = _by_default(p.default if p is not None else None, value)
        if problem is not None:
            if " — " not in problem:
                problem += " — check the value (README, section Suites, lists every option)"
            raise TaskError(f"{task} option {key}={value!r} {problem}")
    if task == "perplexity" and options.get("protocol", "truncate") == "truncate":
        extra = [k for k in ("stride", "span") if options.get(k) is not None]
        if extra:
            raise TaskError(f"perplexity option {extra[0]} only applies to protocol sliding — drop it or set "
                            "protocol: sliding")
