"""The one exception type for user errors in ropebench's core."""


class ExtendError(ValueError):
    """A user error: the message says what is wrong and what to do."""
