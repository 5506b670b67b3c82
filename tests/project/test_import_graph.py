"""The import graph of ropebench's packages: layers point down only (extend <- tasks <- results; results reads
records, never tasks) and no module imports itself back through others. Lazy imports inside functions count:
they are edges all the same. The tools on top, benchmarks/ and scripts/ (installed as `ropebench`), may import
any layer; they are held to the same graph (no cycles), find their modules as packages (no `sys.path` edits)
and import nothing heavy at module level, so that `--help` and an import are instant. Nor does a layer reach
up by file path (`__file__`'s parents, another top-level folder's name). Reading results needs neither torch
nor transformers."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = {"extend": 0, "tasks": 1, "results": 1}  # results sits beside tasks: it may use extend, never tasks
ALLOWED_ACROSS = {("results", "extend")}
# Single modules a layer may import across: tasks declare what their metrics mean with results.meaning's
# `Metric` (the contract both sides read; it imports nothing of tasks and nothing heavy)
ALLOWED_MODULES = {("tasks", "results.meaning")}
# folder -> short name in this graph: every folder installs under `ropebench` (pyproject's package-dir:
# extend/ is `ropebench.extend`, scripts/ is `ropebench` itself); the graph names a layer's modules by the
# folder ("extend.patching") so the layer rules read as the folders do.
TOOLS = {"benchmarks": "benchmarks", "scripts": "ropebench"}
FOLDERS = {**{pkg: pkg for pkg in LAYER}, **TOOLS}
NAMESPACED = ("extend", "tasks", "results", "benchmarks")  # import names: ropebench.<folder>
# Third-party packages slow to import (torch alone: seconds) or that bring a model's machinery.
HEAVY = {
    "accelerate",
    "datasets",
    "gguf",
    "huggingface_hub",
    "lm_eval",
    "matplotlib",
    "numpy",
    "pandas",
    "safetensors",
    "scipy",
    "seaborn",
    "tokenizers",
    "torch",
    "transformers",
}


def _module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    parts = [FOLDERS[folder], *parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(folders) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files(FOLDERS)}


def _top(name: str) -> str:
    return name.split(".")[0]


def _is_module(target: str, known: set[str]) -> bool:
    head, _, rest = target.partition(".")
    if head == "ropebench" and rest.split(".")[0] in NAMESPACED:
        target = rest
    return target in known


def _import_module_target(node: ast.AST, package: str) -> str | None:
    """The module an `import_module(...)` call names, when its name is a literal: `import_module(".remap",
    __name__)` or `import_module("ropebench.extend.remap")` (a computed name, e.g. a plugin's, is no edge)."""
    if not (
        isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return None
    text = node.args[0].value
    if not text.startswith("."):  # absolute: the graph's short name (ropebench.extend.remap -> extend.remap)
        head, _, rest = text.partition(".")
        return rest if head == "ropebench" and rest.split(".")[0] in NAMESPACED else text
    level = len(text) - len(text.lstrip("."))
    base = package
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{text[level:]}" if text[level:] else base


def _imports_its_folder(node: ast.AST, path: Path) -> bool:
    """`for m in pkgutil.iter_modules(__path__): import_module(...)` in a package's __init__: an edge to every
    module of the folder."""
    return (
        path.name == "__init__.py"
        and isinstance(node, ast.For)
        and isinstance(node.iter, ast.Call)
        and getattr(node.iter.func, "attr", None) == "iter_modules"
        and any(
            getattr(c.func, "id", None) == "import_module" for c in ast.walk(node) if isinstance(c, ast.Call)
        )
    )


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
            if all(_is_module(f"{base}.{a.name}", known) for a in node.names):
                targets = targets[1:]  # `from . import x` (x a module) imports x, not the package's own names
        elif (module := _import_module_target(node, package)) is not None:
            targets = [module]  # import_module(".x", __name__): an import all the same
        elif _imports_its_folder(node, path):  # a package importing each module of its folder (tasks/)
            targets = [f"{name}.{p.stem}" for p in path.parent.glob("*.py") if p.name != "__init__.py"]
            targets += [f"{name}.{p.parent.name}" for p in path.parent.glob("*/__init__.py")]
        else:
            continue
        for target in targets:
            head, _, rest = target.partition(".")
            if isinstance(node, ast.Import) or (
                isinstance(node, ast.ImportFrom) and not node.level
            ):  # absolute
                if head == "ropebench" and rest.split(".")[0] in NAMESPACED:
                    target = rest  # ropebench.extend.errors -> extend.errors (the graph's short names)
                elif head in NAMESPACED:
                    target = f"bare:{target}"  # a top-level `extend`: not ropebench's (see the test below)
            while target and target not in known:  # `extend.errors.RopebenchError` -> extend.errors
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, path, set(modules)) for name, path in modules.items()}


