"""User errors of the benchmark commands: one line `error: ...` and exit code 2, never a traceback.

Every command parses its arguments with `ArgumentParser` (a mistake raises BenchmarkError) and runs through
`exit_code`: benchmarks/cli.py does that for `python -m benchmarks NAME`, each probe's `__main__` guard for
`python -m benchmarks.probes.NAME`.
"""

from __future__ import annotations

import argparse
import sys


class BenchmarkError(Exception):
    """A user error of a benchmark command (bad flag value, unusable JSON): one line, exit 2. Not derived from
    extend's RopebenchError because importing extend loads torch, and importing a benchmark module must not;
    `exit_code` treats the two alike."""


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the whole usage, then exit on its own
        raise BenchmarkError(f"{message} — run `{self.prog} --help` for usage")


def exit_code(main, argv: list[str] | None) -> int:
    """`main(argv)` as an exit code. Bad input (BenchmarkError, or a RopebenchError from extend, tasks or
    results) prints one line and gives 2; `--help` gives 0; a failed benchmark child prints its message and
    gives 1."""
    try:
        return main(argv) or 0
    except BenchmarkError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except Exception as e:
        errors = sys.modules.get("extend.errors")  # imported whenever one of its errors was raised
        if errors is None or not isinstance(e, errors.RopebenchError):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
