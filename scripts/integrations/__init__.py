"""Integrations with other tools, built on the layers (extend, tasks, results), which never import them:
`lm_eval`, the lm-eval model `ropebench` and the `ropebench lm-eval` command."""

# One copy of each module: this folder is package `ropebench.integrations`; imported by its bare name
# (`python scripts/sweep.py` puts scripts/ on sys.path) it would be a second copy (docs/layout.md).
if __name__ != "ropebench.integrations":
    raise ImportError(
        f"{__name__!r} is the folder of `ropebench.integrations`: write `from ropebench import integrations`"
    )
