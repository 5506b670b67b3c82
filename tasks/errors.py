"""The one error type of the suites: bad parameters or unusable data."""


class TaskError(ValueError):
    """A user error; the message says what is wrong and what to do."""
