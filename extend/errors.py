"""ropebench's user-error classes. Every layer's error derives from RopebenchError, so a CLI catches one thing."""


class RopebenchError(ValueError):
    """A user error anywhere in ropebench: the message says what is wrong and what to do (one line)."""


class ExtendError(RopebenchError):
    """A user error in the core (methods, patching, loading)."""
