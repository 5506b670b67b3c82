"""User errors of the benchmark commands: one line `error: ...` and exit code 2, never a traceback.

Every command parses its arguments with `ArgumentParser` (a mistake raises BenchmarkError) and runs through
`exit_code`: benchmarks/cli.py does that for `ropebench bench NAME`, each probe's `__main__` guard for
`python -m ropebench.benchmarks.probes.NAME`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ropebench.extend.errors import RopebenchError  # imports nothing heavy (extend loads its names lazily)
from ropebench.extend.flags import forget_given, refuse_repeats


class BenchmarkError(RopebenchError):
    """A user error of a benchmark command (bad flag value, unusable JSON): one line, exit 2."""


class ArgumentParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        refuse_repeats(self)  # `--trials 2 --trials 8`: one line, not the first value dropped

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        return forget_given(parsed), extra

    def add_argument(self, *args, **kwargs):
        kind = kwargs.get("type")
        if kind is int or getattr(kind, "bounded", True) is False:
            raise TypeError(
                f"{args[0]}: an integer flag needs a cost bound — declare it with at_least(..., high=)"
            )
        return super().add_argument(*args, **kwargs)

    def error(self, message):  # argparse would print the whole usage, then exit on its own
        raise BenchmarkError(f"{message} — run `{self.prog} --help` for usage")


def at_least(low: int, example: int | None = None, *, high: int | None = None, cost: str = ""):
    """An argparse `type=` for integers >= `low`: `--length -5` is refused while parsing, before any model
    loads, as "argument --length: must be an integer >= 2, got -5 (e.g. 4096) — run `... --help` ...".
    `high`: a cost bound (`cost`: what one unit costs), named in the message of a value above it."""

    def check(text: str) -> int:
        value = int(text)  # not an integer: argparse's own "invalid int value: 'many'"
        if value < low:
            what = "a positive integer" if low == 1 else f"an integer >= {low}"
            hint = f" (e.g. {example})" if example is not None else ""
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}{hint}")
        if high is not None and value > high:
            why = f" ({cost})" if cost else ""
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, its cost bound{why}, got {text!r}")
        return value

    check.__name__ = "int"  # what argparse names in "invalid int value"
    check.bounded = high is not None
    return check


# Every integer flag sets a size (of a forward, a sample, a repetition): each has a cost bound, checked while
# parsing, so a typo of 10^12 is refused at once instead of running for days (ArgumentParser refuses to
# declare an unbounded integer flag).
MAX_TOKENS = 1 << 20


def forward_tokens(example: int) -> Callable[[str], int]:
    """Tokens of one forward: 2 to MAX_TOKENS."""
    return at_least(2, example, high=MAX_TOKENS, cost="tokens of one forward")


def count(example: int, high: int, cost: str) -> Callable[[str], int]:
    """A positive count up to its cost bound (`cost`: what one unit costs)."""
    return at_least(1, example, high=high, cost=cost)


REPEATS = count(3, 100, "each repeat runs the whole measurement again")


def fraction(text: str) -> float:
    """An argparse `type=` for a number in [0, 1] (a depth, a share): `--depths 2.0` is refused while
    parsing."""
    value = float(text)  # not a number: argparse's own "invalid float value: 'x'"
    if not 0.0 <= value <= 1.0:  # nan fails too
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r} (e.g. 0.5)")
    return value


fraction.__name__ = "float"


def check_json_path(path: str | None, flag: str = "--json") -> None:
    """A file a benchmark writes at its end: its directory must exist now, not after an hour of measuring."""
    if path is None:
        return
    where = Path(path).expanduser()
    if where.is_dir():
        raise BenchmarkError(f"{flag} {path} is a directory — give a file name, e.g. {flag} out.json")
    if not where.parent.is_dir():
        raise BenchmarkError(
            f"{flag} {path}: directory {where.parent} does not exist — create it first or pick another path"
        )
    from ropebench.extend.owned_paths import check_loose_file

    check_loose_file(where, flag, BenchmarkError)  # new, or one ropebench wrote and nobody changed since


def exit_code(main, argv: list[str] | None) -> int:
    """`main(argv)` as an exit code. Bad input (BenchmarkError, or a RopebenchError from extend, tasks or
    results) prints one line and gives 2; `--help` gives 0; a failed benchmark child prints its message and
    gives 1."""
    try:
        return main(argv) or 0
    except RopebenchError as e:  # BenchmarkError and every layer's user error
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
