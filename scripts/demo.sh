#!/usr/bin/env bash
# One command from a fresh checkout: create/refresh .venv (idempotent) and run the sweep.
# Without arguments this is the embedded demo (scripts/configs/demo.yaml; its measured time per CPU kind:
# docs/measured.md); any arguments go to `ropebench sweep`, e.g. `bash scripts/demo.sh --dry-run`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec "${ROPEBENCH_VENV:-$root/.venv}/bin/ropebench" sweep "$@"
