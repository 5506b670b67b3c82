"""ropebench's command line and sweep, installed as the import package `ropebench` (pyproject.toml maps the
name to scripts/): `ropebench.cli` is the `ropebench` command, `ropebench.sweep_lib` the sweep behind
`ropebench sweep`. Importing it imports nothing else (each subcommand imports its package when it runs)."""

# One copy of each module: this folder is package `ropebench` (pyproject's package-dir);
# imported under its folder name it would be a second module tree, invisible to the sweep (docs/layout.md).
if __name__ != "ropebench":
    raise ImportError(f"{__name__!r} is the folder of `ropebench`: write `import ropebench`")
