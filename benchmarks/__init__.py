"""ropebench's speed and memory benchmarks. One entry point, `ropebench bench NAME [ARGS]`
(benchmarks/cli.py; `ropebench bench --help` lists the names). One-off investigations whose numbers
NOTES.md quotes live in benchmarks/probes/ (`python -m ropebench.benchmarks.probes.NAME`).

Importing this package, or any module in it, loads no torch and runs nothing: the work happens in each
module's `main(argv)`.
"""

# One copy of each module: this folder is package `ropebench.benchmarks` (pyproject's package-dir);
# imported under its folder name it would be a second module tree, invisible to the sweep (docs/layout.md).
if __name__ != "ropebench.benchmarks":
    raise ImportError(
        f"{__name__!r} is the folder of `ropebench.benchmarks`: write `from ropebench import benchmarks`"
    )
