#!/usr/bin/env python
"""`ropebench sweep` under its old name, kept for `accelerate launch`, which runs a script file:

    python scripts/sweep.py --config scripts/configs/llama2-7b-gpu.yaml      # = ropebench sweep --config ...
    accelerate launch scripts/sweep.py --config my.yaml      # each process runs its share of the cells

The sweep itself is ropebench.sweep_lib (scripts/sweep_lib/); docs/sweeps.md describes it.
"""

import sys

try:
    from ropebench.cli import main
except ModuleNotFoundError as e:  # a Python without ropebench installed (its import name is not scripts/)
    if e.name != "ropebench":
        raise
    print(
        f"error: ropebench is not installed in {sys.executable} ({e}) — run `bash scripts/setup.sh` and use "
        f".venv/bin/python (or .venv/bin/ropebench sweep)",
        file=sys.stderr,
    )
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
