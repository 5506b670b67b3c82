#!/usr/bin/env bash
# The test command: sets up .venv if needed (scripts/setup.sh), then runs pytest offline.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
venv="${ROPEBENCH_VENV:-$root/.venv}"
[ "${ROPEBENCH_NEWEST:-0}" = 0 ] || venv="${ROPEBENCH_VENV:-$root/.venv-newest}"  # as setup.sh
cd "$root"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/python" -m pytest "$@"
