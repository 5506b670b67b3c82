"""Task names and options checked without a model: the sweep calls `check_task` for every task before it loads
anything, so a typo (`passky`, `num_doc=2`, `protocol=slidng`, `num_docs=0`, `depths=[1.5]`) fails at once
with one line instead of in every cell after the model loaded.

The rules are each task's own declaration (tasks/kit.py, `declare` on its run function): the same checks the
task runs at every call. An option without a declared check is checked against the type of its default in the
task's signature (so is every option of a plugin task that declares nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

from ropebench.extend.errors import closest

from .errors import TaskError
from .kit import NOT_OPTIONS, signature_options, task_spec

__all__ = [
    "NOT_OPTIONS",
    "RULES",
    "check_lengths_fit",
    "check_task",
    "check_task_options",
    "extra_tokens",
    "needs_tokenizer",
    "signature_options",
]


class _Rules(Mapping):
    """task -> {option: check}: the declared option checks of every task in tasks.TASKS (read at each access,
    so plugin tasks count)."""

    def _all(self) -> dict:
        from .kit import TASKS

        return {name: dict(task_spec(name, run).options) for name, run in TASKS.items()}

    def __getitem__(self, task):
        return self._all()[task]

    def __iter__(self):
        return iter(self._all())

    def __len__(self):
        return len(self._all())


RULES = _Rules()


def _spec(task: str):
    from .kit import TASKS  # the registry (declare and plugins add tasks to it)

    if task not in TASKS:
        raise TaskError(f"unknown task {task!r} — {closest(task, TASKS, 'tasks')}")
    return task_spec(task, TASKS[task])


def check_task(task: str, options: dict, *, caller_keys: tuple = ()) -> None:
    """`task` names a task of tasks.TASKS and `options` are options it takes, with valid values.
    `caller_keys`: keys the caller handles itself (e.g. the sweep's lengths, per_length), named in
    suggestions."""
    _spec(task).check(options, caller_keys=caller_keys)


def check_task_options(task: str, run, options: dict, *, caller_keys: tuple = ()) -> None:
    """Raise TaskError for the first option of `task` (run function `run`) that it does not take or whose
    value is bad, e.g. "perplexity option num_docs=0 must be a positive integer — e.g. 1, 2 or 4"."""
    task_spec(task, run).check(options, caller_keys=caller_keys)


def extra_tokens(task: str, options: dict) -> int:
    """Tokens a cell of `task` runs past its length (e.g. passkey's generated tokens): for the memory
    check."""
    return int(_spec(task).extra_tokens(options))


def needs_tokenizer(task: str, lengths: list[int], options: dict) -> bool:
    """Whether `check_lengths_fit` wants the tokenizer for these lengths (reading it costs a second or
    two)."""
    return bool(_spec(task).needs_tokenizer(sorted(lengths), options))


def check_lengths_fit(task: str, lengths: list[int], options: dict, corpus: str, tokenizer=None) -> None:
    """Lengths a task can never run, known without the model's weights (each task declares its own `fits`: too
    short to score a token or to hold the prompt, a sliding stride wider than the window, longer than every
    document of the corpus). `tokenizer` (optional) makes the short-length bounds exact."""
    spec = _spec(task)
    if spec.fits is not None:
        spec.fits(sorted(lengths), options, corpus, tokenizer)
