"""Sweep configuration: YAML file + CLI overrides -> one validated, fully resolved config.

Two validation stages:
- `resolve(...)`: shape and types only (pure Python + yaml), so most bad input fails fast without importing torch;
- `check_registries(...)`: names against the live registries (extend methods, tasks.SUITES, corpora, models).
Every problem raises `ConfigError` with one line: what is wrong — what to do.
"""
from __future__ import annotations

import copy
import difflib
import importlib
import importlib.util
import math
import os
import re
import sys
from pathlib import Path

import yaml

from extend.errors import RopebenchError

SCRIPTS = Path(__file__).resolve().parent.parent
DEMO_CONFIG = SCRIPTS / "configs" / "demo.yaml"

TOP_KEYS = {
    "model": "model spec(s): hub id, local dir, .gguf file or alias (smollm2-135m)",
    "methods": "RoPE methods: names, or mappings {method, factors, options}",
    "factors": "scale factors applied to every method (except plain, which always runs at 1)",
    "options": "method options by method: {yarn: {beta_fast: 32}}",
    "tasks": "suites: a list of names, or a mapping name -> suite options (+ lengths, per_length)",
    "lengths": "context lengths for every task that does not set its own",
    "corpus": "corpus name(s) for the suites (a list makes it a grid dimension)",
    "out": "run directory (records, manifest, report)",
    "seed": "random seed passed to every suite",
    "device": "cpu, cuda, cuda:N or auto",
    "dtype": "float32, bfloat16, float16 or auto",
    "trust_remote_code": "allow models with remote code (default false)",
    "plugins": "modules or .py files imported first (they may register methods or suites)",
    "description": "free text, kept in the manifest",
}
METHOD_KEYS = ("method", "factors", "options")
TASK_SWEEP_KEYS = ("lengths", "per_length")  # consumed by the sweep, not passed to the suite
# Cells of these tasks hold one length each (finer resume and sharding; their suites gain nothing from several
# lengths in one call). Perplexity keeps all lengths in one cell: one forward gives the whole curve.
PER_LENGTH_DEFAULT = {"passkey": True, "classification": True}
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}
FACTOR_FREE = {"plain"}  # methods that ignore the factor: run once, at factor 1


class ConfigError(RopebenchError):
    """Bad sweep input; the message says what is wrong and what to do."""


def closest(name, choices, what: str) -> str:
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(close)}?"
    return f"valid {what}: {', '.join(sorted(map(str, choices)))}"


