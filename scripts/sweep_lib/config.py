"""Sweep configuration, first stage: read the YAML file, parse CLI values, merge the CLI over the file.

The stages after this one: `resolve` (shape and types of every key), plugins, then `checks.check_registries`
(names and values against the layers that own them: extend's methods and models, tasks and corpora).
Names are checked last because plugins named in the config may register methods or tasks.
Every problem raises a RopebenchError subclass with one line: what is wrong — what to do.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import yaml
from ropebench.extend.errors import RopebenchError
from ropebench.extend.values import ValueLoader, parse_text

from .grid import base_task

SCRIPTS = Path(__file__).resolve().parent.parent
DEMO_CONFIG = SCRIPTS / "configs" / "demo.yaml"


def shipped_configs() -> list[str]:
    """The names of the configs shipped with ropebench (package data: a wheel has them too)."""
    return sorted(p.stem for p in (SCRIPTS / "configs").glob("*.yaml"))


def config_path(text: str) -> Path:
    """--config's value: a file, or the name of a shipped config (`demo`, `llama2-7b-gpu`) when no such file
    is there."""
    path = Path(text)
    if not path.exists() and text in shipped_configs():
        return SCRIPTS / "configs" / f"{text}.yaml"
    return path


class ConfigError(RopebenchError):
    """Bad sweep input; the message says what is wrong and what to do."""


# ---------------------------------------------------------------------------------------------- reading
class _UniqueKeyLoader(ValueLoader):
    """yaml.safe_load with plain scalars read by ropebench's rules (extend.values: `no` is the text no,
    `1e5` a number, `16k` 16384), and a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # `1:` or `true:`: every config key is a name
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is not a name", key_node.start_mark
                )
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML reports unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file not found: {path} — check the path, or name a shipped config: "
            f"{', '.join(shipped_configs())}"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"cannot read config file {path}: {getattr(e, 'strerror', None) or e} — check the file"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem.startswith("key ") and problem.endswith("is not a name"):
            raise ConfigError(
                f"{path}{where}: {problem} — config keys are names such as lengths or beta_fast "
                f"(quote it if you meant the text)"
            ) from None
        if problem.startswith("duplicate key"):
            raise ConfigError(
                f"{path}{where}: {problem} — keep one (YAML would silently use the last)"
            ) from None
        raise ConfigError(f"invalid YAML in {path}{where}: {problem} — fix the syntax") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of keys (model:, methods:, ...), got a "
            f"{type(data).__name__} — see scripts/configs/demo.yaml"
        )
    return data


parse_value = parse_text  # a CLI value: extend.values' rules (docs/sweeps.md, "How text becomes a value")


def parse_assignment(text: str, flag: str) -> tuple[str | None, str, object]:
    """'name.key=value' or 'key=value' -> (name, key, value)."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r} is not KEY=VALUE — write e.g. {flag} yarn.beta_fast=32")
    lhs, value = text.split("=", 1)
    lhs = lhs.strip()
    name, _, key = lhs.rpartition(".")
    if not key:
        raise ConfigError(f"{flag} {text!r} has an empty key — write e.g. {flag} yarn.beta_fast=32")
    return (name or None), key, parse_text(value, f"{flag} {lhs}")


# ---------------------------------------------------------------------------------------------- merging
def _listed(values) -> list:
    """Flag values, each also split at commas (`--methods plain,yarn` = `--methods plain yarn`)."""
    out = []
    for v in values:
        out += [p for p in str(v).split(",") if p.strip()] if "," in str(v) else [v]
    return [p.strip() if isinstance(p, str) else p for p in out]


def merge_cli(cfg: dict, args) -> dict:
    """Apply CLI overrides (argparse namespace) on top of the file config."""
    cfg = copy.deepcopy(cfg)
    if args.model:
        cfg["model"] = _listed(args.model)
    if args.methods:
        old = cfg.get("methods") if isinstance(cfg.get("methods"), list) else []
        entries = []
        for n in _listed(args.methods):  # keep a file entry's per-method options for a method named again
            kept = [e for e in old if isinstance(e, dict) and e.get("method") == n]
            entries += kept or [n]
        cfg["methods"] = entries
    if args.factors:
        cfg["factors"] = [parse_text(f, "--factors") for f in _listed(args.factors)]
        if isinstance(cfg.get("methods"), list):  # the CLI factors win over per-method factors
            cfg["methods"] = [
                {k: v for k, v in e.items() if k != "factors"} if isinstance(e, dict) else e
                for e in cfg["methods"]
            ]
    if args.lengths:
        cfg["lengths"] = [parse_text(x, "--lengths") for x in _listed(args.lengths)]
        cfg["_cli_lengths"] = True
    if args.tasks:
        old = cfg.get("tasks") if isinstance(cfg.get("tasks"), dict) else {}
        cfg["tasks"] = {n: copy.deepcopy(old.get(n)) for n in _listed(args.tasks)}
    if args.corpus:
        cfg["corpus"] = _listed(args.corpus)
    for key in ("out", "seed", "device", "dtype"):
        value = getattr(args, key)
        if value is not None:
            cfg[key] = value
    if args.trust_remote_code:
        cfg["trust_remote_code"] = True
    if args.plugin:
        cfg["plugins"] = list(cfg.get("plugins") or []) + list(args.plugin)
    if args.option:
        cfg["_cli_options"] = [parse_assignment(o, "--option") for o in args.option]
    if args.task_option:
        cfg["_cli_task_options"] = [parse_assignment(o, "--task-option") for o in args.task_option]
    return cfg


# ------------------------------------------------------------------------------------------ outside the demo
def raise_demo_num_docs(cfg: dict, args) -> dict[str, list[int]]:
    """A run that overrides --model or --corpus without --config inherits the demo's task options, sized for
    the embedded model on sotu in ten minutes (perplexity num_docs: 1, which has no interval). There each
    task's num_docs below the task's own default takes that default — enough documents for an interval; a
    num_docs set with -t stays. Changes cfg["tasks"] in place; returns {task: [demo's, now]} for what it
    raised."""
    from ropebench import tasks
    from ropebench.tasks.checks import signature_options

    given = {
        (name, key) for name, key, _ in (parse_assignment(o, "--task-option") for o in args.task_option or [])
    }
    raised = {}
    for name, task in cfg["tasks"].items():
        base = base_task(name, task)
        if (name, "num_docs") in given or base not in tasks.TASKS:
            continue
        default = signature_options(tasks.TASKS[base])[0].get("num_docs")
        have = task["options"].get("num_docs")
        if (
            isinstance(default, int)
            and isinstance(have, int)
            and not isinstance(have, bool)
            and have < default
        ):
            task["options"]["num_docs"] = default
            raised[name] = [have, default]
    return raised
