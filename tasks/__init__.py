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

import pkgutil
from importlib import import_module

from .errors import TaskError
from .kit import TASKS

# Every module of this folder, imported once here: a built-in task is its module alone (`kit.declare`
# registers it in TASKS). The import-graph test reads this loop as an edge to each module of the folder.
for _module in pkgutil.iter_modules(__path__):
    import_module(f"{__name__}.{_module.name}")
_built_in = sorted(TASKS.items())  # by name (imports run in dependency order); plugins' tasks follow
TASKS.clear()
TASKS.update(_built_in)

__all__ = ["TASKS", "TaskError"] + [m.name for m in pkgutil.iter_modules(__path__)]
