"""The task kit: what a task declares once, and the cell runner prompt-based tasks share.

A task is its `run(model, tokenizer, *, lengths, ..., seed=0, progress=True)` function, decorated with
`declare(name, options=..., metrics=..., tables=...)` (docs/tasks.md, "Adding a task", has an example). The
defaults stay in the signature (one source); the declaration adds each option's check (type and range), what
each metric means (a `Metric`: results/meaning.py; the sweep copies it into every row), what the sweep prints,
the tokens a cell runs past its length and a length check that needs only the tokenizer. A plugin task may
still describe a metric with a plain string: its rows then carry no declaration (results' fallback), unless
it names the metric in `pass_fail` (a 0/1 rate with every reach rule). tasks/checks.py (before a model loads),
the sweep (scripts/sweep_lib) and the task itself (at every call, through the decorator) read the same
declaration, so an option is checked in one place; an option without a declared check is checked against the
type of its default.

`run_cells` is the cell runner: the prompts of one length form a cell, run in the order that shares the most
prefix (extend.prefix_cache) under `extend.fixed_length` for the cell's length, so dynamic methods (and xPos's
centre) see one length per cell whether prompts share a prefix or not. Cells of different lengths never share
a cache: a length-dependent method rotates a cached prefix for its cell's length only.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ropebench.extend.errors import closest
from ropebench.extend.prefix_cache import PrefixCache, cell_length, sharing_order
from ropebench.results.meaning import (  # the one edge tasks -> results: the declaration contract
    Metric,
    rule_names,
)

from .errors import TaskError

# name -> run: every declared task, built-ins by name (`declare` adds it; a plugin's
# undeclared run may be assigned by hand). Lives here, not in the package, so no task module imports back up.
TASKS: dict[str, Callable] = {}

NOT_OPTIONS = ("model", "tokenizer", "tok", "lengths", "seed", "progress")  # a task's arguments, not options

Check = Callable[[Any], "str | None"]  # value -> what is wrong with it (None: fine)


# ---------------------------------------------------------------------------------------------- option checks
def positive(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return "must be a positive integer — e.g. 1, 2 or 4"
    return None


def flag(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def optional_flag(value) -> str | None:
    return (
        None
        if value is None or isinstance(value, bool)
        else "must be true, false or unset (the tokenizer decides)"
    )


def choice(*choices: str) -> Check:
    def check(value) -> str | None:
        return None if value in choices else f"must be one of {', '.join(choices)}"

    return check


def optional_choice(*choices: str) -> Check:
    def check(value) -> str | None:
        return (
            None if value is None or value in choices else f"must be one of {', '.join(choices)} (or unset)"
        )

    return check


def choices(*allowed: str) -> Check:
    """One name or a non-empty list of names, each from `allowed`."""

    def check(value) -> str | None:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, (list, tuple)) or not values:
            return f"must be one of {', '.join(allowed)} or a non-empty list of them"
        bad = next((v for v in values if v not in allowed), None)
        if bad is not None:
            return f"holds {bad!r} — {closest(str(bad), allowed, 'names')}"
        return None

    return check


def fraction_open(value) -> str | None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 < value < 1.0
    return None if ok else "must be a number strictly between 0 and 1 — e.g. 0.5"


def fractions(value) -> str | None:
    """A fraction in [0, 1] or a non-empty list of them (needle depths)."""
    values = [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or not values:
        return "must be a non-empty list of fractions in [0, 1] — e.g. [0.0, 0.5, 1.0]"
    for d in values:
        if (
            isinstance(d, bool)
            or not isinstance(d, (int, float))
            or not math.isfinite(d)
            or not 0.0 <= d <= 1.0
        ):
            return (
                f"holds {d!r}, not a fraction in [0, 1] — 0 puts the needle first, 1 last, e.g. "
                "[0.0, 0.5, 1.0]"
            )
    seen: set = set()
    repeated = sorted({d for d in values if d in seen or seen.add(d)})  # one pass: a long list stays fast
    if repeated:  # a depth twice would give two prompts one (depth, trial) key: results pair and pool by it
        return f"holds {repeated[0]!r} more than once — give each depth once, e.g. [0.0, 0.5, 1.0]"
    return None


def by_default(default, value) -> str | None:
    """An undeclared option's value against the type of its default (None or no default: anything goes)."""
    if default is None or default is inspect.Parameter.empty:
        return None
    if isinstance(default, bool):
        return flag(value)
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "must be a number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "must be a string"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, (list, tuple)) else "must be a list"
    return None


