"""ropebench results: durable records, one tidy DataFrame, tables, plots and reports.

Results never know which task made a row: everything works on the row schema in ``SCHEMA``.
The store is imported eagerly (the sweep needs only it); pandas/seaborn parts load on first use so a
sweep process does not pay for matplotlib. Nothing here loads torch or transformers: reading results works
without the model stack (tests/project/test_import_graph.py runs it with both blocked).
"""

# One copy of each module: this folder is package `ropebench.results` (pyproject's package-dir);
# imported under its folder name it would be a second module tree, invisible to the sweep (docs/layout.md).
if __name__ != "ropebench.results":
    raise ImportError(
        f"{__name__!r} is the folder of `ropebench.results`: write `from ropebench import results`"
    )

from importlib import import_module
from typing import Any

from .store import SCHEMA, RecordWriter, ResultsError, ResultsWarning, finished_cells

_LAZY = {
    "load": "frame",
    "from_lm_eval": "frame",
    "table": "tables",
    "estimates": "tables",
    "to_markdown": "tables",
    "to_csv": "tables",
    "to_latex": "tables",
    "write_table": "tables",
    "compare": "comparisons",
    "paired_differences": "comparisons",
    "effective_length": "reach",
    "summary": "overview",
    "wilson": "stats",
    "Plot": "plots",
    "plot_perplexity": "plots",
    "plot_passkey": "plots",
    "plot_classification": "plots",
    "report": "reporting",
}

__all__ = [
    "SCHEMA",
    "Plot",
    "RecordWriter",
    "ResultsError",
    "ResultsWarning",
    "compare",
    "effective_length",
    "estimates",
    "finished_cells",
    "from_lm_eval",
    "load",
    "paired_differences",
    "plot_classification",
    "plot_passkey",
    "plot_perplexity",
    "report",
    "summary",
    "table",
    "to_csv",
    "to_latex",
    "to_markdown",
    "wilson",
    "write_table",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # cache: later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'results' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
