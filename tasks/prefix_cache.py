"""Moved to `extend.prefix_cache` (the lm-eval model in the core shares prefixes too).

This name is the same module object, not a copy: code and tests that set `tasks.prefix_cache.MIN_SHARED` or
wrap `tasks.prefix_cache.PrefixCache` change what every caller uses, as before the move.
"""
import sys

from extend import prefix_cache

sys.modules[__name__] = prefix_cache
