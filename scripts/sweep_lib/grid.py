"""The grid: a deterministic list of cells and their keys.

A cell is everything that defines one task call: model, method, factor, method options, task, task options
(corpus included), the lengths of that call, seed and dtype. Its key is the first 16 hex digits of the sha256
of the cell's canonical JSON, so the same definition gets the same key in every process and every rerun.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

KEY_FIELDS = ("model", "method", "factor", "options", "task", "task_options", "lengths", "seed", "dtype")
# A cell of a `tasks:` entry named otherwise than the task it runs (`retrieval-vt: {task: retrieval}`): `task`
# is the entry's name (the rows' task column), and the registered task is recorded in task_options under this
# key. Entries named after their task do not have it: their keys are what they always were.
BASE_TASK = "task"


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def _plain(obj):
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


def cell_key(definition: dict) -> str:
    return hashlib.sha256(canonical({k: definition[k] for k in KEY_FIELDS}).encode("utf-8")).hexdigest()[:16]


def base_task(name: str, entry: dict) -> str:
    """The registered task a resolved `tasks:` entry runs: its `task:`, else its name."""
    return entry.get("task", name)


@dataclass(frozen=True)
class Cell:
    model: str
    method: str
    factor: float
    options: dict
    task: str
    task_options: dict  # options passed to the task (corpus included when the task takes one)
    lengths: tuple
    seed: int
    dtype: str
    key: str = field(default="", compare=False)

    def definition(self) -> dict:
        return {
            "model": self.model,
            "method": self.method,
            "factor": float(self.factor),
            "options": dict(self.options),
            "task": self.task,
            "task_options": dict(self.task_options),
            "lengths": list(self.lengths),
            "seed": self.seed,
            "dtype": self.dtype,
        }

    @property
    def corpus(self) -> str | None:
        return self.task_options.get("corpus")

    @property
    def base_task(self) -> str:
        """The registered task this cell runs (tasks.TASKS): the entry's `task:`, else `task`."""
        return self.task_options.get(BASE_TASK, self.task)

    def call_options(self) -> dict:
        """The options the task function receives: task_options without the recorded base task."""
        return {k: v for k, v in self.task_options.items() if k != BASE_TASK or self.base_task == self.task}

    def label(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        lengths = ",".join(str(x) for x in self.lengths)
        return (
            f"{self.method}{'[' + opts + ']' if opts else ''} x{self.factor:g} {self.task}"
            f"{' ' + self.corpus if self.corpus else ''} L={lengths}"
        )


def make_cell(**definition) -> Cell:
    definition["factor"] = float(definition["factor"])
    definition["lengths"] = tuple(int(x) for x in definition["lengths"])
    key = cell_key({**definition, "lengths": list(definition["lengths"])})
    return Cell(**definition, key=key)


def build(cfg: dict, task_accepts=lambda task, option: True) -> list[Cell]:
    """All cells in loop order: model -> method x factor -> task -> corpus -> lengths.
    `task_accepts(task, option)` says whether a registered task takes an option (the corpus goes only to
    those). A `tasks:` entry named otherwise than its task (`retrieval-vt: {task: retrieval}`) gives cells of
    that name whose task_options record the task (BASE_TASK)."""
    cells, seen = [], set()
    for model in cfg["model"]:
        for m in cfg["methods"]:
            for factor in m["factors"]:
                for task, t in cfg["tasks"].items():
                    base = base_task(task, t)
                    own = t["options"].get("corpus")
                    if own is not None:
                        corpora = own if isinstance(own, list) else [own]
                    elif task_accepts(base, "corpus"):
                        corpora = cfg["corpus"]
                    else:
                        corpora = [None]
                    groups = [(L,) for L in t["lengths"]] if t["per_length"] else [tuple(t["lengths"])]
                    for corpus in corpora:
                        opts = dict(t["options"])
                        if base != task:
                            opts[BASE_TASK] = base
                        if corpus is not None:
                            opts["corpus"] = corpus
                        for lengths in groups:
                            cell = make_cell(
                                model=model,
                                method=m["method"],
                                factor=factor,
                                options=dict(m["options"]),
                                task=task,
                                task_options=opts,
                                lengths=lengths,
                                seed=cfg["seed"],
                                dtype=cfg["dtype"],
                            )
                            if cell.key not in seen:  # e.g. a method listed twice
                                seen.add(cell.key)
                                cells.append(cell)
    return cells


def shard(cells: list[Cell], rank: int, world: int) -> list[Cell]:
    """This rank's share: rank-strided over the deterministic cell list."""
    return cells[rank::world]
