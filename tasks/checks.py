"""Suite names and options checked without a model: the sweep calls `check_task` for every task before it loads
anything, so a typo (`passky`, `num_doc=2`, `protocol=slidng`, `num_docs=0`, `depths=[1.5]`) fails at once with one
line instead of in every cell after the model loaded.

The rules restate the checks at the top of each suite's `run` (same choices and ranges); an option without a rule
here is checked against the type of its default in the suite's signature.
"""
from __future__ import annotations

import inspect
import math

from extend.errors import closest

from .errors import TaskError

NOT_OPTIONS = ("model", "tokenizer", "tok", "lengths", "seed", "progress")  # a suite's arguments, not options


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


def suite_options(suite) -> tuple[dict, bool]:
    """A suite's options (name -> default, inspect.Parameter.empty when required; NOT_OPTIONS left out) and
    whether it also takes **kwargs (then any option name is accepted)."""
    params = inspect.signature(suite).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    options = {k: p.default for k, p in params.items()
               if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and k not in NOT_OPTIONS}
    return options, takes_any


def check_task(task: str, options: dict, *, caller_keys: tuple = ()) -> None:
    """`task` names a suite of tasks.SUITES and `options` are options it takes, with valid values. `caller_keys`:
    keys the caller handles itself (e.g. the sweep's lengths, per_length), named in suggestions."""
    from . import SUITES  # the registry lives in the package (plugins add suites to it)

    if task not in SUITES:
        raise TaskError(f"unknown task {task!r} — {closest(task, SUITES, 'tasks')}")
    check_suite_options(task, SUITES[task], options, caller_keys=caller_keys)


def check_suite_options(task: str, suite, options: dict, *, caller_keys: tuple = ()) -> None:
    """Raise TaskError for the first option of `task` (suite function `suite`) that it does not take or whose value
    is bad, e.g. "perplexity option num_docs=0 must be a positive integer — e.g. 1, 2 or 4"."""
    known, takes_any = suite_options(suite)
    for key in options:
        if key in NOT_OPTIONS or not (takes_any or key in known):
            raise TaskError(f"unknown option {key!r} for task {task!r} — "
                            f"{closest(key, [*known, *caller_keys], 'options')}")
    rules = RULES.get(task, {})
    for key, value in options.items():
        rule = rules.get(key)
        problem = rule(value) if rule is not None else _by_default(known.get(key), value)
        if problem is not None:
            if " — " not in problem:
                problem += " — check the value (docs/suites.md lists every option)"
            raise TaskError(f"{task} option {key}={value!r} {problem}")
    if task == "perplexity" and options.get("protocol", "truncate") == "truncate":
        extra = [k for k in ("stride", "span") if options.get(k) is not None]
        if extra:
            raise TaskError(f"perplexity option {extra[0]} only applies to protocol sliding — drop it or set "
                            "protocol: sliding")
