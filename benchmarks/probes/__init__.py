"""One-off probes: scripts that investigate one question (where a forward's time goes, which chunk or block
size, the floor of prefix sharing, one passkey prompt) and print what NOTES.md quotes. Not part of the
benchmark run; each runs as `python -m ropebench.benchmarks.probes.NAME [ARGS]` (its docstring gives the
command).
"""
