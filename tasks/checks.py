"""Suite names and options checked without a model: the sweep calls `check_task` for every task before it loads
anything, so a typo (`passky`, `num_doc=2`, `protocol=slidng`, `num_docs=0`, `depths=[1.5]`) fails at once with one
line instead of in every cell after the model loaded.

The rules are each suite's own declaration (tasks/suite.py, `declare` on its run function): the same checks the
suite runs at every call. An option without a declared check is checked against the type of its default in the
suite's signature (so is every option of a plugin suite that declares nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from extend.errors import closest

from .errors import TaskError
from .suite import NOT_OPTIONS, signature_options, suite_of

__all__ = [
    "NOT_OPTIONS",
    "RULES",
    "check_lengths_fit",
    "check_suite_options",
    "check_task",
    "extra_tokens",
    "needs_tokenizer",
    "suite_options",
]


class _Rules(Mapping):
    """task -> {option: check}: the declared option checks of every suite in tasks.SUITES (read at each access,
    so plugin suites count)."""

    def _all(self) -> dict:
        from . import SUITES

        return {name: dict(suite_of(name, run).options) for name, run in SUITES.items()}

    def __getitem__(self, task):
        return self._all()[task]

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())


RULES = _Rules()


def suite_options(suite) -> tuple[dict, bool]:
    """A suite's options (name -> default, inspect.Parameter.empty when required; NOT_OPTIONS left out) and
    whether it also takes **kwargs (then any option name is accepted)."""
    return signature_options(suite)


def _suite(task: str):
    from . import SUITES  # the registry lives in the package (plugins add suites to it)

    if task not in SUITES:
        raise TaskError(f"unknown task {task!r} — {closest(task, SUITES, 'tasks')}")
    return suite_of(task, SUITES[task])


def check_task(task: str, options: dict, *, caller_keys: tuple = ()) -> None:
    """`task` names a suite of tasks.SUITES and `options` are options it takes, with valid values. `caller_keys`:
    keys the caller handles itself (e.g. the sweep's lengths, per_length), named in suggestions."""
    _suite(task).check(options, caller_keys=caller_keys)


def check_suite_options(task: str, suite, options: dict, *, caller_keys: tuple = ()) -> None:
    """Raise TaskError for the first option of `task` (suite function `suite`) that it does not take or whose value
    is bad, e.g. "perplexity option num_docs=0 must be a positive integer — e.g. 1, 2 or 4"."""
    suite_of(task, suite).check(options, caller_keys=caller_keys)


def extra_tokens(task: str, options: dict) -> int:
    """Tokens a cell of `task` runs past its length (e.g. passkey's generated tokens): for the memory check."""
    return int(_suite(task).extra_tokens(options))


def needs_tokenizer(task: str, lengths: list[int], options: dict) -> bool:
    """Whether `check_lengths_fit` wants the tokenizer for these lengths (reading it costs a second or two)."""
    return bool(_suite(task).needs_tokenizer(sorted(lengths), options))


def check_lengths_fit(task: str, lengths: list[int], options: dict, corpus: str, tokenizer=None) -> None:
    """Lengths a suite can never run, known without the model's weights (each suite declares its own `fits`: too
    short to score a token or to hold the prompt, a sliding stride wider than the window, longer than every
    document of the corpus). `tokenizer` (optional) makes the short-length bounds exact."""
    spec = _suite(task)
    if spec.fits is not None:
        spec.fits(sorted(lengths), options, corpus, tokenizer)
