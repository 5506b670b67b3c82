"""Sweep configuration, last stage: every name and value against the layer that owns its rule — methods,
factors and options (`extend.registry.check_method`), model specs and devices (`extend.loading`), tasks and
their options (`tasks.checks.check_task`), corpora (`tasks.data.check_corpus`). The sweep adds only what is
its own: `-o KEY=VALUE` without a method, and task arguments it sets itself. All before a model loads."""

from __future__ import annotations

import sys

from ropebench.extend import registry
from ropebench.extend.errors import ExtendError, closest
from ropebench.extend.loading import check_device, check_model_spec
from ropebench.tasks.checks import check_lengths_fit, check_task, extra_tokens, needs_tokenizer
from ropebench.tasks.data import check_corpus
from ropebench.tasks.errors import TaskError

from .config import ConfigError
from .grid import base_task
from .resolve import TASK_SWEEP_KEYS

SET_BY_SWEEP = ("seed", "progress")  # task arguments the sweep passes itself


def check_registries(cfg: dict) -> None:
    """Methods, tasks, corpora, models and the device of a resolved config. Mutates cfg: drops `-o KEY=VALUE`
    options from the methods that do not take KEY, and runs a method at factor 1 alone where its factor does
    nothing (plain) or must stay 1 with its options (registry fact `factor_applies`)."""
    check_methods(cfg)
    check_tasks(cfg)
    for corpus in sorted(corpora(cfg), key=str):
        check_corpus(corpus)  # empty files, an unreachable hub: once, before the model
    for spec in cfg["model"]:
        check_model_spec(spec)
    check_device(cfg["device"])
    for spec in cfg["model"]:
        check_against_model(cfg, spec)


def check_against_model(cfg: dict, spec: str) -> None:
    """What needs the model's config or tokenizer but not its weights: every (method, factor, options) patched
    onto a weightless skeleton, lengths against the tasks, the corpora and the tokenizer, and the longest
    forward against this machine's free memory (extend.memory)."""
    from ropebench.extend import memory, preflight
    from ropebench.extend.loading import default_device, default_dtype

    config = preflight.config_of(spec, cfg["trust_remote_code"])
    for m in cfg["methods"]:
        for factor in m["factors"]:
            preflight.check_on_config(config, m["method"], factor, m["options"])
    check_key_token_context(cfg, config)
    tokenizer = preflight.tokenizer_of(spec, cfg["trust_remote_code"]) if _needs_tokenizer(cfg) else None
    for name, t in cfg["tasks"].items():
        for corpus in _task_corpora(cfg, t):
            check_lengths_fit(base_task(name, t), t["lengths"], t["options"], corpus, tokenizer)
    device = cfg["device"] or default_device()
    dtype = cfg["dtype"] or str(default_dtype(device)).removeprefix("torch.")
    longest = max(
        max(t["lengths"]) + extra_tokens(base_task(name, t), t["options"]) for name, t in cfg["tasks"].items()
    )
    blockwise = all(registry.get(m["method"]).remap for m in cfg["methods"])
    memory.check_fits(config, longest, model=spec, device=device, dtype=dtype, blockwise=blockwise)


def check_key_token_context(cfg: dict, config) -> None:
    """key_tokens with evaluator "self" sees the trained context each patch puts in force (a forced
    original_max_position_embeddings, start_from): a given trunc_len at or above it leaves no token whose long
    context is longer than its short one. The task finds that only after the model loads; refused here, per
    method, before it does."""
    from ropebench.extend import preflight
    from ropebench.tasks.key_tokens import evaluator_spec, given_trunc_len, requested

    for name, t in cfg["tasks"].items():
        value = t["options"].get("key_tokens")
        if base_task(name, t) != "perplexity" or not requested(value) or evaluator_spec(value) != "self":
            continue
        trunc = given_trunc_len(value)
        if trunc is None:
            continue
        for m in cfg["methods"]:
            for factor in m["factors"]:
                context = preflight.context_in_force(config, m["method"], factor, m["options"])
                if context is not None and trunc >= context:
                    forced = m["options"].get("original_max_position_embeddings")
                    why = f" (original_max_position_embeddings={forced})" if forced is not None else ""
                    where = f"{m['method']} x{factor:g}{why}"
                    raise ConfigError(
                        f"tasks.{name}.key_tokens trunc_len {trunc} is not below the trained context "
                        f"{context} that {where} puts in force, which evaluator self sees: no token "
                        f"would have a long context longer than its short one — use trunc_len < "
                        f"{context}, or name an evaluator of its own (key_tokens.evaluator)"
                    )


def _needs_tokenizer(cfg: dict) -> bool:
    """The tokenizer makes the short-length bounds exact: read it when a task has such a bound to check."""
    return any(
        needs_tokenizer(base_task(name, t), t["lengths"], t["options"]) for name, t in cfg["tasks"].items()
    )