# ---------------------------------------------------------------------------------------------- reading
class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # PyYAML reports unhashable keys itself
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} — check the path (examples: scripts/configs/*.yaml)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {getattr(e, 'strerror', None) or e} — check the file"
                          ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if problem.startswith("duplicate key"):
            raise ConfigError(f"{path}{where}: {problem} — keep one (YAML would silently use the last)") from None
        raise ConfigError(f"invalid YAML in {path}{where}: {problem} — fix the syntax") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of keys (model:, methods:, ...), got a "
                          f"{type(data).__name__} — see scripts/configs/demo.yaml")
    return data


NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def parse_value(text: str):
    """A CLI value as YAML (2 -> int, 2.5 -> float, [1, 2] -> list, true -> bool, else the string). Numbers YAML 1.1
    leaves as strings (1e3, 2E-1) are numbers too."""
    if isinstance(text, str) and NUMBER.match(text.strip()):
        t = text.strip()
        return int(t) if re.fullmatch(r"[+-]?\d+", t) else float(t)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_assignment(text: str, flag: str) -> tuple[str | None, str, object]:
    """'name.key=value' or 'key=value' -> (name, key, value)."""
    if "=" not in text:
        raise ConfigError(f"{flag} {text!r} is not KEY=VALUE — write e.g. {flag} yarn.beta_fast=32")
    lhs, value = text.split("=", 1)
    lhs = lhs.strip()
    name, _, key = lhs.rpartition(".")
    if not key:
        raise ConfigError(f"{flag} {text!r} has an empty key — write e.g. {flag} yarn.beta_fast=32")
    return (name or None), key, parse_value(value)


# ---------------------------------------------------------------------------------------------- merging
def merge_cli(cfg: dict, args) -> dict:
    """Apply CLI overrides (argparse namespace) on top of the file config."""
    cfg = copy.deepcopy(cfg)

    def listed(values):
        out = []
        for v in values:
            out += [p for p in str(v).split(",") if p.strip()] if "," in str(v) else [v]
        return [p.strip() if isinstance(p, str) else p for p in out]

    if args.model:
        cfg["model"] = listed(args.model)
    if args.methods:
        names = listed(args.methods)
        old = cfg.get("methods") if isinstance(cfg.get("methods"), list) else []
        entries = []
        for n in names:  # keep a file entry's per-method options for a method named again on the CLI
            kept = [e for e in old if isinstance(e, dict) and e.get("method") == n]
            entries += kept or [n]
        cfg["methods"] = entries
    if args.factors:
        cfg["factors"] = [parse_value(f) for f in listed(args.factors)]
        if isinstance(cfg.get("methods"), list):  # the CLI factors win over per-method factors
            cfg["methods"] = [{k: v for k, v in e.items() if k != "factors"} if isinstance(e, dict) else e
                              for e in cfg["methods"]]
    if args.lengths:
        cfg["lengths"] = [parse_value(x) for x in listed(args.lengths)]
        cfg["_cli_lengths"] = True
    if args.tasks:
        names = listed(args.tasks)
        old = cfg.get("tasks")
        old = old if isinstance(old, dict) else {}
        cfg["tasks"] = {n: copy.deepcopy(old.get(n)) for n in names}
    for key in ("corpus",):
        if getattr(args, key):
            cfg[key] = listed(getattr(args, key))
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


# ---------------------------------------------------------------------------------------------- resolving
def _as_list(value, key: str) -> list:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (str, int, float)):
        return [value]
    raise ConfigError(f"{key} must be a value or a list, got {type(value).__name__} — see scripts/configs/demo.yaml")


def check_lengths(values, where: str) -> list[int]:
    values = _as_list(values, where)
    if not values:
        raise ConfigError(f"empty grid: {where} has no lengths — give at least one, e.g. --lengths 2048 4096")
    out = []
    for v in values:
        if isinstance(v, str) and v.strip().lower().endswith("k") and v.strip()[:-1].isdigit():
            v = int(v.strip()[:-1]) * 1024  # "8k" -> 8192
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: length {v!r} is not an integer — use whole token counts, e.g. 4096")
        if v <= 0:
            raise ConfigError(f"{where}: length {v} is not positive — use lengths > 0, e.g. 4096")
        out.append(v)
    return sorted(set(out))


def check_factors(values, where: str) -> list[float]:
    values = _as_list(values, where)
    if not values:
        raise ConfigError(f"empty grid: {where} is empty — give at least one factor, e.g. --factors 2")
    out = []
    for v in values:
        if isinstance(v, str) and NUMBER.match(v.strip()):
            v = parse_value(v)  # 1e3 in a YAML file is a string (YAML 1.1 wants 1.0e+3)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{where}: factor {v!r} is not a positive number — use e.g. 2 or 4")
        out.append(float(v))
    return sorted(set(out))


def _check_mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of key: value, got {type(value).__name__} {value!r} — "
                          f"see scripts/configs/demo.yaml")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{where}: key {bad[0]!r} is not a string — use names as keys")
    return dict(value)


def resolve(cfg: dict, *, source: str = "config") -> dict:
    """Shape/type validation and normalisation (no registries). Returns the resolved config."""
    unknown = [k for k in cfg if k not in TOP_KEYS and not k.startswith("_cli_")]
    if unknown:
        k = unknown[0]
        raise ConfigError(f"unknown key {k!r} in {source} — {closest(k, TOP_KEYS, 'keys')}")
    out: dict = {}

    models = _as_list(cfg.get("model"), "model")
    if not models:
        raise ConfigError("empty grid: no model — set model: in the config or pass --model smollm2-135m")
    for m in models:
        if not isinstance(m, str) or not m.strip():
            raise ConfigError(f"model {m!r} is not a model spec — pass a hub id, a directory, a .gguf file or "
                              f"smollm2-135m")
    out["model"] = list(dict.fromkeys(m.strip() for m in models))

    factors = check_factors(cfg.get("factors", [2]), "factors")
    options = _check_mapping(cfg.get("options"), "options")
    for name, opts in options.items():
        options[name] = _check_mapping(opts, f"options.{name}")
    methods_raw = _as_list(cfg.get("methods"), "methods")
    if not methods_raw:
        raise ConfigError("empty grid: no methods — set methods: or pass e.g. --methods plain yarn")
    methods = []
    for i, entry in enumerate(methods_raw):
        if isinstance(entry, str):
            entry = {"method": entry}
        if not isinstance(entry, dict):
            raise ConfigError(f"methods[{i}] must be a name or a mapping {{method, factors, options}}, got {entry!r} — "
                              f"write e.g. [plain, {{method: yarn, factors: [2, 4]}}]")
        bad = [k for k in entry if k not in METHOD_KEYS]
        if bad:
            raise ConfigError(f"unknown key {bad[0]!r} in methods[{i}] — {closest(bad[0], METHOD_KEYS, 'keys')}")
        name = entry.get("method")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"methods[{i}] has no method name — write {{method: yarn, factors: [2, 4]}}")
        f = [1.0] if name in FACTOR_FREE else (
            check_factors(entry["factors"], f"methods[{i}].factors") if "factors" in entry else factors)
        opts = dict(options.get(name, {}))
        opts.update(_check_mapping(entry.get("options"), f"methods[{i}].options"))
        methods.append({"method": name, "factors": f, "options": opts})
    seen_options: set = set()
    for name, key, value in cfg.get("_cli_options", []):
        if (name, key) in seen_options:
            where = f"{name}.{key}" if name else key
            raise ConfigError(f"-o {where} is given twice — give it once (a list value: -o {where}=[a,b])")
        seen_options.add((name, key))
        targets = [m for m in methods if name is None or m["method"] == name]
        if name is not None and not targets:
            raise ConfigError(f"--option {name}.{key}: method {name!r} is not in the grid — "
                              f"{closest(name, [m['method'] for m in methods], 'methods')}")
        for m in targets:
            m["options"][key] = value
        if name is None:  # KEY=VALUE: for the methods that take that option (checked against the registry)
            for m in targets:
                m.setdefault("_broadcast", set()).add(key)
    out["methods"] = methods

    global_lengths = cfg.get("lengths")
    tasks_raw = cfg.get("tasks")
    if isinstance(tasks_raw, (list, tuple)):
        tasks_raw = {t: None for t in tasks_raw}
    if isinstance(tasks_raw, str):
        tasks_raw = {tasks_raw: None}
    tasks_raw = _check_mapping(tasks_raw, "tasks")
    if not tasks_raw:
        raise ConfigError("empty grid: no tasks — set tasks: or pass e.g. --tasks perplexity passkey")
    seen_cli: set = set()
    for name, key, value in cfg.get("_cli_task_options", []):
        if name is None or name not in tasks_raw:
            raise ConfigError(f"--task-option needs TASK.KEY=VALUE with a task of the grid — "
                              f"{closest(name or '', list(tasks_raw), 'tasks')}")
        if (name, key) in seen_cli:
            raise ConfigError(f"-t {name}.{key} is given twice — give it once (a list value: "
                              f"-t {name}.{key}=[a,b])")
        seen_cli.add((name, key))
        if key == "lengths" and cfg.get("_cli_lengths"):
            raise ConfigError(f"--lengths and -t {name}.lengths both set the lengths of {name} — drop one (--lengths "
                              f"for every task, -t {name}.lengths=[...] for {name} alone)")
        tasks_raw[name] = dict(tasks_raw[name] or {}, **{key: value})
    tasks = {}
    for name, opts in tasks_raw.items():
        opts = _check_mapping(opts, f"tasks.{name}")
        if (cfg.get("_cli_lengths") and (name, "lengths") not in seen_cli) or "lengths" not in opts:
            if global_lengths is None:
                raise ConfigError(f"task {name!r} has no lengths — set tasks.{name}.lengths or lengths:, or pass "
                                  f"--lengths")
            lengths = check_lengths(global_lengths, "lengths")
        else:
            lengths = check_lengths(opts["lengths"], f"tasks.{name}.lengths")
        per_length = opts.get("per_length", PER_LENGTH_DEFAULT.get(name, False))
        if not isinstance(per_length, bool):
            raise ConfigError(f"tasks.{name}.per_length must be true or false, got {per_length!r} — write true or false")
        suite_opts = {k: v for k, v in opts.items() if k not in TASK_SWEEP_KEYS}
        tasks[name] = {"lengths": lengths, "per_length": per_length, "options": suite_opts}
    out["tasks"] = tasks

    corpora = _as_list(cfg.get("corpus", "sotu"), "corpus")
    if not corpora:
        raise ConfigError("empty grid: no corpus — set corpus: or pass --corpus sotu")
    for c in corpora:
        if not isinstance(c, str) or not c:
            raise ConfigError(f"corpus {c!r} is not a name — use sotu, pg19, proof-pile, a hub id or a path")
    out["corpus"] = list(dict.fromkeys(corpora))

    seed = cfg.get("seed", 0)
    if isinstance(seed, str) and seed.strip().lstrip("-").isdigit():
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r} — e.g. --seed 0")
    if seed < 0:  # random.Random(-1) is random.Random(1): the same prompts under another cell key
        raise ConfigError(f"seed must be >= 0, got {seed} — e.g. --seed 0 (a negative seed repeats the positive "
                          f"one)")
    out["seed"] = seed

    device = cfg.get("device")
    if device in (None, "auto", ""):
        device = None
    elif not isinstance(device, str) or not (device in ("cpu", "cuda", "mps") or
                                              (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"unknown device {device!r} — use cpu, cuda, cuda:N or auto")
    out["device"] = device
    dtype = cfg.get("dtype")
    if dtype in (None, "auto", ""):
        dtype = None
    elif dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r} — {closest(dtype, DTYPES, 'dtypes')}")
    out["dtype"] = DTYPES.get(dtype) if dtype else None

    trust = cfg.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        raise ConfigError(f"trust_remote_code must be true or false, got {trust!r} — write true or false")
    out["trust_remote_code"] = trust
    plugins = _as_list(cfg.get("plugins"), "plugins")
    out["plugins"] = [str(p) for p in plugins]
    out["description"] = cfg.get("description")

    outdir = cfg.get("out", os.path.join("runs", "sweep"))
    if outdir is None:
        outdir = os.path.join("runs", "sweep")
    if not isinstance(outdir, str) or not outdir.strip():
        raise ConfigError(f"out must be a directory path, got {outdir!r} — e.g. --out runs/my-sweep")
    if "\0" in outdir:
        raise ConfigError("out contains a NUL character — give a plain directory path")
    out["out"] = str(Path(outdir).expanduser().resolve())
    return out


def check_writable(out: str) -> None:
    """The run directory can be created (or written) — checked without creating anything, so a rejected input
    leaves no empty directory behind."""
    path = Path(out)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"cannot write to --out {out}: {probe} is a file, not a directory — choose a "
                          f"directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write to --out {out}: Permission denied — choose a writable directory")


# ---------------------------------------------------------------------------------------------- plugins
def import_plugins(plugins: list[str]) -> None:
    """Import modules (dotted names) or .py files; they may register methods (extend.register) or suites
    (tasks.SUITES[name] = run). Also the env var ROPEBENCH_SWEEP_PLUGINS (comma-separated)."""
    env = [p for p in os.environ.get("ROPEBENCH_SWEEP_PLUGINS", "").split(",") if p.strip()]
    for spec in dict.fromkeys([*env, *plugins]):
        spec = spec.strip()
        try:
            if spec.endswith(".py"):
                path = Path(spec).expanduser().resolve()
                if not path.is_file():
                    raise ConfigError(f"plugin file not found: {spec} — check the path")
                name = f"ropebench_plugin_{path.stem}"
                if name in sys.modules:
                    continue
                module_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                try:
                    module_spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop(name, None)  # a broken plugin is not half-imported on a retry
                    raise
            else:
                importlib.import_module(spec)
        except ConfigError:
            raise
        except ModuleNotFoundError as e:
            raise ConfigError(f"plugin {spec!r} could not be imported: {e} — check the module name") from None
        except SyntaxError as e:
            where = f"{Path(e.filename).name}:{e.lineno}" if e.filename else f"line {e.lineno}"
            raise ConfigError(f"plugin {spec!r} has a syntax error ({where}: {e.msg}) — fix the plugin file"
                              ) from None
        except Exception as e:  # noqa: BLE001 - a plugin's own bug: name it, no traceback
            tb = e.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb is not None else ""
            first = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"plugin {spec!r} raised {type(e).__name__}{where}: {first} — fix the plugin (or "
                              f"drop --plugin {spec})") from None


# ---------------------------------------------------------------------------------------------- registries
def _signature_options(fn) -> tuple[dict, bool]:
    """Keyword options of a suite (name -> default) and whether it takes **kwargs."""
    import inspect

    params = inspect.signature(fn).parameters
    var = any(p.kind == p.VAR_KEYWORD for p in params.values())
    opts = {k: p.default for k, p in params.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and k not in ("model", "tokenizer", "tok")}
    return opts, var


def suite_accepts(fn, name: str) -> bool:
    opts, var = _signature_options(fn)
    return var or name in opts


def check_registries(cfg: dict) -> None:
    """Names against the registries: methods and their options/factors, tasks and their options, corpora,
    models, device. Mutates cfg only to drop bookkeeping."""
    import extend
    import tasks

    known_methods = extend.methods()
    for m in cfg["methods"]:
        name = m["method"]
        if name not in known_methods:
            raise ConfigError(f"unknown method {name!r} — {closest(name, known_methods, 'methods')}")
        info = extend.describe(name)
        valid = set(info["options"])
        broadcast = m.pop("_broadcast", set())
        m["_broadcast_seen"] = broadcast
        m["_taken"] = {k for k in broadcast if k in valid}
        for key in list(m["options"]):
            if key not in valid:
                if key in broadcast:  # --option KEY=VALUE without a method: only where it applies
                    del m["options"][key]
                    continue
                raise ConfigError(f"unknown option {key!r} for method {name!r} — "
                                  f"{closest(key, valid, 'options') if valid else 'it takes no options'}")
        for key, value in m["options"].items():  # value types against the method's signature
            extend.registry.check_option_value(extend.registry.get(name), key, value)
        missing = [k for k in info.get("required", []) if k not in m["options"]]
        if missing:
            raise ConfigError(f"method {name!r} needs option {missing[0]!r} — set options: {{{name}: "
                              f"{{{missing[0]}: ...}}}} or --option {name}.{missing[0]}=...")
        for f in m["factors"]:
            if f < info.get("min_factor", 0.0):
                raise ConfigError(f"method {name!r} only extends context: factor {f:g} < {info['min_factor']:g} — "
                                  f"use factors >= {info['min_factor']:g}")
    broadcast_all = {k for m in cfg["methods"] for k in m.get("_broadcast_seen", ())}
    taken = {k for m in cfg["methods"] for k in m.pop("_taken", ())}
    for m in cfg["methods"]:
        m.pop("_broadcast_seen", None)
    if broadcast_all - taken:
        key = min(broadcast_all - taken)
        raise ConfigError(f"--option {key}=...: no method of the grid takes option {key!r} — check the name "
                          f"(extend.describe(method) lists options)")
    for name, t in cfg["tasks"].items():
        if name not in tasks.SUITES:
            raise ConfigError(f"unknown task {name!r} — {closest(name, tasks.SUITES, 'tasks')}")
        opts, var = _signature_options(tasks.SUITES[name])
        reserved = {"lengths", "seed", "progress"}
        for key in t["options"]:
            if key in reserved - {"lengths"}:
                raise ConfigError(f"tasks.{name}.{key} is set by the sweep — use the top-level {key}: / --{key}")
            if not var and key not in opts:
                valid = sorted(set(opts) - reserved) + list(TASK_SWEEP_KEYS)
                raise ConfigError(f"unknown option {key!r} for task {name!r} — {closest(key, valid, 'options')}")
        from tasks.checks import check_suite_options

        check_suite_options(name, tasks.SUITES[name], t["options"])
    corpora = set(cfg["corpus"])
    for t in cfg["tasks"].values():
        c = t["options"].get("corpus")
        corpora.update(c if isinstance(c, list) else [c] if c is not None else [])
    for c in sorted(corpora, key=str):
        check_corpus(c)
    for m in cfg["model"]:
        check_model(m)
    if cfg["device"] and cfg["device"].startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"device {cfg['device']!r} requested but no CUDA GPU is available — use --device cpu")
        index = cfg["device"].partition(":")[2]
        if index and int(index) >= torch.cuda.device_count():
            raise ConfigError(f"device {cfg['device']!r}: this machine has {torch.cuda.device_count()} GPU(s) — use "
                              f"cuda:0 ... cuda:{torch.cuda.device_count() - 1}")
    if cfg["device"] == "mps":
        import torch

        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError("device 'mps' requested but Apple's MPS backend is not available here — use --device "
                              "cpu (or cuda on a GPU machine)")


def check_corpus(name) -> None:
    from tasks import data

    if not isinstance(name, str) or not name:
        raise ConfigError(f"corpus {name!r} is not a name — use one of {', '.join(data.corpus_names())} or a path")
    known = (name in data.corpus_names() or os.path.exists(os.path.expanduser(name)) or any(c in name for c in "*?[")
             or ("/" in name and not name.startswith((".", "/", "~"))))  # a hub dataset id
    if known:
        data.check_corpus(os.path.expanduser(name))  # empty files, an unreachable hub: once, before the model
        return
    raise ConfigError(f"unknown corpus {name!r} — {closest(name, data.corpus_names(), 'corpora')} (or a hub id "
                      f"owner/name, or a path to .txt/.jsonl/.csv files)")


def check_model(spec: str) -> None:
    import extend

    if spec in extend.ALIASES:
        return
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise ConfigError(f"model file not found: {spec} — check the path")
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise ConfigError(f"cannot read model file {spec}: {e.strerror or e} — check the file") from None
        if magic != b"GGUF":
            raise ConfigError(f"{spec} is not a GGUF file (it does not start with the GGUF magic bytes) — pass a "
                              f"real .gguf model, a model directory, a hub id or smollm2-135m")
        return
    if spec.startswith((".", "/", "~")) or path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model {spec!r} is not a model directory (no config.json) — pass a directory saved "
                              f"with save_pretrained, a .gguf file, a hub id or smollm2-135m")
        return
    if "/" in spec and spec.count("/") == 1 and all(spec.split("/")):
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            try:
                from huggingface_hub import try_to_load_from_cache

                cached = try_to_load_from_cache(spec, "config.json")
            except Exception:  # noqa: BLE001 - a malformed id is reported below
                cached = None
            if not isinstance(cached, str):
                raise ConfigError(f"model {spec!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set — "
                                  f"download it first or unset HF_HUB_OFFLINE")
        return
    raise ConfigError(f"unknown model {spec!r} — {closest(spec, extend.ALIASES, 'aliases')} (or a hub id "
                      f"owner/name, a local directory, a .gguf file)")
