#!/usr/bin/env python
"""ropebench sweep: model x method x factor x task x lengths -> a run directory with records, tables, plots and
report.md.

    python scripts/sweep.py                                   # the embedded demo (scripts/configs/demo.yaml)
    python scripts/sweep.py --config scripts/configs/llama2-7b-gpu.yaml
    python scripts/sweep.py --methods plain yarn --factors 2 4 --tasks perplexity --lengths 2048 8192 --out runs/x
    accelerate launch scripts/sweep.py --config my.yaml        # each process runs its share of the cells

Rerunning with the same --out resumes (finished cells are skipped); --fresh starts over. Bad input (any
RopebenchError, caught once in sweep_lib/cli.py) prints one line `error: ...` and exits 2; failed cells are
recorded, listed at the end, and make the exit code 1. See docs/sweeps.md and docs/bad-input.md.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):  # the repo's packages (extend, tasks, results) and scripts/sweep_lib
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sweep_lib import main

if __name__ == "__main__":
    sys.exit(main())
