"""Deprecated: the task kit is `tasks.kit` (`from tasks.kit import declare, run_cells, ...`). This name stays
one release for plugins written against it; it is the same module object, so patching `tasks.suite.X`
patches `tasks.kit.X`. Remove in a later release."""

import sys
import warnings

from . import kit

warnings.warn("tasks.suite is deprecated — import tasks.kit instead", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = kit
