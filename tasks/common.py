"""Small helpers every task uses: parameter checks, records, tokenizing, the length-dependence query."""

from __future__ import annotations

from ropebench.extend import length_dependent  # noqa: F401  (re-exported: can one forward serve several lengths?)

from .errors import TaskError


def interleave(pieces: list[str], inserts: list[str], at: list[int]) -> list[str]:
    """`pieces` with insert k placed after `at[k]` of them (`at` ascending; inserts at one place in their
    order): how a haystack's sentences or blocks take their needles."""
    out, k = [], 0
    for i in range(len(pieces) + 1):
        while k < len(inserts) and at[k] == i:
            out.append(inserts[k])
            k += 1
        if i < len(pieces):
            out.append(pieces[i])
    return out


def check_lengths(lengths) -> list[int]:
    if isinstance(lengths, int):
        lengths = [lengths]
    try:
        out = sorted({int(x) for x in lengths})
    except (TypeError, ValueError):
        raise TaskError(f"lengths must be a list of positive integers, got {lengths!r}") from None
    if not out or out[0] <= 0 or any(int(x) != x for x in lengths):
        raise TaskError(
            f"lengths must be a non-empty list of positive integers, got {lengths!r} — "
            "e.g. lengths=[2048, 4096]"
        )
    return out


def check_positive(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise TaskError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise TaskError(f"unknown {name} {value!r} — use one of {sorted(choices)}")
    return value


_PROBE = "The grass is green."


def special_prefix(tokenizer, add_bos: bool | None = None) -> list[int]:
    """The ids the tokenizer's own encoding puts before any text (`tokenizer(text)` with special tokens), e.g.
    [bos] for Llama, [] for Qwen2.5 and SmolLM2 (whose `bos_token` their own encoding never adds).
    add_bos=None follows the tokenizer; True makes sure the prefix starts with its BOS (TaskError when it has
    none); False drops BOS from the prefix. Tasks put this prefix before each window and record
    `prefix_options(tokenizer, prefix)` so every record says what was used."""
    if add_bos not in (None, True, False):
        raise TaskError(f"add_bos must be true, false or null (follow the tokenizer), got {add_bos!r}")
    with_special = list(tokenizer(_PROBE)["input_ids"])
    text = list(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    starts = [i for i in range(len(with_special) - len(text) + 1) if with_special[i : i + len(text)] == text]
    prefix = with_special[: starts[0]] if starts else []
    bos = tokenizer.bos_token_id
    if add_bos is True:
        if bos is None:
            raise TaskError("add_bos=True but the tokenizer has no BOS token — use add_bos=false or null")
        if bos not in prefix:
            prefix = [bos] + prefix
    elif add_bos is False:
        prefix = [i for i in prefix if i != bos]
    return prefix


def prefix_options(tokenizer, prefix: list[int], add_bos: bool | None = None) -> dict:
    """What a task records about its special prefix: whether it holds BOS, the ids, and the setting asked
    for."""
    bos = tokenizer.bos_token_id
    return {
        "add_bos": bos is not None and bos in prefix,
        "prefix_ids": list(prefix),
        "bos_setting": "tokenizer" if add_bos is None else bool(add_bos),
    }


def encoder(tokenizer):
    """Text -> token ids without special tokens (tasks add their `special_prefix`/templates themselves)."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return encode


def record(
    task, corpus, length, metric, value, n, seconds, task_options, *, depth=None, doc=None, trial=None
):
    return {
        "task": task,
        "corpus": corpus,
        "length": int(length),
        "depth": depth,
        "doc": doc,
        "trial": trial,
        "metric": metric,
        "value": float(value),
        "n": int(n),
        "seconds": float(seconds),
        "task_options": dict(task_options),
    }
