"""The import graph of ropebench's packages: layers point down only (extend <- tasks <- results; results reads
records, never suites) and no module imports itself back through others. Lazy imports inside functions count:
they are edges all the same."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"extend": 0, "tasks": 1, "results": 1}  # results sits beside tasks: it may use extend, never tasks
ALLOWED_ACROSS = {("results", "extend")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in LAYER for p in (ROOT / pkg).rglob("*.py")}


def _edges(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its source (module-level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            base = (
                f"{base}.{node.module}"
                if node.level and node.module
                else (base if node.level else node.module)
            )
            targets = [base] + [f"{base}.{a.name}" for a in node.names]  # `from . import x` names module x
        else:
            continue
        for target in targets:
            while target and target not in known:  # `extend.errors.RopebenchError` -> extend.errors
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, set(modules)) for name, path in modules.items()}


def test_layers_import_only_downwards():
    upward = sorted(
        (a, b)
        for a, targets in _graph().items()
        for b in targets
        if (a.split(".")[0], b.split(".")[0]) not in ALLOWED_ACROSS
        and LAYER[b.split(".")[0]] >= LAYER[a.split(".")[0]]
        and a.split(".")[0] != b.split(".")[0]
    )
    assert upward == []


def test_no_import_cycles():
    """Package __init__ modules re-export their submodules (that is what they are for), so a submodule importing
    its own package's __init__ is not counted; every other module-to-module path must be acyclic."""
    graph = _graph()
    for name in graph:
        graph[name] = {t for t in graph[name] if not (t in LAYER and name.startswith(t + "."))}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_graph_sees_lazy_and_relative_imports():
    """Guards the two tests above against passing vacuously: known edges of each kind are found."""
    graph = _graph()
    assert "extend.registry" in graph["extend.patching"]  # relative, module level
    assert "extend.remap_attention" in graph["extend.patching"]  # relative, inside a function
    assert "extend.errors" in graph["tasks.errors"]  # absolute, across layers


def test_every_project_import_resolves():
    """Lazy imports fail only when their function runs, so a renamed or removed module (once: a benchmark's
    `from tasks import prefix_cache`) would pass every test that skips that path. Each `from <ours> import name`
    anywhere in the repository must name a real module or attribute."""
    import importlib
    import importlib.util

    broken = []
    for folder in ("extend", "tasks", "results", "scripts", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and node.module
                    and node.module.split(".")[0] in LAYER
                ):
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not (
                        hasattr(module, alias.name)
                        or importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                    ):
                        broken.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {alias.name}"
                        )
    assert broken == []