def _task_corpora(cfg: dict, task: dict) -> list:
    own = task["options"].get("corpus")
    if own is None:
        return list(cfg["corpus"])
    return own if isinstance(own, list) else [own]


def check_methods(cfg: dict) -> None:
    for name in cfg.pop("_option_methods", []):  # a misspelt method's options would be dropped silently
        try:
            registry.get(name)
        except ExtendError as e:
            raise ConfigError(f"options.{name}: {e}") from None
    broadcast, taken, collapsed = set(), set(), []
    for m in cfg["methods"]:
        method = registry.get(m["method"])
        valid = set(registry.describe(m["method"])["options"])
        keys = m.pop("_broadcast", set())  # -o KEY=VALUE without a method: only where it applies
        broadcast |= keys
        taken |= keys & valid
        m["options"] = {k: v for k, v in m["options"].items() if k in valid or k not in keys}
        if not method.factor_applies(m["options"]):
            # plain's collapse is documented; one that depends on the options (a rule) is said, in one line
            if callable(method.uses_factor) and m["factors"] != [1.0]:
                collapsed.append(_collapsed(method, m))
            m["factors"] = [1.0]
        for factor in m["factors"]:
            registry.check_method(m["method"], factor, m["options"])
    if collapsed:
        print(
            f"note: the factor changes nothing for {'; '.join(collapsed)}: run once, at factor 1",
            file=sys.stderr,
        )
    if broadcast - taken:
        key = min(broadcast - taken)
        raise ConfigError(
            f"--option {key}=...: no method of the grid takes option {key!r} — check the name "
            f"(extend.describe(method) lists options)"
        )


def _collapsed(method: registry.Method, entry: dict) -> str:
    """e.g. "dynamic-yarn[scale_rule=paper] (given x2, x4)": the options as a patch records them."""
    options = {**{k: method.options[k] for k in method.record}, **entry["options"]}
    label = f"[{','.join(f'{k}={v}' for k, v in sorted(options.items()))}]" if options else ""
    return f"{method.name}{label} (given x{', x'.join(f'{f:g}' for f in entry['factors'])})"


def check_tasks(cfg: dict) -> None:
    for name, t in cfg["tasks"].items():
        for key in SET_BY_SWEEP:
            if key in t["options"]:
                raise ConfigError(
                    f"tasks.{name}.{key} is set by the sweep — use the top-level {key}: / --{key}"
                )
        base = check_task_name(name, t)
        if base == name:
            check_task(name, t["options"], caller_keys=TASK_SWEEP_KEYS)
            continue
        try:  # an entry under its own name: say which entry, as two entries may run the same task
            check_task(base, t["options"], caller_keys=TASK_SWEEP_KEYS)
        except TaskError as e:
            raise ConfigError(f"tasks.{name} (task {base}): {e}") from None


def check_task_name(name: str, entry: dict) -> str:
    """The registered task a `tasks:` entry runs (its `task:`, else its name), or one line naming the closest:
    an entry named after no task and without `task:`, a `task:` naming no task, an entry named after one task
    that runs another, or an entry under the theory rows' name."""
    from ropebench import tasks

    from .run import THEORY_TASK

    base = base_task(name, entry)
    if base == name:
        # a name such as retrieval-mk: meant as a second entry of retrieval (a typo gets check_task's line)
        stems = [
            t for t in tasks.TASKS if name.startswith(t) and name[len(t) : len(t) + 1] in ("-", "_", ".")
        ]
        stem = max(stems, key=len, default=None)
        if stem is not None and name not in tasks.TASKS:
            raise ConfigError(
                f"unknown task {name!r} — did you mean {stem}? An entry under a name of its own says which "
                f"task it runs: {name}: {{task: {stem}, ...}}"
            )
        return base
    if base not in tasks.TASKS:
        raise ConfigError(f"tasks.{name}.task: unknown task {base!r} — {closest(base, tasks.TASKS, 'tasks')}")
    if name in tasks.TASKS or name == THEORY_TASK:
        taken = "the theory rows" if name == THEORY_TASK else f"task {name!r}"
        raise ConfigError(
            f"tasks.{name} runs task {base!r} under the name of {taken} — give the entry a name of its own, "
            f"e.g. {base}-2: {{task: {base}, ...}}"
        )
    bad = next((f"contains {c!r}" for c in ",= " if c in name), None) if name.strip() else "is empty"
    if bad is not None:
        raise ConfigError(
            f"task entry name {name!r} {bad} — use letters, digits, '-' or '_' (e.g. {base}-2), so that "
            f"--tasks and -t NAME.KEY=VALUE can name it"
        )
    return base


def corpora(cfg: dict) -> set:
    """Every corpus the grid names: the top-level ones and any a task sets itself."""
    names = set(cfg["corpus"])
    for t in cfg["tasks"].values():
        own = t["options"].get("corpus")
        names.update(own if isinstance(own, list) else [own] if own is not None else [])
    return names
