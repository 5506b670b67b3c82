"""`ropebench inspect MODEL [--method M --factor S -o KEY=VALUE ...]` (also `ropebench inspect ...`):
a model's RoPE per layer type and what a method would change. Reads the config only (no weights). Bad input:
one line, exit code 2."""

from __future__ import annotations

import argparse
import sys

from .flags import add_setting


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message} — run `ropebench inspect --help`", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None) -> int:
    parser = _Parser(prog="ropebench", description="ropebench RoPE tools")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("inspect", help="show a model's RoPE per layer type (and what a method changes)")
    add_setting(p, method_help="RoPE method to preview, e.g. yarn", options_example="start_from=shipped")
    p.add_argument("--trust-remote-code", action="store_true")
    args = parser.parse_args(argv)

    from ropebench import extend
    from ropebench.extend.inspector import skeleton
    from ropebench.extend.values import parse_text

    try:
        options = {}
        for item in args.option:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise extend.ExtendError(f"option {item!r} is not KEY=VALUE — e.g. -o start_from=shipped")
            options[key] = parse_text(value, f"-o {key}")  # extend.values' rules, as the sweep's -o
        if options and not args.method:
            raise extend.ExtendError("options need --method — e.g. --method yarn --factor 2 -o beta_fast=16")
        config = extend.loading.load_config(args.model, trust_remote_code=args.trust_remote_code)
        print(extend.inspect(skeleton(config), args.method, args.factor, **options))
    except extend.RopebenchError as e:  # every layer's user error, not only the core's
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