# ------------------------------------------------------------------------------------------ the declaration
def _no_extra_tokens(options: dict) -> int:
    return 0


def _no_tokenizer(lengths: list[int], options: dict) -> bool:
    return False


def pass_fail_rate(description: str) -> Metric:
    """A plugin's string-described metric named in `pass_fail`: a 0/1 rate with every reach rule."""
    rules = rule_names("rate")  # every rule registered for rates (results/reach_rules.py)
    return Metric("rate", "higher", "fraction of prompts", description, reach=rules, lo=0.0, hi=1.0)


def metric_meanings(metrics: Mapping[str, Metric | str], pass_fail: Sequence[str]) -> dict[str, Metric]:
    """name -> Metric for every declared metric: `Metric` values as given, strings named in `pass_fail` as
    `pass_fail_rate`; other strings declare nothing (their rows get results' fallback). A `Metric` named in
    `pass_fail` must have reach rules (else the two say different things: TypeError)."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, Metric):
            if name in pass_fail and not value.has_bar:
                raise TypeError(f"metric {name!r} is in pass_fail but its Metric declares no reach rules")
            out[name] = value
        elif name in pass_fail:
            out[name] = pass_fail_rate(str(value))
    return out


@dataclass(frozen=True)
class TaskSpec:
    """What a task declares. `options`: name -> check of the value; `metrics`: name -> its one-line
    description; `meanings`: name -> `Metric` (metrics without one carry no declaration); `pass_fail`: the
    metrics with a pass/fail bar (derived: those whose Metric has reach rules); `tables`: (metric, caption)
    the sweep prints at its end; `together(options)`: a rule across options (a problem or None);
    `extra_tokens(options)`: tokens a cell runs past its length (generated ones); `fits(lengths, options,
    corpus, tokenizer)`: lengths the task can never run (TaskError), known without the weights;
    `needs_tokenizer(lengths, options)`: whether `fits` wants the tokenizer."""

    name: str
    options: Mapping[str, Check]
    metrics: Mapping[str, str]
    pass_fail: frozenset = frozenset()
    tables: tuple = ()
    together: Callable[[dict], str | None] | None = None
    extra_tokens: Callable[[dict], int] = _no_extra_tokens
    fits: Callable | None = None
    needs_tokenizer: Callable[[list[int], dict], bool] = _no_tokenizer
    defaults: Mapping[str, Any] = field(default_factory=dict)  # from the signature (filled in by `declare`)
    takes_any: bool = False  # the run function takes **kwargs
    meanings: Mapping[str, Metric] = field(default_factory=dict)

    def meaning(self, metric: str) -> Metric | None:
        """The declaration of `metric`, None when the task declares none for it."""
        return self.meanings.get(metric)

    def check(self, options: dict, *, caller_keys: tuple = ()) -> None:
        """TaskError (one line) for the first option the task does not take or whose value is bad, e.g.
        "passkey option trials=0 must be a positive integer — e.g. 1, 2 or 4"."""
        for key in options:
            if key in NOT_OPTIONS or not (self.takes_any or key in self.defaults):
                raise TaskError(
                    f"unknown option {key!r} for task {self.name!r} — "
                    f"{closest(key, [*self.defaults, *caller_keys], 'options')}"
                )
        for key, value in options.items():
            rule = self.options.get(key)
            problem = rule(value) if rule is not None else by_default(self.defaults.get(key), value)
            if problem is not None:
                if " — " not in problem:
                    problem += " — check the value (docs/tasks.md lists every option)"
                shown = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:60]}..."  # a long list
                raise TaskError(f"{self.name} option {key}={shown} {problem}")
        problem = self.together(options) if self.together is not None else None
        if problem is not None:
            raise TaskError(f"{self.name} {problem}")


def signature_options(run) -> tuple[dict, bool]:
    """A run function's options (name -> default, inspect.Parameter.empty when required; NOT_OPTIONS left out)
    and whether it also takes **kwargs."""
    params = inspect.signature(run).parameters
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    options = {
        k: p.default
        for k, p in params.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and k not in NOT_OPTIONS
    }
    return options, takes_any


def declare(
    name: str,
    *,
    options: Mapping[str, Check],
    metrics: Mapping[str, Metric | str],
    pass_fail: Sequence[str] = (),
    tables: Sequence[tuple[str, str]] = (),
    together=None,
    extra_tokens=None,
    fits=None,
    needs_tokenizer=None,
    register: bool = True,
):
    """Decorator: attach a `TaskSpec` to a run function (`run.spec`), check the options a caller passes
    against it before the run starts, and register it as `TASKS[name]` (register=False: the spec alone).
    `metrics`: name -> `Metric` (or, for a plugin, a one-line string); `pass_fail` is kept for plugins that
    describe metrics with strings (see `metric_meanings`). A declared option missing from the signature is a
    bug in the task (TypeError at import)."""

    def wrap(run):
        defaults, takes_any = signature_options(run)
        unknown = sorted(set(options) - set(defaults)) if not takes_any else []
        undeclared = sorted(set(pass_fail) - set(metrics)) + sorted({m for m, _ in tables} - set(metrics))
        if unknown or undeclared:
            raise TypeError(
                f"task {name!r} declares options {unknown} not in its signature or metrics "
                f"{undeclared} it does not list"
            )
        meanings = metric_meanings(metrics, pass_fail)
        spec = TaskSpec(
            name,
            dict(options),
            {m: v.description if isinstance(v, Metric) else str(v) for m, v in metrics.items()},
            frozenset(m for m, d in meanings.items() if d.has_bar),
            tuple(tables),
            together,
            extra_tokens or _no_extra_tokens,
            fits,
            needs_tokenizer or _no_tokenizer,
            defaults,
            takes_any,
            meanings,
        )

        @functools.wraps(run)
        def checked(model, tokenizer, **kwargs):
            spec.check({k: v for k, v in kwargs.items() if k not in NOT_OPTIONS})
            return run(model, tokenizer, **kwargs)

        checked.spec = spec
        if register:
            TASKS[name] = checked
        return checked

    return wrap


def spec_of(run) -> TaskSpec | None:
    """The declaration of a run function, None for a plugin task that has none."""
    return getattr(run, "spec", None)


def task_spec(name: str, run) -> TaskSpec:
    """The declaration of task `name`; an undeclared (plugin) task gets one from its signature alone."""
    spec = spec_of(run)
    if spec is not None:
        return spec
    defaults, takes_any = signature_options(run)
    return TaskSpec(name, {}, {}, defaults=defaults, takes_any=takes_any)


# ------------------------------------------------------------------------------------------ the cell runner
def run_cells(
    model,
    cells: Mapping[int, Sequence[Sequence[int]]],
    score,
    *,
    extra_tokens: int = 0,
    share_prefix: bool = True,
    bar=None,
) -> dict[int, list[tuple[Any, float]]]:
    """Run `score(ids, prefix_cache, (length, index))` on every prompt of every cell (length -> prompt token
    ids).

    Per cell: one `PrefixCache`, the prompts in the order that shares the most prefix (each runs only what it
    does not share with the previous one), all under `cell_length(model, length + extra_tokens)` (pass the
    tokens generated or scored past the length). share_prefix=False: every prompt from scratch, same numbers.
    Returns length -> [(score's result, seconds)] in the prompts' own order."""
    out = {}
    for length, prompts in cells.items():
        results: list = [None] * len(prompts)
        cache = PrefixCache(model, share=share_prefix)
        with cell_length(model, length + extra_tokens):
            for i in sharing_order(prompts):
                t0 = time.perf_counter()
                value = score(prompts[i], cache, (length, i))
                results[i] = (value, time.perf_counter() - t0)
                if bar is not None:
                    bar.update()
        out[length] = results
    return out


def greedy(
    model, tokenizer, ids: Sequence[int], max_new_tokens: int, prefix_cache: PrefixCache | None = None
) -> str:
    """The greedy answer to prompt `ids` (text of the new tokens; stops at EOS); with a `PrefixCache` the part
    of the prompt it shares with the previous prompt is not prefilled again."""
    import torch
    from ropebench.extend.forward import device_of, with_cache
    from ropebench.extend.prefix_cache import native_gqa
    from transformers import GenerationConfig

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id
    )
    cache = prefix_cache if prefix_cache is not None else PrefixCache(model, share=False)
    with torch.inference_mode():
        past = cache.prime(ids)
        x = torch.tensor([list(ids)], device=device_of(model))
        # generate runs only what the cache lacks: the last prompt token (its cache_position starts at the
        # cache length), then the new ones
        with native_gqa(model):
            out = model.generate(
                input_ids=x,
                attention_mask=torch.ones_like(x),
                generation_config=config,
                **with_cache(model, past),
            )
    cache.settle()
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def largest_fitting(n_tokens: Callable[[int], int], most: int, budget: int) -> int:
    """The largest k in [0, most] with n_tokens(k) <= budget (n_tokens non-decreasing), by binary search;
    -1 when even k = 0 is over budget."""
    if n_tokens(0) > budget:
        return -1
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if n_tokens(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo
