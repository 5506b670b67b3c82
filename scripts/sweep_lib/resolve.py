"""Sweep configuration, second stage: the merged config -> one normalised config, checking the shape and type
of every key (no names yet: those are checked by `checks` once plugins are imported)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ropebench.extend.errors import closest
from ropebench.extend.values import as_int, as_length, not_value, parse_text

from .config import ConfigError

TOP_KEYS = {
    "model": "model spec(s): hub id, local dir, .gguf file or alias (smollm2-135m)",
    "methods": "RoPE methods: names, or mappings {method, factors, options}",
    "factors": (
        "scale factors applied to every method (a method the factor does nothing for, e.g. plain, runs at 1)"
    ),
    "options": "method options by method: {yarn: {beta_fast: 32}}",
    "tasks": (
        "tasks: a list of names, or a mapping name -> task options (+ lengths, per_length, and task: the "
        "task an entry named otherwise runs)"
    ),
    "lengths": "context lengths for every task that does not set its own",
    "corpus": "corpus name(s) for the tasks (a list makes it a grid dimension)",
    "out": "run directory (records, manifest, report)",
    "seed": "random seed passed to every task",
    "device": "cpu, cuda, cuda:N or auto",
    "dtype": "float32, bfloat16, float16 or auto",
    "trust_remote_code": "allow models with remote code (default false)",
    "plugins": "modules or .py files imported first (they may register methods or tasks)",
    "description": "free text, kept in the manifest",
}
METHOD_KEYS = ("method", "factors", "options")
TASK_SWEEP_KEYS = ("task", "lengths", "per_length")  # consumed by the sweep, not passed to the task
# An entry of `tasks:` is named by its key; `task:` says which registered task it runs when the name is not
# one (`retrieval-vt: {task: retrieval, variants: vt}`): one task twice with different options, each reported
# under its own name. Its cells record the task in their task options under this key (grid.BASE_TASK).
# Cells of these tasks hold one length each (finer resume and sharding; the tasks gain nothing from several
# lengths in one call). Perplexity keeps all lengths in one cell: one forward gives the whole curve.
PER_LENGTH_DEFAULT = {"passkey": True, "classification": True}
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def _as_list(value, key: str) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (str, int, float)):
        return [value]
    raise ConfigError(
        f"{key} must be a value or a list, got {type(value).__name__} — see scripts/configs/demo.yaml"
    )


def check_lengths(values, where: str) -> list[int]:
    """Positive whole numbers of tokens; text by extend.values' rules (`16k` = 16384, `1e5` = 100000)."""
    values = _as_list(values, where)
    if not values:
        raise ConfigError(f"empty grid: {where} has no lengths — give at least one, e.g. --lengths 2048 4096")
    return sorted({as_length(v, where) for v in values})


def check_factors(values, where: str) -> list[float]:
    values = _as_list(values, where)
    if not values:
        raise ConfigError(f"empty grid: {where} is empty — give at least one factor, e.g. --factors 2")
    out = []
    for v in values:
        v = parse_text(v, where)  # text (a quoted '2' in YAML, the Python API) by extend.values' rules
        if isinstance(v, float) and not math.isfinite(v):  # 1e400 parses to inf
            raise not_value(where, v, "finite (too large for a float)", "2 or 4")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise not_value(where, v, "a positive number", "2 or 4")
        out.append(float(v))
    return sorted(set(out))


def _check_mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} must be a mapping of key: value, got {type(value).__name__} {value!r} — "
            f"see scripts/configs/demo.yaml"
        )
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{where}: key {bad[0]!r} is not a string — use names as keys")
    return dict(value)


def _check_flag(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r} — write true or false")
    return value


def resolve(cfg: dict, *, source: str = "config") -> dict:
    """Shape/type validation and normalisation (no registries). Returns the resolved config."""
    unknown = [k for k in cfg if k not in TOP_KEYS and not k.startswith("_cli_")]
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {source} — {closest(unknown[0], TOP_KEYS, 'keys')}")
    models = _as_list(cfg.get("model"), "model")
    if not models:
        raise ConfigError("empty grid: no model — set model: in the config or pass --model smollm2-135m")
    for m in models:
        if not isinstance(m, str) or not m.strip():
            raise ConfigError(
                f"model {m!r} is not a model spec — pass a hub id, a directory, a .gguf file or smollm2-135m"
            )
    out = {
        "model": list(dict.fromkeys(m.strip() for m in models)),
        "methods": _methods(cfg),
        "tasks": _tasks(cfg),
    }
    # methods named under options: — checked against the registry once plugins are in (checks.py)
    out["_option_methods"] = sorted(_check_mapping(cfg.get("options"), "options"))
    corpora = _as_list(cfg.get("corpus", "sotu"), "corpus")
    if not corpora:
        raise ConfigError("empty grid: no corpus — set corpus: or pass --corpus sotu")
    for c in corpora:
        if not isinstance(c, str) or not c:
            raise ConfigError(f"corpus {c!r} is not a name — use sotu, pg19, proof-pile, a hub id or a path")
    out["corpus"] = list(dict.fromkeys(corpora))
    out.update(_run_settings(cfg))
    return out


def _methods(cfg: dict) -> list[dict]:
    """methods x factors x options, with -o overrides. Per method: {method, factors, options}; `_broadcast`
    holds the keys of `-o KEY=VALUE` without a method (kept only where the method takes them: checks.py)."""
    factors = check_factors(cfg.get("factors", [2]), "factors")
    options = _check_mapping(cfg.get("options"), "options")
    for name, opts in options.items():
        options[name] = _check_mapping(opts, f"options.{name}")
    entries = _as_list(cfg.get("methods"), "methods")
    if not entries:
        raise ConfigError("empty grid: no methods — set methods: or pass e.g. --methods plain yarn")
    methods = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"method": entry}
        if not isinstance(entry, dict):
            raise ConfigError(
                f"methods[{i}] must be a name or a mapping {{method, factors, options}}, got {entry!r} — "
                f"write e.g. [plain, {{method: yarn, factors: [2, 4]}}]"
            )
        bad = [k for k in entry if k not in METHOD_KEYS]
        if bad:
            raise ConfigError(
                f"unknown key {bad[0]!r} in methods[{i}] — {closest(bad[0], METHOD_KEYS, 'keys')}"
            )
        name = entry.get("method")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"methods[{i}] has no method name — write {{method: yarn, factors: [2, 4]}}")
        own = check_factors(entry["factors"], f"methods[{i}].factors") if "factors" in entry else factors
        opts = dict(options.get(name, {}))
        opts.update(_check_mapping(entry.get("options"), f"methods[{i}].options"))
        methods.append({"method": name, "factors": own, "options": opts})
    seen: set = set()
    for name, key, value in cfg.get("_cli_options", []):
        if (name, key) in seen:
            where = f"{name}.{key}" if name else key
            raise ConfigError(f"-o {where} is given twice — give it once (a list value: -o {where}=[a,b])")
        seen.add((name, key))
        targets = [m for m in methods if name is None or m["method"] == name]
        if name is not None and not targets:
            raise ConfigError(
                f"--option {name}.{key}: method {name!r} is not in the grid — "
                f"{closest(name, [m['method'] for m in methods], 'methods')}"
            )
        for m in targets:
            m["options"][key] = value
            if name is None:
                m.setdefault("_broadcast", set()).add(key)
    return methods


