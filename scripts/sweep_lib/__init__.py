"""The sweep behind `ropebench sweep`. `main(argv) -> exit code` (cli.py). The config in three stages:
config.py (read YAML, merge flags), resolve.py (shape and types), checks.py (names and values, through the
layers that own them); plugins.py imports plugins between the last two. Then orchestrate.py (the run
directory, sharding over accelerate ranks: dist.py), run.py (cell execution: resume, failure isolation),
printout.py (what it prints: the plan before, the outcome after) and grid.py (cells and their keys),
rundir.py (lock, --fresh)."""

from .cli import main

__all__ = ["main"]
