"""Text -> typed value: the one set of rules for every place ropebench reads a value written as text — the
sweep's `-o`/`-t`/`--lengths`/`--factors`/`--seed`, the plain (unquoted) scalars of its YAML config, lm-eval
`model_args` and the report's flags. docs/sweeps.md ("How text becomes a value") has the table: none/null/~
-> None, true/false, decimal ints (010 is 10), 16k -> 16384, floats (1e5 is 100000.0), YAML flow lists and
mappings, quoted text; anything else (yes, no, 0x10, inf, 1.5k, yarn) stays the text.

YAML 1.1 (PyYAML) reads some of these otherwise (no -> False, 1e5 -> '1e5', 0x10 -> 16, 010 -> 8, a date ->
a date); `ValueLoader` reads a config's plain scalars by these rules instead, so a YAML file and the command
line give the same value for the same text. Where a whole number is expected (`as_int`, `as_length`), a whole
float counts: 1e5 is a length of 100000 tokens.

Bad text raises `ValueTextError` with one line: `WHERE: VALUE is not WHAT — write e.g. EXAMPLE`.
Imports only PyYAML and extend.errors (no torch), so every layer uses it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml
from ropebench.extend.errors import ExtendError

KILO = 1024  # 16k = 16 x 1024 tokens
NONE_WORDS = ("", "none", "null", "~")
BOOL_WORDS = {"true": True, "false": False}
_INT = re.compile(r"[+-]?\d+")
_KILO = re.compile(r"([+-]?\d+)[kK]")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")


class ValueTextError(ExtendError):
    """A value that is not what its place needs: `WHERE: VALUE is not WHAT — write e.g. EXAMPLE`."""


def not_value(where: str, value, what: str, example: str) -> ValueTextError:
    """The one message shape for a bad value (text as written is shown quoted, a typed value as it is)."""
    return ValueTextError(f"{where}: {value!r} is not {what} — write e.g. {example}")


def parse_text(text, where: str = "value") -> Any:
    """`text` as a typed value by the rules above; a value that is not a string is returned as it is (it was
    typed already: YAML, JSON, the Python API). Raises ValueTextError only for a list or mapping that does not
    parse (`[1, 2`)."""
    if not isinstance(text, str):
        return text
    t = text.strip()
    low = t.lower()
    if low in NONE_WORDS:
        return None
    if low in BOOL_WORDS:
        return BOOL_WORDS[low]
    try:
        if _INT.fullmatch(t):
            return int(t)
        if kilo := _KILO.fullmatch(t):
            return int(kilo[1]) * KILO
    except ValueError:  # more digits than Python converts (4300)
        raise not_value(where, t[:12] + "...", "a number of a usable size", "4096 or 16k") from None
    if _FLOAT.fullmatch(t):
        return float(t)
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t[:1] in ("[", "{"):
        return _flow(t, where)
    return t


def _flow(text: str, where: str):
    """`[a, b]` / `{k: v}` as YAML flow, each plain item by parse_text (through ValueLoader)."""
    kind, example = ("a list", "[1, 2]") if text[0] == "[" else ("a mapping", "{a: 1, b: 2}")
    try:
        value = yaml.load(text, Loader=ValueLoader)  # ValueLoader is a SafeLoader
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or "it does not parse"
        raise not_value(where, text, f"{kind} ({problem})", f"{example}, or quote it for text") from None
    if not isinstance(value, (list, dict)):
        raise not_value(where, text, kind, f"{example}, or quote it for text")
    return value


class ValueLoader(yaml.SafeLoader):
    """yaml.SafeLoader whose plain (unquoted) scalars are read by `parse_text`, not by YAML 1.1's rules;
    quoted scalars stay strings. Config files are read with it (scripts/sweep_lib/config.py)."""


ValueLoader.yaml_implicit_resolvers = {  # only `<<` (merge) keeps a YAML meaning; the rest is parse_text's
    first: [(tag, rx) for tag, rx in resolvers if tag == "tag:yaml.org,2002:merge"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _scalar(loader: ValueLoader, node: yaml.ScalarNode):
    text = loader.construct_scalar(node)
    return text if node.style else parse_text(text, f"line {node.start_mark.line + 1}")


ValueLoader.add_constructor("tag:yaml.org,2002:str", _scalar)


# ------------------------------------------------------------------------- where a kind of value is needed
def as_int(value, where: str, example: str, minimum: int | None = None) -> int:
    """An integer from text (by the rules) or a value; a whole float counts (1e5 -> 100000), and so does
    quoted text ('16k': where a number is needed, text can only mean one)."""
    v = parse_text(parse_text(value, where), where)
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise not_value(where, value, "an integer", example)
    if minimum is not None and v < minimum:
        raise not_value(where, value, _at_least(minimum), example)
    return v


def as_length(value, where: str, example: str = "4096 or 16k") -> int:
    """A positive whole number of tokens: 4096, 16k, 1e5."""
    return as_int(value, where, example, minimum=1)


def as_number(value, where: str, example: str, low: float | None = None, high: float | None = None) -> float:
    """A finite number from text (by the rules, quoted text too) or a value, within [low, high] if given."""
    v = parse_text(parse_text(value, where), where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise not_value(where, value, "a finite number", example)
    if (low is not None and v < low) or (high is not None and v > high):
        if low is not None and high is not None:
            what = f"from {low:g} to {high:g}"
        else:
            what = f"{low:g} or more" if low is not None else f"{high:g} or less"
        raise not_value(where, value, what, example)
    return float(v)


def _at_least(minimum: int) -> str:
    return {0: "zero or more", 1: "positive"}.get(minimum, f"{minimum} or more")