def test_layers_import_only_downwards():
    """Between layers, imports point down; no layer imports the tools built on it (benchmarks, ropebench)."""
    upward = sorted(
        (a, b)
        for a, targets in _graph().items()
        if _top(a) in LAYER
        for b in targets
        if (_top(a), b) not in ALLOWED_MODULES
        and (
            _top(b) not in LAYER
            or (
                (_top(a), _top(b)) not in ALLOWED_ACROSS
                and LAYER[_top(b)] >= LAYER[_top(a)]
                and _top(a) != _top(b)
            )
        )
    )
    assert upward == []


def test_imports_name_the_ropebench_namespace():
    """ropebench installs one import name, `ropebench`: a bare `import tasks` or `from results import x` would
    find whatever `tasks` comes first on sys.path (a user's tasks.py in the working directory), or a second
    copy of ours beside the installed one (two registries)."""
    bare = [f"{where} {name}" for where, name in _absolute_imports() if name.split(".")[0] in NAMESPACED]
    assert bare == []


def _absolute_imports():
    """(file:line, module) for every absolute import in the repository's Python files, tests included."""
    for path in _files([*FOLDERS, "tests"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            yield from ((f"{path.relative_to(ROOT)}:{node.lineno}", name) for name in names)


def test_no_import_cycles():
    """Every module-to-module path is acyclic, `import_module` with a literal name counted. A package's
    __init__ re-exports its submodules (that is what it is for); a submodule importing a *name* of its own
    package's __init__ (a call back up, e.g. a registry asking the package to load the built-in methods) is
    an edge like any other, and closes a loop."""
    graph = _graph()
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
    """Guards the tests above against passing vacuously: known edges of each kind are found, in the layers and
    in the tools."""
    graph = _graph()
    assert "extend.registry" in graph["extend.patching"]  # relative, module level
    assert "extend.remap_attention" in graph["extend.patching"]  # relative, inside a function
    assert "extend.errors" in graph["tasks.errors"]  # absolute, across layers
    assert "results.meaning" in graph["tasks.kit"]  # the one allowed module across tasks -> results
    assert "benchmarks.figures" in graph["benchmarks.prefix_sharing"]  # absolute, within benchmarks
    assert "benchmarks.prefix_sharing" in graph["benchmarks.orchestrate"]
    assert "tasks.scoring" in graph["benchmarks.run"]  # inside a function
    assert "ropebench.sweep_lib.config" in graph["ropebench.sweep_lib.cli"]  # scripts/, relative


def test_tools_find_their_modules_as_packages():
    """benchmarks/ and scripts/ are packages (`ropebench bench ...`, `ropebench ...`): no file edits
    `sys.path` to find its neighbours (an edit there also decides which `tasks` every later import finds)."""
    edits = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _files(TOOLS)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert edits == []


def _module_level_imports(tree: ast.Module):
    """Import statements that run when the module is imported: not those inside a function."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def test_tools_import_nothing_heavy_at_module_level():
    """Heavy third-party packages (torch, transformers, lm-eval, ...) are imported inside the function that
    needs them, so `--help`, a bad flag or an import answers at once. The layers (extend, tasks, results) may
    be imported at module level: what they load is theirs to keep light."""
    heavy = []
    for path in _files(TOOLS):
        if path.is_relative_to(ROOT / "scripts" / "integrations"):
            continue  # an integration subclasses the tool's classes (HFLM): its command imports it on use
        for node in _module_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # relative: a project module
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            heavy += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if _top(n) in HEAVY]
    assert heavy == []


def test_importing_any_benchmark_module_loads_and_runs_nothing():
    """Every module under benchmarks/ (probes and `__main__` included) imports with torch and every other
    heavy package blocked, and prints nothing: so none loads a model or starts work on import. Run from the
    repository root as `python -m ropebench.benchmarks` is."""
    names = sorted(f"ropebench.{name}" for name in _modules() if _top(name) == "benchmarks")
    code = (
        "import importlib, importlib.abc, sys\n"
        "heavy = set(sys.argv[1].split(','))\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in heavy:\n"
        "            raise ImportError(f'{name} imported while importing a benchmark module')\n"
        "sys.meta_path.insert(0, Block())\n"
        "for name in sys.argv[2:]:\n"
        "    importlib.import_module(name)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, ",".join(sorted(HEAVY)), *names],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == ""
    assert {
        "ropebench.benchmarks.cli",
        "ropebench.benchmarks.run",
        "ropebench.benchmarks.probes.passkey_floor",
    } <= set(names)


def test_every_project_import_resolves():
    """Lazy imports fail only when their function runs, so a renamed or removed module (once: a benchmark's
    `from tasks import prefix_cache`) would pass every test that skips that path. Each `from <ours> import
    name` anywhere in the repository must name a real module or attribute."""
    import importlib
    import importlib.util

    ours = {"ropebench"}
    broken = []
    for folder in ("extend", "tasks", "results", "scripts", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and node.module
                    and node.module.split(".")[0] in ours
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


def _package_dirs() -> dict[str, Path]:
    """pyproject.toml's `package-dir`, read as a static tool would: import name -> folder."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in table.items()}


def _static_file(module: str, dirs: dict[str, Path]) -> Path | None:
    """The file `module` is, from the files and pyproject.toml alone (no import, no install): the longest
    declared package that prefixes it, then one folder per dotted part."""
    for package in sorted(dirs, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            path = dirs[package].joinpath(*module[len(package) :].split(".")[1:])
            for candidate in (path / "__init__.py", path.with_suffix(".py")):
                if candidate.is_file():
                    return candidate
            return path if path.is_dir() else None  # a namespace package (a data folder: lm_eval_tasks)
    return None


def test_every_ropebench_import_resolves_statically_to_a_checkout_file():
    """Every `ropebench.*` a file of the repository imports names a file of the checkout, found from the
    files alone through pyproject.toml's package-dir, as a reader or a static tool finds it
    (docs/layout.md#import-names); `from ropebench.x import y` names module x (y: a submodule or a name)."""
    dirs = _package_dirs()
    ours = [(where, name) for where, name in _absolute_imports() if name.split(".")[0] == "ropebench"]
    unresolved = [f"{where} {name}" for where, name in ours if _static_file(name, dirs) is None]
    assert unresolved == []
    assert len(ours) > 200  # guards against passing vacuously
    assert _static_file("ropebench.sweep_lib.rundir", dirs) == ROOT / "scripts" / "sweep_lib" / "rundir.py"
    assert _static_file("ropebench.extend", dirs) == ROOT / "extend" / "__init__.py"


def test_the_editable_install_is_a_link_tree_static_tools_follow():
    """scripts/setup.sh installs ropebench editable in setuptools' strict mode: a folder on sys.path (via a
    .pth file, which editors and static analysers read) holding `ropebench/...`, each file a link to the
    checkout's file, so that go-to-definition on `ropebench.extend.patching` opens extend/patching.py. Every
    module of the package folders is there (setup.sh re-installs when a file is added or removed)."""
    import site

    trees = [
        Path(line.strip())
        for pth in Path(site.getsitepackages()[0]).glob("__editable__.ropebench-*.pth")
        for line in pth.read_text().splitlines()
        if line.strip() and not line.startswith(("import", "#"))
    ]
    if not trees:
        pytest.skip("ropebench is not installed editable here (a wheel, or an install other than setup.sh's)")
    (tree,) = trees
    dirs = _package_dirs()
    missing = []
    for package, folder in dirs.items():  # sibling folders (none inside another)
        for source in folder.rglob("*.py"):
            link = tree.joinpath(*package.split("."), source.relative_to(folder))
            if "__pycache__" not in source.parts and not (link.is_file() and link.resolve() == source):
                missing.append(str(source.relative_to(ROOT)))
    assert missing == [], "re-run bash scripts/setup.sh: files not in the editable tree"
    assert (tree / "ropebench" / "extend" / "patching.py").resolve() == ROOT / "extend" / "patching.py"


# ---------------------------------------------------------------------------------------------- the tests
def test_tests_share_code_through_fixtures_only():
    """No test file imports another test file or a conftest (pytest imports those itself; importing them again
    runs a second copy): helpers shared between files are fixtures, in the conftest.py of the folder that
    shares them."""
    shared = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ("conftest", "tests") or top.startswith("test_"):
                    shared.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert shared == []


def test_test_folders_shadow_no_package():
    """tests/extend/, tests/tasks/, tests/results/ and tests/lm_eval/ share their names with packages: pytest
    runs with --import-mode=importlib (pyproject.toml), so no test folder is on sys.path and an import in a
    test is the real package."""
    import importlib

    tests = ROOT / "tests"
    assert not [p for p in sys.path if p and Path(p).resolve().is_relative_to(tests)], sys.path
    for name in NAMESPACED:
        module_file = Path(importlib.import_module(f"ropebench.{name}").__file__)
        assert module_file.resolve() == ROOT / name / "__init__.py", name  # a link of the editable tree
    import lm_eval

    assert not Path(lm_eval.__file__).resolve().is_relative_to(tests)
    assert hasattr(lm_eval, "simple_evaluate")


# ---------------------------------------------------------------------------------------------- reads by path
# Top-level entries of the repository a layer might reach by path instead of by import.
TOP_LEVEL = {
    "extend",
    "tasks",
    "results",
    "scripts",
    "benchmarks",
    "tests",
    "docs",
    "README.md",
    "pyproject.toml",
}
PATH_CALLS = {"Path", "PurePath", "open", "joinpath"}


def _levels_up(node) -> int | None:
    """How many folders above `__file__` a path expression climbs (`Path(__file__).resolve().parents[1]`: 2),
    or None when it does not start at `__file__`."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else None
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _levels_up(node.value)
        return None if inner is None else inner + 1
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        inner = _levels_up(node.value.value)
        return None if inner is None else inner + node.slice.value + 1
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute"):
            return _levels_up(func.value)
        if isinstance(func, ast.Name) and func.id in ("Path", "PurePath") and node.args:
            return _levels_up(node.args[0])
    return None


def _path_strings(node) -> list[str]:
    """String constants used as path parts: arguments of Path(), open(), joinpath(); operands of `/`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        parts = [node.left, node.right]
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        parts = list(node.args) if name in PATH_CALLS else []
    else:
        parts = []
    return [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]


def reads_by_path(path: Path, text: str | None = None) -> list[str]:
    """Where a module of a layer reaches a file outside its own package by path: a `__file__`-relative path
    climbing above the package's folder, or a path part naming another top-level entry of the repository.
    `text`: the module's source, when not the file's."""
    rel = path.relative_to(ROOT)
    depth = len(rel.parts) - 1  # folders from the file up to its package's folder
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        levels = _levels_up(node)
        if levels is not None and levels > depth:
            found.append(f"{rel}:{node.lineno} climbs {levels} folders above __file__")
        for part in _path_strings(node):
            top = part.strip("/").split("/")[0]
            if top in TOP_LEVEL and top != rel.parts[0]:
                found.append(f"{rel}:{node.lineno} reads {part!r}")
    return found


def test_layers_read_no_files_of_the_layers_above_by_path():
    """An import is not the only way up: a path built from `__file__` (extend/lm_eval.py, the lm-eval adapter
    before it moved to scripts/integrations/, once found tasks/lm_eval_tasks so) or naming another top-level
    folder (extend/docs.py read scripts/configs/demo.yaml and the README) ties the core to the tree above it.
    A layer reads only its own package's files; what it needs from above, the caller passes (`ropebench
    lm-eval` hands integrations.lm_eval the task folder)."""
    assert [hit for path in _files(LAYER) for hit in reads_by_path(path)] == []


@pytest.mark.parametrize(
    ("source", "hits"),
    [
        ('TASKS = Path(__file__).resolve().parent.parent / "tasks" / "lm_eval_tasks"\n', 2),
        ('ROOT = Path(__file__).resolve().parents[1]\nDEMO = ROOT / "scripts/configs/demo.yaml"\n', 2),
        ('README = open("README.md")\n', 1),
        ('OWN = Path(__file__).parent / "lm_eval_tasks" / "utils.py"\n', 0),
    ],
    ids=["parent.parent", "parents[1]", "open", "own folder"],
)
def test_reads_by_path_are_seen(source, hits):
    """Guards the test above against passing vacuously: the old forms of both reaches are found (as if in
    extend/), a package's own files are not."""
    assert len(reads_by_path(ROOT / "extend" / "probe.py", source)) == hits, reads_by_path(
        ROOT / "extend" / "probe.py", source
    )


# -------------------------------------------------------------------------------------------- no model stack
BLOCK_MODEL_STACK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError(f'{name} imported while reading results')
sys.meta_path.insert(0, Block())
"""


def test_results_read_without_torch_or_transformers(tmp_path, synthetic_records):
    """`import results`, reading a run (load, summary, a table), the error classes every layer shares and
    `ropebench report --help` work with torch and transformers blocked: reading results does not load the
    model stack (extend's names load on first use; extend.errors imports nothing)."""
    from ropebench.results.store import RecordWriter

    RecordWriter(tmp_path / "run").write(synthetic_records("run", tasks=("perplexity", "passkey")))
    code = BLOCK_MODEL_STACK + (
        "from ropebench import results\n"
        "import ropebench.results.store\n"
        "from ropebench.extend import ExtendError, RopebenchError\n"
        "assert issubclass(results.ResultsError, RopebenchError)\n"
        "assert issubclass(ExtendError, RopebenchError)\n"
        "df = results.load(sys.argv[1])\n"
        "assert len(df) and len(results.summary(df, with_ci=False)) == 4\n"
        "assert len(results.table(df, 'perplexity', 'ppl'))\n"
        "from ropebench.cli import main\n"
        "try:\n"
        "    main(['report', '--help'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('read without', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RUN_DIR" in out.stdout and out.stdout.strip().endswith("read without []"), out.stdout[-2000:]


def test_extend_names_load_on_first_use():
    """extend/__init__ is lazy: the README's names resolve (and register the built-in methods on first use), a
    submodule is an attribute after a plain `from ropebench import extend`, and an unknown name is an
    AttributeError."""
    code = (
        "import sys\n"
        "from ropebench import extend\n"
        "assert 'torch' not in sys.modules\n"
        "assert {'yarn', 'pi', 'self-extend'} <= set(extend.methods())\n"
        "for name in extend.__all__:\n"
        "    getattr(extend, name)\n"
        "assert callable(extend.loading.gguf_snapshot) and callable(extend.registry.get)\n"
        "try:\n"
        "    extend.nosuch\n"
        "except AttributeError as e:\n"
        "    print('ok', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok ") and "nosuch" in out.stdout


@pytest.mark.parametrize(
    "folder, right",
    [(f, f"from ropebench import {f}") for f in NAMESPACED] + [("scripts", "import ropebench")],
)
def test_a_folder_imported_by_its_bare_name_fails_with_the_right_import(folder, right):
    """From the checkout root a folder is importable by its bare name; it must refuse at once and name the
    import that gives the one copy the sweep uses (a second module tree would hide a registered method)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {folder}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    package = "ropebench" if folder == "scripts" else f"ropebench.{folder}"
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"ImportError: {folder!r} is the folder of `{package}`: write `{right}`"


@pytest.mark.parametrize("folder", ["sweep_lib", "integrations"])
def test_a_package_of_scripts_imported_by_its_bare_name_fails_too(folder):
    """`python scripts/sweep.py` (accelerate's form) puts scripts/ on sys.path: its packages refuse a bare
    import as the layers do (a second copy of the lm-eval adapter would register the model twice)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {folder}"],
        cwd=ROOT / "scripts",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0
    right = f"from ropebench import {folder}"
    assert last == f"ImportError: {folder!r} is the folder of `ropebench.{folder}`: write `{right}`"


def test_python_dash_m_ropebench_is_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "ropebench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: ropebench COMMAND")


def test_large_modules_say_why_they_are_large():
    """Rooms stay small (issue 39): a module of the package folders above 600 lines states, in its docstring,
    why it is one module ("Its size (...)")."""
    large = []
    for path in _files(FOLDERS):
        text = path.read_text()
        if text.count("\n") > 600 and "Its size (" not in (ast.get_docstring(ast.parse(text)) or ""):
            large.append(str(path.relative_to(ROOT)))
    assert large == []
