"""ropebench suites: perplexity, passkey retrieval, long-document classification and RULER-style retrieval.

Each suite is `run(model, tokenizer, *, lengths, seed=0, progress=True, **options) -> list[dict]`
returning plain records (see docs/CONTRACTS.md), declared once with `tasks.suite.declare` (options and their
checks, metrics). Suites never know which RoPE method is active; they only ask `extend.length_dependent(model)`
whether one forward can serve several lengths.
"""

from . import classification, data, passkey, perplexity, retrieval, scoring, suite
from .errors import TaskError

SUITES = {
    "perplexity": perplexity.run,
    "passkey": passkey.run,
    "classification": classification.run,
    "retrieval": retrieval.run,
}

__all__ = [
    "SUITES",
    "TaskError",
    "classification",
    "data",
    "passkey",
    "perplexity",
    "retrieval",
    "scoring",
    "suite",
]
