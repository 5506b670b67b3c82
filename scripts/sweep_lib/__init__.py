"""The sweep behind scripts/sweep.py: config (YAML + CLI), grid of cells, runner (resume, failure isolation,
accelerate sharding) and the end summary. `main(argv) -> exit code`."""
from .run import main

__all__ = ["main"]
