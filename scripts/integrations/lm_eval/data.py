"""The data an lm-eval task reads, checked before the model loads: offline, a task whose data is neither
cached nor local is refused with one line instead of a traceback after the load."""

from __future__ import annotations

import ast
import contextlib
import os
from pathlib import Path

from ropebench.extend.errors import RopebenchError

# --- data a task reads, checked before the model loads ----------------------------------------------------

# Names `datasets.load_dataset` builds from local files (a `dataset_path` that is not a hub dataset).
LOCAL_BUILDERS = {"", "json", "csv", "parquet", "text", "arrow", "pandas", "xml", "webdataset"}
# lm-eval's RULER generators (`custom_dataset:`, with `dataset_path: ""`) fetch their data themselves: the
# essay haystack is this hub dataset (lm_eval/tasks/ruler/prepare_niah.get_haystack("essay")).
ESSAY_DATASET = "baber/paul_graham_essays"
TRUE = ("1", "true", "yes", "on")


def offline() -> bool:
    """HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set: nothing is downloaded, only caches are read."""
    return any(os.environ.get(k, "").lower() in TRUE for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def dataset_cached(repo_id: str) -> bool:
    """Whether a hub dataset is in the local caches `datasets.load_dataset` reads offline (its own, or the
    hub's). The variables are read now, not when `datasets` was imported, so a caller may point them."""
    import datasets.config
    import huggingface_hub.constants

    own = os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE
    hub = os.environ.get("HF_HUB_CACHE") or huggingface_hub.constants.HF_HUB_CACHE
    return _holds_data(Path(own) / repo_id.replace("/", "___")) or _holds_data(
        Path(hub) / f"datasets--{repo_id.replace('/', '--')}" / "snapshots"
    )


def _holds_data(folder: Path) -> bool:
    """A cache folder counts only when it holds a finished file: an empty one (or one with only locks or
    partial downloads) is what an interrupted or refused download leaves, and loads nothing offline."""
    if not folder.is_dir():
        return False
    return any(
        p.is_file() and not p.name.endswith((".lock", ".incomplete")) and p.stat().st_size > 0
        for p in folder.rglob("*")
    )


def _generator_source(spec: str) -> tuple[str, str]:
    """The source of a `custom_dataset` generator as lm-eval's index keeps it unresolved,
    'FOLDER/module.function', and of its module."""
    module_path, _, function = spec.rpartition(".")
    try:
        module_source = Path(module_path + ".py").read_text()
    except OSError:
        return "", ""
    for node in ast.parse(module_source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_source_segment(module_source, node) or "", module_source
    return "", module_source


def data_needed(config: dict) -> list[str]:
    """What an lm-eval task config fetches that may need the network: its hub dataset (`dataset_path`, not a
    local builder or folder), or for a generator, the essay haystack or a web download."""
    needs = []
    path = str(config.get("dataset_path") or "")
    if path not in LOCAL_BUILDERS and not Path(path).expanduser().exists():
        needs.append(f"the hub dataset {path!r}")
    spec = config.get("custom_dataset")
    if isinstance(spec, str):
        function, module = _generator_source(spec)
        if 'type_haystack="essay"' in function:
            needs.append(f"the hub dataset {ESSAY_DATASET!r}")
        elif "requests.get(" in module and "get_qa_dataset" in function:
            needs.append("a download from the web (its QA set)")
    return needs


def _leaf_configs(manager, name, seen: set) -> list[tuple[str, dict]]:
    """(task name, config) of every task a name stands for: groups and tags expand to their members."""
    from lm_eval.tasks._index import Kind

    entry = manager._entry(name) if isinstance(name, str) else None
    if isinstance(name, dict):  # an inline config or a YAML file's
        return [(str(name.get("task", "?")), name)]
    if entry is None or name in seen:
        return []
    seen.add(name)
    if entry.kind is Kind.TAG:
        members = sorted(entry.tags)
    elif entry.kind is Kind.GROUP:
        members = [m.get("task") if isinstance(m, dict) else m for m in (entry.cfg or {}).get("task", [])]
    else:
        return [(name, entry.cfg or {})]
    return [leaf for member in members for leaf in _leaf_configs(manager, member, seen)]


def unreachable_data(manager, tasks) -> dict[str, list[str]]:
    """Offline: task name -> what it would fetch that is neither cached nor local (empty when online)."""
    if not offline():
        return {}
    seen, found = set(), {}
    for task in tasks or []:
        for name, config in _leaf_configs(manager, task, seen):
            needs = [n for n in data_needed(config) if not _cached(n)]
            if needs:
                found[name] = needs
    return found


def _cached(need: str) -> bool:
    return need.startswith("the hub dataset ") and dataset_cached(need.split("'")[1])


def refuse_unreachable_data(manager, tasks) -> None:
    """One line naming each task that needs data out of reach offline, grouped by what it needs."""
    missing = unreachable_data(manager, tasks)
    if not missing:
        return
    by_need: dict[str, list[str]] = {}
    for name, needs in missing.items():
        for need in needs:
            by_need.setdefault(need, []).append(name)
    parts = [
        f"{', '.join(sorted(names))} need{'s' if len(names) == 1 else ''} {need}"
        for need, names in by_need.items()
    ]
    raise RopebenchError(
        f"offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE) and not cached: {'; '.join(parts)} — run them online "
        f"(a hub dataset is cached for later offline runs), or leave those tasks out"
    )


@contextlib.contextmanager
def data_checked_before_the_model():
    """lm-eval loads the model before it builds its tasks, so a task whose data is out of reach used to fail
    after the load with a long traceback. The check runs on the task manager lm-eval builds for the run
    itself (indexing lm-eval's tasks twice costs seconds), right after it resolves the task names."""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    original = EvaluatorConfig.process_tasks

    def process_tasks(self, metadata=None):
        manager = original(self, metadata)
        refuse_unreachable_data(manager, self.tasks)
        return manager

    EvaluatorConfig.process_tasks = process_tasks
    try:
        yield
    finally:
        EvaluatorConfig.process_tasks = original
