"""ropebench's speed and memory benchmarks. One entry point, `ropebench bench NAME [ARGS]`
(benchmarks/cli.py; `ropebench bench --help` lists the names). One-off investigations whose numbers
NOTES.md quotes live in benchmarks/probes/ (`python -m ropebench.benchmarks.probes.NAME`).

Importing this package, or any module in it, loads no torch and runs nothing: the work happens in each
module's `main(argv)`.
"""
