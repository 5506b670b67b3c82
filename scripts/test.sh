#!/usr/bin/env bash
# The test command: sets up .venv if needed (scripts/setup.sh), then runs pytest offline.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
venv="${ROPEBENCH_VENV:-$root/.venv}"
[ "${ROPEBENCH_NEWEST:-0}" = 0 ] || venv="${ROPEBENCH_VENV:-$root/.venv-newest}"  # as setup.sh
cd "$root"
# --quick (first argument): the inner loop's subset, without the tests marked slow or real (tests/conftest.py
# marks them by rule: processes started, the real model loaded, grids run end to end, and those measured at 1 s or
# more, listed in tests/slow_tests.txt; `--quick --record-slow` adds this run's to the list; docs/layout.md)
if [ "${1:-}" = "--quick" ]; then shift; set -- -m "not slow and not real" "$@"; fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two workers by default (pytest-xdist; each module runs whole on one worker, so module fixtures are built
# once); ROPEBENCH_TEST_WORKERS=0 runs in one process (e.g. for -s or a debugger). Modules are handed out in
# collection order (--no-loadscope-reorder; xdist's default orders them by test count, which sent the long
# two-test modules last), and tests/conftest.py collects the slowest modules first (SLOWEST_FIRST), so the run
# does not end with one worker alone on a long module.
workers="${ROPEBENCH_TEST_WORKERS:-2}"
if [ "$workers" -gt 0 ] 2>/dev/null; then
  # the cores shared among the workers (torch would give each worker every core: oversubscribed)
  threads=$(( $(nproc) / workers )); [ "$threads" -ge 1 ] || threads=1
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$threads}"
  exec "$venv/bin/python" -m pytest -n "$workers" --dist loadscope --no-loadscope-reorder "$@"
fi
exec "$venv/bin/python" -m pytest "$@"
