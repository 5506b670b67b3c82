"""ropebench's command line and sweep, installed as the import package `ropebench` (pyproject.toml maps the
name to scripts/): `ropebench.cli` is the `ropebench` command, `ropebench.sweep_lib` the sweep behind
`ropebench sweep`. Importing it imports nothing else (each subcommand imports its package when it runs)."""