def _tasks(cfg: dict) -> dict:
    """Per task entry: {lengths, per_length, options} (options: what the task receives), with -t overrides,
    and {task} when the entry runs a registered task under another name (`retrieval-vt: {task:
    retrieval}`)."""
    raw = cfg.get("tasks")
    if isinstance(raw, (list, tuple)):
        raw = {t: None for t in raw}
    if isinstance(raw, str):
        raw = {raw: None}
    raw = _check_mapping(raw, "tasks")
    if not raw:
        raise ConfigError("empty grid: no tasks — set tasks: or pass e.g. --tasks perplexity passkey")
    cli_lengths = cfg.get("_cli_lengths")
    seen: set = set()
    for name, key, value in cfg.get("_cli_task_options", []):
        if name is None or name not in raw:
            raise ConfigError(
                f"--task-option needs TASK.KEY=VALUE with a task of the grid — "
                f"{closest(name or '', list(raw), 'tasks')}"
            )
        if (name, key) in seen:
            raise ConfigError(
                f"-t {name}.{key} is given twice — give it once (a list value: -t {name}.{key}=[a,b])"
            )
        seen.add((name, key))
        if key == "lengths" and cli_lengths:
            raise ConfigError(
                f"--lengths and -t {name}.lengths both set the lengths of {name} — drop one (--lengths "
                f"for every task, -t {name}.lengths=[...] for {name} alone)"
            )
        raw[name] = dict(raw[name] or {}, **{key: value})
    tasks = {}
    for name, opts in raw.items():
        opts = _check_mapping(opts, f"tasks.{name}")
        if (cli_lengths and (name, "lengths") not in seen) or "lengths" not in opts:
            if cfg.get("lengths") is None:
                raise ConfigError(
                    f"task {name!r} has no lengths — set tasks.{name}.lengths or lengths:, or pass --lengths"
                )
            lengths = check_lengths(cfg["lengths"], "lengths")
        else:
            lengths = check_lengths(opts["lengths"], f"tasks.{name}.lengths")
        base = opts.get("task", name)
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(
                f"tasks.{name}.task must be the name of a task, got {base!r} — write e.g. "
                f"{name}: {{task: retrieval, variants: vt}}"
            )
        per_length = _check_flag(
            opts.get("per_length", PER_LENGTH_DEFAULT.get(base, False)), f"tasks.{name}.per_length"
        )
        tasks[name] = {
            "lengths": lengths,
            "per_length": per_length,
            "options": {k: v for k, v in opts.items() if k not in TASK_SWEEP_KEYS},
        }
        if base != name:  # an entry under its own name; a plain entry stays as it was (its cell keys too)
            tasks[name]["task"] = base
    return tasks


def _run_settings(cfg: dict) -> dict:
    """seed, device, dtype, trust_remote_code, plugins, description, out."""
    seed = as_int(cfg.get("seed", 0), "seed", "--seed 0")
    if seed < 0:  # random.Random(-1) is random.Random(1): the same prompts under another cell key
        raise ConfigError(
            f"seed must be >= 0, got {seed} — e.g. --seed 0 (a negative seed repeats the positive one)"
        )
    device = cfg.get("device")
    if device in (None, "auto", ""):
        device = None
    elif not isinstance(device, str) or not (
        device in ("cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit())
    ):
        raise ConfigError(f"unknown device {device!r} — use cpu, cuda, cuda:N or auto")
    dtype = cfg.get("dtype")
    if dtype in (None, "auto", ""):
        dtype = None
    elif dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r} — {closest(dtype, DTYPES, 'dtypes')}")
    trust = _check_flag(cfg.get("trust_remote_code", False), "trust_remote_code")
    outdir = cfg.get("out")
    if outdir is None:
        outdir = os.path.join("runs", "sweep")
    if not isinstance(outdir, str) or not outdir.strip():
        raise ConfigError(f"out must be a directory path, got {outdir!r} — e.g. --out runs/my-sweep")
    if "\0" in outdir:
        raise ConfigError("out contains a NUL character — give a plain directory path")
    return {
        "seed": seed,
        "device": device,
        "dtype": DTYPES.get(dtype) if dtype else None,
        "trust_remote_code": trust,
        "plugins": [str(p) for p in _as_list(cfg.get("plugins"), "plugins")],
        "description": cfg.get("description"),
        "out": _absolute(outdir),
    }


def _absolute(outdir: str) -> str:
    try:
        return str(Path(outdir).expanduser().resolve())
    except (
        OSError,
        RuntimeError,
    ) as e:  # a symlink loop (RuntimeError before Python 3.13), an unreadable parent
        raise ConfigError(
            f"cannot use --out {outdir}: {getattr(e, 'strerror', None) or e} — choose a directory "
            f"path without symlink loops that you can read and write"
        ) from None


def check_writable(out: str) -> None:
    """The run directory can be created (or written) — checked without creating anything, so a rejected input
    leaves no empty directory behind."""
    path = Path(out)
    probe = path
    while True:  # the nearest existing ancestor; os.stat, not exists(), so EACCES and ELOOP are not "missing"
        try:
            os.stat(probe)
            break
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                break
            probe = probe.parent
        except OSError as e:  # a parent that may not be read (Permission denied), a symlink loop
            raise ConfigError(
                f"cannot use --out {out}: {e.strerror or e} at {probe} — choose a directory you "
                f"can read and write"
            ) from None
    if not probe.is_dir():
        raise ConfigError(
            f"cannot write to --out {out}: {probe} is a file, not a directory — choose a directory path"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write to --out {out}: Permission denied — choose a writable directory")
