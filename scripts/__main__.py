"""`python -m ropebench` = the `ropebench` command."""

import sys

from ropebench.cli import main

sys.exit(main())
