"""Integrations with other tools, built on the layers (extend, tasks, results), which never import them:
`lm_eval`, the lm-eval model `ropebench` and the `ropebench lm-eval` command."""
