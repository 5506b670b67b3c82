"""docs/CONTRACTS.md against the code: every documented signature matches the real one (names, order, kinds,
defaults, return annotation), the public functions are all documented, and the record keys and the row schema
are the ones the code writes."""

import ast
import importlib
import inspect
import math
import re
from pathlib import Path

import pytest
from ropebench import extend, results, tasks
from ropebench.tasks.common import record

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "CONTRACTS.md"
TEXT = CONTRACTS.read_text(encoding="utf-8")
# A backticked `package.name(...)` or `package.name(...) -> annotation`.
SIGNATURE = re.compile(r"`((?:extend|tasks|results)(?:\.\w+)+)\((.*?)\)(?:\s*->\s*([^`]+))?`")
DOCUMENTED = {m.group(1): m for m in SIGNATURE.finditer(TEXT)}
P = inspect.Parameter
EMPTY = P.empty


def resolve(dotted: str):
    """The object a dotted name documents, and whether it is a method looked up on its class."""
    first, *rest = dotted.split(".")
    obj = importlib.import_module(f"ropebench.{first}")  # the one copy (a bare `extend` is refused)
    owner = None
    for part in rest:
        owner, obj = obj, getattr(obj, part)
    return obj, inspect.isclass(owner)


def default_value(node: ast.expr):
    """A documented default: a literal, or a name under `math` (e.g. math.inf)."""
    return eval(compile(ast.Expression(node), "CONTRACTS.md", "eval"), {"__builtins__": {}, "math": math})


def documented_parameters(text: str) -> list[tuple[str, inspect._ParameterKind, object]]:
    """(name, kind, default) of a documented parameter list, read as the parameters of a Python def."""
    args = ast.parse(f"def f({text}): pass").body[0].args
    positional = args.posonlyargs + args.args
    defaults = [EMPTY] * (len(positional) - len(args.defaults)) + [default_value(d) for d in args.defaults]
    out = [(a.arg, P.POSITIONAL_OR_KEYWORD, d) for a, d in zip(positional, defaults, strict=True)]
    if args.vararg:
        out.append((args.vararg.arg, P.VAR_POSITIONAL, EMPTY))
    out += [
        (a.arg, P.KEYWORD_ONLY, EMPTY if d is None else default_value(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        out.append((args.kwarg.arg, P.VAR_KEYWORD, EMPTY))
    return out


def real_parameters(obj, is_method: bool) -> list[tuple[str, inspect._ParameterKind, object]]:
    params = list(inspect.signature(obj).parameters.values())
    if is_method and params and params[0].name == "self":
        params = params[1:]
    # the docs do not mark positional-only parameters
    return [
        (p.name, P.POSITIONAL_OR_KEYWORD if p.kind == P.POSITIONAL_ONLY else p.kind, p.default)
        for p in params
    ]


def same_default(doc, real) -> bool:
    if doc is EMPTY or real is EMPTY:
        return doc is real
    return type(doc) is type(real) and doc == real


def test_contracts_document_the_core_of_every_layer():
    expected = {
        "extend.load",
        "extend.patch",
        "extend.patched",
        "extend.register",
        "tasks.perplexity.run",
        "tasks.passkey.run",
        "tasks.classification.run",
        "results.load",
        "results.RecordWriter",
        "results.table",
        "results.report",
    }
    assert expected <= set(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_documented_signature_matches_the_code(name):
    match = DOCUMENTED[name]
    obj, is_method = resolve(name)
    doc = documented_parameters(match.group(2))
    real = real_parameters(obj, is_method)
    assert [(n, k) for n, k, _ in doc] == [(n, k) for n, k, _ in real], (
        f"{name}: parameters differ from the code"
    )
    for (param, _, d), (_, _, r) in zip(doc, real, strict=True):
        assert same_default(d, r), f"{name}: default of {param} is documented as {d!r}, the code has {r!r}"
    annotation = inspect.signature(obj).return_annotation
    if match.group(3) and annotation is not inspect.Signature.empty:
        assert match.group(3).replace(" ", "") == str(annotation).replace(" ", ""), (
            f"{name}: return annotation"
        )


def public_functions(module) -> set[str]:
    return {
        f"{module.__name__.removeprefix('ropebench.')}.{n}"
        for n in module.__all__
        if inspect.isfunction(getattr(module, n))
    }


def test_every_public_function_is_documented():
    missing = (public_functions(extend) | public_functions(results)) - set(DOCUMENTED)
    assert not missing, f"add to docs/CONTRACTS.md: {sorted(missing)}"
    assert {f"tasks.{name}.run" for name in tasks.TASKS} <= set(DOCUMENTED)


def backticked_list(start: str) -> list[str]:
    span = re.search(rf"`({re.escape(start)}[^`]*)`", TEXT)
    assert span, f"docs/CONTRACTS.md lacks the list starting {start!r}"
    return [s.strip() for s in span.group(1).split(",")]


def test_record_keys_and_row_schema_are_the_codes():
    assert backticked_list("task, corpus,") == list(record("t", "c", 1, "m", 0.0, 1, 0.0, {}))
    assert backticked_list("run, cell,") == list(results.SCHEMA)
