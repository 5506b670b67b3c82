"""The reach rules, each one function registered by `@reach_rule(kind, name, short=..., legend=...)`: its
check of one setting, its name and kind, and its bar in words, in one entry of `RULES`. Declarations
(results.meaning's `Metric(reach=...)`) are checked against `RULES`; results/reach.py walks the lengths under
the rule asked for. Today: ``threshold`` (an absolute bar, RULER-style, or RULER's 0.856; for perplexities a
paired ratio to the trained context), ``short`` (NoLiMa: a share of the own short-context rate; rates only)
and ``trained`` (as good as the baseline at its trained context), with their papers in docs/results.md.

No pandas, numpy or torch at import: tasks import results.meaning, which imports this. So a rule measures
through its `Setting` (`interval`, `ratio`), never results.tables or .comparisons (they import meaning).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .store import ResultsError

if TYPE_CHECKING:
    import pandas as pd

    from .stats import Interval, Paired

# The "threshold" rule's default bar: an absolute bar in RULER's style, applied per task and metric
DEFAULT_BAR = 0.8
# RULER's own bar (Hsieh et al. 2024, arXiv:2404.06654): Llama-2-7B's 4K score, 85.6% on the average of its 13
# tasks; RULER compares a model's 13-task average with it. ``threshold="ruler"`` gives this number.
RULER_BAR = 0.856
BARS = {"ruler": RULER_BAR}
# NoLiMa's bar: a length is effective while the score stays at or above 85% of the model's short-context score
NOLIMA_FRACTION = 0.85
# The "trained" rule's bar is the baseline's own Wilson lower bound at its trained context; below this it does
# not retrieve more often than not even there, and "as good as the baseline" would claim every length
# (0/16 -> bar 0).
MIN_BAR = 0.5
# NoLiMa's base is a short-context score (250-1K tokens): at most this share of the trained context, and at
# most SHORT_CAP tokens whatever the trained context (a quarter of 128K, 32K, is no short context)
SHORT_SHARE = 0.25
SHORT_CAP = 2048
PASS, FAIL, OPEN = "pass", "failed", "not established"


def bar_value(threshold: float | str) -> float:
    """The "threshold" rule's bar as a number: an accuracy in (0, 1] (a number, or its text), or a named bar
    (``BARS``: "ruler" -> ``RULER_BAR``, 0.856). Anything else is a ResultsError."""
    value = threshold
    if isinstance(value, str):
        named = BARS.get(value.strip().lower())
        try:
            value = named if named is not None else float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value <= 1):
        raise ResultsError(
            f"threshold must be an accuracy in (0, 1] or one of: {', '.join(BARS)}; got {threshold!r} "
            f"— e.g. threshold=0.8 or threshold='ruler'"
        )
    return float(value)


def bar_text(threshold: float | str, short: bool = False) -> str:
    """The "threshold" rule's bar in words, naming its value and whose it is: RULER's own number (0.856) is
    called RULER's; any other is an absolute bar in RULER's style, with RULER's number beside it. ``short``:
    the name and value only ("absolute bar 0.8", "RULER's bar 0.856"), for a line that links to the legend."""
    bar = bar_value(threshold)
    if short:
        return f"RULER's bar {bar:g}" if math.isclose(bar, RULER_BAR) else f"absolute bar {bar:g}"
    if math.isclose(bar, RULER_BAR):
        return (
            f"absolute bar {bar:g} (RULER's: Llama-2-7B's 4K average over its 13 tasks; applied here per "
            f"task)"
        )
    return (
        f"absolute bar {bar:g} (RULER-style; RULER's own bar is {RULER_BAR:g}, Llama-2-7B's 4K average "
        f"over 13 tasks)"
    )


def check_rules(threshold: float | str, tolerance: float, short_length: int | None = None) -> float:
    """Bad rule parameters are a user error, not a silently empty column. Returns the bar as a number (see
    :func:`bar_value`)."""
    bar = bar_value(threshold)
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < 100):
        raise ResultsError(
            f"tolerance must be a fraction >= 0 (0.1 = +10%), got {tolerance!r} — e.g. tolerance=0.1"
        )
    if short_length is not None and not (
        isinstance(short_length, int) and not isinstance(short_length, bool) and 0 < short_length <= SHORT_CAP
    ):
        raise ResultsError(
            f"short_length must be a length in tokens from 1 to {SHORT_CAP} (NoLiMa's base is a short "
            f"context: 250-1K tokens in the paper), got {short_length!r} — e.g. short_length=1024"
        )
    return bar


def short_base_cap(trained_context: int | None) -> int | None:
    """The longest length NoLiMa's base may be taken at by default: a quarter of the trained context, at most
    ``SHORT_CAP`` tokens (None when the trained context is unknown)."""
    return min(int(trained_context * SHORT_SHARE), SHORT_CAP) if trained_context else None


def _no_reference(tc: int | None, metric: str) -> str:
    if not tc:
        return "not computed: trained context unknown (pass trained_context=...)"
    return f"not computed: no {metric} at a tested length ≤ the trained context {tc}"


def at_least(ci: Interval | Paired, bar: float) -> str:
    """A rate's verdict: passes when its lower bound clears the bar, fails when its upper bound misses it,
    else not established (the interval holds the bar, or there is none)."""
    if math.isfinite(ci.lo) and ci.lo >= bar:
        return PASS
    return FAIL if math.isfinite(ci.hi) and ci.hi < bar else OPEN


def at_most(ci: Interval | Paired, bar: float) -> str:
    """A ratio's verdict: passes when its upper bound stays within the bar, fails when its lower bound
    exceeds it, else not established."""
    if math.isfinite(ci.hi) and ci.hi <= bar:
        return PASS
    return FAIL if math.isfinite(ci.lo) and ci.lo > bar else OPEN


# -- the rules: one function each, looked up by (metric kind, rule name) -------------------------------------
@dataclass
class Setting:
    """What a rule sees of one setting: its cells by length, the trained context, the parameters, and how to
    measure rows: `interval` (a cell's interval of the metric), `ratio` (results.reach.ratio_to)."""

    info: dict
    cells: dict[int, tuple[pd.DataFrame, Interval]]
    sub: pd.DataFrame  # every row of the task/metric (the baseline's too)
    metric: str
    tc: int | None
    ref_len: int | None
    threshold: float
    tolerance: float
    baseline: str
    interval: Callable[[pd.DataFrame], Interval]
    ratio: Callable[[pd.DataFrame, pd.DataFrame], Interval | Paired]
    short_length: int | None = None  # NoLiMa's base cap as given; None: `short_base_cap`


@dataclass
class Verdicts:
    rule: str  # the bar, in words (shown in the report)
    checks: dict[int, tuple[str, Any]] | None = None  # None: not computed (``rule`` says why)
    reference_length: int | None = None
    reference_value: float = math.nan


@dataclass(frozen=True)
class Rule:
    """A reach rule: its verdicts for one setting (`check`) and its bar in words, `short` for a headline that
    links to the legend and `legend` for the legend's line, with {bar}, {bar_short}, {baseline}, {limit},
    {min_bar}, {nolima} and {short_cap} filled in by `caption`."""

    check: Callable[[Setting], Verdicts]
    short: str
    legend: str


# The rules, by the statistics' kind ("rate", "log": Metric.stat_kind) and the rule's name: one
# `@reach_rule(...)` on its function each, in the legend's order.
RULES: dict[tuple[str, str], Rule] = {}


def rule_names(kind: str | None = None) -> tuple[str, ...]:
    """The registered rules' names in `RULES` order: every rule's, or those of one statistics' kind."""
    return tuple(dict.fromkeys(name for k, name in RULES if kind in (None, k)))


def reach_rule(kind: str, name: str, *, short: str, legend: str):
    def register(check: Callable[[Setting], Verdicts]) -> Callable[[Setting], Verdicts]:
        RULES[(kind, name)] = Rule(check, short, legend)
        return check

    return register


def caption(rule: Rule, threshold: float | str, tolerance: float, baseline: str, short: bool = False) -> str:
    """A rule's words with the bars filled in: the legend's line, or (``short``) the bar alone."""
    return (rule.short if short else rule.legend).format(
        bar=bar_text(threshold),
        bar_short=bar_text(threshold, short=True),
        baseline=baseline,
        limit=f"{1 + tolerance:g}",
        min_bar=f"{MIN_BAR:g}",
        nolima=f"{NOLIMA_FRACTION:g}",
        short_cap=SHORT_CAP,
    )


@reach_rule(
    "rate",
    "threshold",
    short="Wilson lower bound ≥ {bar_short}",
    legend="reach (0/1 rate): Wilson lower bound ≥ {bar}",
)
def _rate_threshold(s: Setting) -> Verdicts:
    return Verdicts(
        f"Wilson lower bound ≥ {bar_text(s.threshold)}",
        {L: (at_least(ci, s.threshold), ci) for L, (_, ci) in s.cells.items()},
    )


@reach_rule(
    "rate",
    "short",
    short="≥ {nolima} × own short-context rate",
    legend=(
        "reach (short) (0/1 rate, NoLiMa): Wilson lower bound ≥ {nolima} × the setting's own rate at a base "
        "length ≤ min(a quarter of the trained context, {short_cap}) tokens (NoLiMa's: 250-1K; base lower "
        "bound ≥ {min_bar})"
    ),
)
def _rate_short(s: Setting) -> Verdicts:
    short, cap = min(s.cells), s.short_length or short_base_cap(s.tc)
    base = s.cells[short][1]
    if cap is None:
        return Verdicts(
            "not computed: no short length to take NoLiMa's base at (trained context unknown: pass "
            "trained_context=... or short_length=...)"
        )
    why = None
    if short > cap:
        why = (
            f"NoLiMa's base needs a length ≤ {cap} (min(a quarter of the trained context, "
            f"{SHORT_CAP})); the shortest tested is {short} — add a length ≤ {cap}"
        )
    elif len(s.cells) < 2:  # the base length passes by definition: alone it would claim itself
        why = f"one tested length ({short}) is only the short-context base — test a shorter length too"
    elif not (math.isfinite(base.lo) and base.lo >= MIN_BAR):
        why = (
            f"own Wilson lower bound at the shortest length {short} is {base.lo:.3f} < {MIN_BAR:g}, no "
            "short-context score to keep (more trials, or a shorter length)"
        )
    if why:
        return Verdicts(f"not computed: {why}", reference_length=short, reference_value=base.estimate)
    bar = NOLIMA_FRACTION * base.estimate
    # the base length is where the base score was measured (established above): it passes by definition
    checks = {L: (PASS if L == short else at_least(ci, bar), ci) for L, (_, ci) in s.cells.items()}
    return Verdicts(
        f"Wilson lower bound ≥ {NOLIMA_FRACTION:g} × own {base.estimate:.3f} at {short} ({bar:.3f}; NoLiMa)",
        checks,
        short,
        base.estimate,
    )


@reach_rule(
    "rate",
    "trained",
    short="≥ {baseline}'s lower bound at the trained context",
    legend=(
        "reach (trained) (0/1 rate): Wilson lower bound ≥ {baseline}'s at the trained context (when that is "
        "≥ {min_bar})"
    ),
)
def _rate_trained(s: Setting) -> Verdicts:
    if s.ref_len is None:
        return Verdicts(_no_reference(s.tc, s.metric))
    base = _baseline_cell(s)
    who = s.baseline if len(base) else "own"
    # the bar is the reference's own lower bound: plain passes at its trained context by construction
    bar = s.interval(base if len(base) else s.cells[s.ref_len][0]).lo
    if not (math.isfinite(bar) and bar >= MIN_BAR):
        return Verdicts(
            f"not computed: {who}'s Wilson lower bound at the trained context {s.ref_len} is "
            f"{bar:.3f} < {MIN_BAR:g}, no bar to pass (more trials, or rule='threshold')",
            reference_length=s.ref_len,
            reference_value=bar,
        )
    return Verdicts(
        f"Wilson lower bound ≥ {who}'s at {s.ref_len} ({bar:.3f})",
        {L: (at_least(ci, bar), ci) for L, (_, ci) in s.cells.items()},
        s.ref_len,
        bar,
    )


def _baseline_cell(s: Setting) -> pd.DataFrame:
    """The baseline method's rows at the reference length
    (same model and corpus); empty when it did not run."""
    sub = s.sub
    return sub[
        (sub["method"] == s.baseline)
        & (sub["length"] == s.ref_len)
        & (sub["model"] == s.info["model"])
        & (sub["corpus"].astype(str) == str(s.info["corpus"]))
    ]


def _ppl_ratio(s: Setting, ref_rows: pd.DataFrame, whose: str) -> Verdicts:
    bar = 1 + s.tolerance
    checks = {}
    for L, (g, _) in s.cells.items():
        if L >= s.ref_len:
            ratio = s.ratio(g, ref_rows)
            checks[L] = (at_most(ratio, bar), ratio)
    return Verdicts(
        f"upper bound of {s.metric} / {whose} value at {s.ref_len} ≤ {bar:g}",
        checks,
        s.ref_len,
        s.interval(ref_rows).estimate,
    )


@reach_rule(
    "log",
    "threshold",
    short="ratio to its own value at the trained context ≤ {limit}",
    legend=(
        "reach (perplexity): upper bound of the paired ratio to the setting's own value at the trained "
        "context ≤ {limit}"
    ),
)
def _ppl_tolerance(s: Setting) -> Verdicts:
    if s.ref_len is None:
        return Verdicts(_no_reference(s.tc, s.metric))
    return _ppl_ratio(s, s.cells[s.ref_len][0], "its")


@reach_rule(
    "log",
    "trained",
    short="ratio to {baseline}'s value at the trained context ≤ {limit}",
    legend=(
        "reach (trained) (perplexity): the same ratio to {baseline}'s value at the trained context ≤ {limit}"
    ),
)
def _ppl_baseline(s: Setting) -> Verdicts:
    if s.ref_len is None:
        return Verdicts(_no_reference(s.tc, s.metric))
    base = _baseline_cell(s)
    return (
        _ppl_ratio(s, base, f"{s.baseline}'s") if len(base) else _ppl_ratio(s, s.cells[s.ref_len][0], "its")
    )
