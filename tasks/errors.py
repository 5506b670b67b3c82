"""The one error type of the tasks: bad parameters or unusable data."""

from ropebench.extend.errors import RopebenchError


class TaskError(RopebenchError):
    """A user error; the message says what is wrong and what to do."""
