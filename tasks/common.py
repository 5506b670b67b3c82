"""Small helpers every suite uses: parameter checks, records, tokenizing, the length-dependence query."""
from __future__ import annotations

from extend import length_dependent  # noqa: F401  (re-exported: can one forward serve several lengths?)

from .errors import TaskError


def check_lengths(lengths) -> list[int]:
    if isinstance(lengths, int):
        lengths = [lengths]
    try:
        out = sorted({int(x) for x in lengths})
    except (TypeError, ValueError):
        raise TaskError(f"lengths must be a list of positive integers, got {lengths!r}") from None
    if not out or out[0] <= 0 or any(int(x) != x for x in lengths):
        raise TaskError(f"lengths must be a non-empty list of positive integers, got {lengths!r} — "
                        "e.g. lengths=[2048, 4096]")
    return out


def check_positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TaskError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise TaskError(f"unknown {name} {value!r} — use one of {sorted(choices)}")
    return value


def encoder(tokenizer):
    """Text -> token ids without special tokens (suites add BOS/templates themselves)."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return encode


def record(task, corpus, length, metric, value, n, seconds, task_options, *, depth=None, doc=None, trial=None):
    return {"task": task, "corpus": corpus, "length": int(length), "depth": depth, "doc": doc, "trial": trial,
            "metric": metric, "value": float(value), "n": int(n), "seconds": float(seconds),
            "task_options": dict(task_options)}
