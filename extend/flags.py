"""Command-line flags given once: argparse keeps the last value of a flag given twice and drops the first
without a word (`--trials 2 --trials 8` ran 8). `refuse_repeats(parser)` makes every single-value flag of a
parser (and of the subparsers made after the call) refuse a second value with one line; flags that collect
values (`action="append"`) and switches keep argparse's behaviour. Imports only argparse."""

from __future__ import annotations

import argparse


class StoreOnce(argparse._StoreAction):
    """`store`, refused when the flag was already given in this parse (the parser counts per parse)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:
            given = namespace.__dict__.setdefault("_flags_given", set())
            if self.dest in given:
                parser.error(
                    f"{option_string} is given twice — give it once (a list flag takes every value after one "
                    f"{option_string})"
                )
            given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


def refuse_repeats(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register `StoreOnce` as `parser`'s default action (call before add_argument); returns `parser`."""
    parser.register("action", None, StoreOnce)
    parser.register("action", "store", StoreOnce)
    return parser


def forget_given(args: argparse.Namespace) -> argparse.Namespace:
    """`args` without the bookkeeping `StoreOnce` keeps in it."""
    args.__dict__.pop("_flags_given", None)
    return args


def add_setting(
    parser: argparse.ArgumentParser, *, method_help: str, options_example: str, method_required: bool = False
) -> None:
    """The flags that name a model and a RoPE setting, as `ropebench inspect` and `ropebench export` take
    them: MODEL, --method, --factor, -o KEY=VALUE (values as the sweep's -o)."""
    parser.add_argument("model", help="hub id, local directory, .gguf file or smollm2-135m")
    parser.add_argument("--method", required=method_required, help=method_help)
    parser.add_argument("--factor", type=float, default=1.0, help="scale factor (default 1)")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"method/common option, e.g. {options_example} (values as the sweep's -o)",
    )
