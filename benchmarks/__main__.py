"""`ropebench bench NAME [ARGS]`: see benchmarks/cli.py."""

import sys

from ropebench.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
