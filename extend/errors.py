"""ropebench's user-error classes. Every layer's error derives from RopebenchError,
so a CLI catches one thing. This module imports nothing heavy (and `extend/__init__` loads its other names on
first use), so every layer, results included, imports it without torch or transformers."""


class RopebenchError(ValueError):
    """A user error anywhere in ropebench: the message says what is wrong and what to do (one line)."""


class ExtendError(RopebenchError):
    """A user error in the core (methods, patching, loading)."""


def closest(name, choices, what: str) -> str:
    """The hint for an unknown name: 'did you mean a, b?' when some choices are close,
    else every valid one."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}?"
    return f"valid {what}: {', '.join(sorted(map(str, choices)))}"
