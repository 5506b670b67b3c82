"""The sweep behind `ropebench sweep`. `main(argv) -> exit code` (cli.py). The config in three stages:
config.py (read YAML, merge flags), resolve.py (shape and types), checks.py (names and values, through the
layers that own them); plugins.py imports plugins between the last two. Then orchestrate.py (the run
directory, sharding over accelerate ranks: dist.py), run.py (cell execution: resume, failure isolation),
printout.py (what it prints: the plan before, the outcome after) and grid.py (cells and their keys),
rundir.py (lock, --fresh)."""

# One copy of each module: this folder is package `ropebench.sweep_lib`; imported by its bare name
# (`python scripts/sweep.py` puts scripts/ on sys.path) it would be a second copy (docs/layout.md).
if __name__ != "ropebench.sweep_lib":
    raise ImportError(
        f"{__name__!r} is the folder of `ropebench.sweep_lib`: write `from ropebench import sweep_lib`"
    )

__all__ = ["main"]


def __getattr__(name):
    """`main` on first use: the sweep's command line imports torch and transformers (seconds), which the
    light modules here (rundir, grid, config) do not need."""
    if name == "main":
        from .cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
