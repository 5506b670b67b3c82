"""ropebench suites: perplexity, passkey retrieval and long-document classification.

Each suite is `run(model, tokenizer, *, lengths, seed=0, progress=True, **options) -> list[dict]`
returning plain records (see docs/CONTRACTS.md). Suites never know which RoPE method is active;
they only ask `extend.length_dependent(model)` whether one forward can serve several lengths.
"""
from . import classification, data, passkey, perplexity, scoring
from .errors import TaskError

SUITES = {"perplexity": perplexity.run, "passkey": passkey.run, "classification": classification.run}

__all__ = ["SUITES", "TaskError", "classification", "data", "passkey", "perplexity", "scoring"]
