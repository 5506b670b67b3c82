"""`python -m ropebench.integrations.lm_eval ...`: the CLI shim without ropebench's task folder."""

import sys

from .cli import main

sys.exit(main())
