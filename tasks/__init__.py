"""ropebench tasks: perplexity, passkey retrieval, long-document classification and RULER-style retrieval.

Each task is `run(model, tokenizer, *, lengths, seed=0, progress=True, **options) -> list[dict]`
returning plain records (see docs/CONTRACTS.md), declared once with `tasks.kit.declare` (options and their
checks, metrics). Tasks never know which RoPE method is active; they only ask `extend.length_dependent(model)`
whether one forward can serve several lengths.
"""

# One copy of each module: this folder is package `ropebench.tasks` (pyproject's package-dir);
# imported under its folder name it would be a second module tree, invisible to the sweep (docs/layout.md).
if __name__ != "ropebench.tasks":
    raise ImportError(f"{__name__!r} is the folder of `ropebench.tasks`: write `from ropebench import tasks`")

from . import classification, data, kit, passkey, perplexity, retrieval, scoring
from .errors import TaskError

TASKS = {
    "perplexity": perplexity.run,
    "passkey": passkey.run,
    "classification": classification.run,
    "retrieval": retrieval.run,
}

__all__ = [
    "TASKS",
    "TaskError",
    "classification",
    "data",
    "kit",
    "passkey",
    "perplexity",
    "retrieval",
    "scoring",
]


def __getattr__(name: str):
    # Deprecated: `tasks.SUITES` was the name of TASKS (the same dict, so a plugin's `tasks.SUITES[name] =
    # run` still registers its task). Remove in a later release.
    if name == "SUITES":
        import warnings

        warnings.warn("tasks.SUITES is deprecated — use tasks.TASKS", DeprecationWarning, stacklevel=2)
        return TASKS
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")
