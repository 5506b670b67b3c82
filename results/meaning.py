"""What a metric means, declared once by the task that writes it and carried by every record it writes.

A task declares each of its metrics with a `Metric` (tasks/kit.py `declare(metrics=...)`); the sweep copies
the declaration into every row of that metric (the ``meaning`` column, a JSON object), so a report of an old
run or of a plugin task's rows needs neither the task's code nor a guess. Results read it through
`declarations` and never decide a metric's treatment from its name or its values.

Rows without a declaration (runs written before declarations existed, hand-made frames, lm-eval imports) get
one explicit fallback, `fallback`: ropebench's own metric names keep the meaning their tasks declare today
(`BUILT_IN`), every other metric is an undeclared mean (no direction, no bar, no reach). `undeclared_note`
says so in one line.

This module is light (no pandas, numpy or torch at import): tasks import it to declare.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .reach_rules import RULES, rule_names

# How the values aggregate and which intervals apply:
# - perplexity: exp of the token-weighted mean log over units (n = tokens behind a row); t interval on the log
# - rate: 0/1 per unit; Wilson for a cell, Newcombe's paired interval + exact McNemar for paired differences
# - mean, rank: arithmetic mean over units; t interval (a rank is never a rate, whatever its values)
KINDS = ("perplexity", "rate", "mean", "rank")
DIRECTIONS = ("higher", "lower", None)
# headline: a summary value and a paired difference; detail: tables and plots only; reference: shown beside
# its task's values, never compared (a chance rate)
ROLES = ("headline", "detail", "reference")
META_COLUMN = "meaning"


@dataclass(frozen=True)
class Metric:
    """One metric's meaning.

    kind: one of KINDS. direction: "higher" / "lower" is better, None when neither (a detail, a count).
    unit: what one value is in ("perplexity", "fraction of prompts", "nats/token", "rank (1 = first)").
    chance: the chance level when fixed; chance_metric: the name of a metric of the same task whose value is
    the chance level of this one (classification's majority rate). reach: the reach rules that apply (a
    non-empty tuple means the metric has a pass/fail bar). independent_unit: what one independent unit is
    ("document", "trial", "haystack"); rows that share a unit carry the same ``cluster`` id and count once.
    role: one of ROLES. lo, hi: the range every value must lie in (None: open). description: one line.
    by_position: the rows are bins along the sequence (``depth`` holds the bin's start): plotted by position.
    """

    kind: str
    direction: str | None = None
    unit: str = ""
    description: str = ""
    chance: float | None = None
    chance_metric: str | None = None
    reach: tuple[str, ...] = ()
    independent_unit: str = "document"
    role: str = "headline"
    lo: float | None = None
    hi: float | None = None
    by_position: bool = False  # its rows are bins along the sequence (``depth`` = the bin's start position)
    declared: bool = field(default=True, compare=False)  # False only for the undeclared fallback

    def __post_init__(self):
        problem = self.problem()
        if problem is not None:
            raise ValueError(f"metric declaration {problem}")
        object.__setattr__(self, "reach", tuple(self.reach))

    def problem(self) -> str | None:
        if self.kind not in KINDS:
            return f"kind {self.kind!r} is not one of {', '.join(KINDS)}"
        if self.direction not in DIRECTIONS:
            return f"direction {self.direction!r} is not 'higher', 'lower' or None"
        if self.role not in ROLES:
            return f"role {self.role!r} is not one of {', '.join(ROLES)}"
        bad = [r for r in self.reach if r not in rule_names()]
        if bad:
            return f"reach rule {bad[0]!r} is not one of {', '.join(rule_names())}"
        if self.reach and self.direction is None:
            return "with reach rules needs a direction (which side of the bar passes)"
        bad = [r for r in self.reach if (self.stat_kind, r) not in RULES]  # results/reach_rules.py
        if bad:
            fits = ", ".join(rule_names(self.stat_kind)) or "none"
            return f"reach rule {bad[0]!r} does not apply to a {self.kind} (its rules: {fits})"
        for name in ("chance", "lo", "hi"):
            v = getattr(self, name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            ):
                return f"{name} {v!r} is not a finite number"
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            return f"range [{self.lo}, {self.hi}] is empty"
        return None

    @property
    def has_bar(self) -> bool:
        return bool(self.reach)

    @property
    def headline(self) -> bool:
        return self.role == "headline"

    @property
    def reference(self) -> bool:
        return self.role == "reference"

    @property
    def stat_kind(self) -> str:
        """The statistics' kind: "log" (perplexity), "rate" or "mean" (mean and rank)."""
        return {"perplexity": "log", "rate": "rate"}.get(self.kind, "mean")

    def to_record(self) -> dict[str, Any]:
        """The JSON object the ``meaning`` column carries (``declared`` is implied)."""
        out = asdict(self)
        out.pop("declared")
        out["reach"] = list(self.reach)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_record(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_record(cls, obj: Mapping[str, Any] | str, older: Metric | None = None) -> Metric:
        """From a ``meaning`` column value (dict or JSON text); unknown keys are ignored (newer writers). A
        field the record lacks (written before the field existed) takes its value from `older` when given
        (ropebench's own metrics: `BUILT_IN`), else the field's default."""
        if isinstance(obj, str):
            obj = json.loads(obj)
        known = {k: v for k, v in obj.items() if k in cls.__dataclass_fields__ and k != "declared"}
        if older is not None:
            known = {**{k: v for k, v in older.to_record().items() if k not in known}, **known}
        known["reach"] = tuple(known.get("reach") or ())
        return cls(**known)


def _frozen(path: Path) -> dict[tuple[str, str], Metric]:
    """The tasks' declarations as generated into ``path`` (a list of {task, metric, meaning})."""
    return {
        (item["task"], item["metric"]): Metric.from_record(item["meaning"])
        for item in json.loads(path.read_text(encoding="utf-8"))
    }


# What ropebench's own tasks declare for their metrics, frozen as data (generated from the tasks by
# `python -m ropebench.docs --write`; tests/project/test_docs_generated.py fails while it is stale): the
# fallback for their rows written before declarations travelled with the records. Results never import the
# tasks, so the declarations are read from the file, not from the tasks' code.
BUILT_IN_FILE = Path(__file__).with_name("built_in_meanings.json")
BUILT_IN: dict[tuple[str | None, str], Metric] = {
    **_frozen(BUILT_IN_FILE),
    # RoPE theory the sweep sets beside the measurements (task "theory", scripts/sweep_lib/run.py): one value
    # per setting, shown in the report's theory section only, never compared
    # (the description is the label the report shows; critical_dimension and base_lower_bound are properties
    # of the model and its trained context, the same for every setting of a model: shown once)
    ("theory", "men_reach"): Metric(
        "mean",
        None,
        "tokens",
        "first distance where sum_i cos(m theta_i) < 0 under the patched frequencies (Men et al.'s "
        "criterion), tokens",
        role="reference",
        lo=0.0,
    ),
    ("theory", "effective_base"): Metric(
        "mean",
        None,
        "RoPE base",
        "effective RoPE base beta of the patched frequencies (ntk x s: b s^(d/(d-2)); Liu et al.)",
        role="reference",
        lo=0.0,
    ),
    ("theory", "extrapolation_bound"): Metric(
        "mean", None, "tokens", "extrapolation bound T_extra (Liu et al.), tokens", role="reference", lo=0.0
    ),
    ("theory", "critical_dimension"): Metric(
        "mean",
        None,
        "head dimensions",
        "critical dimension d_crit (Liu et al.), fixed by pretraining",
        role="reference",
        lo=0.0,
    ),
    ("theory", "base_lower_bound"): Metric(
        "mean",
        None,
        "RoPE base",
        "lower bound on the base of a model trained for this context (Men et al.)",
        role="reference",
        lo=0.0,
    ),
}
UNDECLARED = Metric("mean", None, "", "undeclared: a plain mean", declared=False)


def fallback(task: str | None, metric: str) -> Metric:
    """The explicit fallback for rows without a declaration: `BUILT_IN` for ropebench's own (task, metric),
    else `UNDECLARED` (a mean with no direction, bar or reach). Never decided by the values."""
    found = BUILT_IN.get((task, metric))
    return replace(found, declared=False) if found is not None else UNDECLARED


def declarations(rows: Iterable[Mapping[str, Any]] | Any) -> dict[tuple[str, str], Metric]:
    """(task, metric) -> Metric for every (task, metric) in `rows` (a DataFrame or an iterable of row dicts).

    The first parseable ``meaning`` of a (task, metric) wins (rows of one metric carry the same one; rows of
    different runs may differ only if the task changed, and then the newest wording is as good as any);
    (task, metric) pairs without one get `fallback` (``declared=False``)."""
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        rows = _distinct_records(rows)
    out: dict[tuple[str, str], Metric] = {}
    missing: set[tuple[str, str]] = set()
    for r in rows:
        key = (r.get("task"), r.get("metric"))
        if key in out:
            continue
        raw = r.get(META_COLUMN)
        if isinstance(raw, (str, Mapping)) and raw:
            try:
                out[key] = Metric.from_record(raw, BUILT_IN.get(key))
                missing.discard(key)
                continue
            except (ValueError, TypeError):  # a malformed declaration counts as none
                pass
        missing.add(key)
    for key in missing:
        if key not in out:
            out[key] = fallback(*key)
    return out


def _distinct_records(frame: Any) -> list[dict[str, Any]]:
    """The distinct (task, metric, meaning) records of a frame, first occurrence first: what
    ``frame[cols].drop_duplicates().to_dict("records")`` gives, without pandas' cost per call (a frame of
    one metric holds one declaration string). Unhashable values or a missing task or metric take pandas'
    path; declarations that are not strings (none) may repeat, which changes nothing above."""
    cols = [c for c in ("task", "metric", META_COLUMN) if c in frame.columns]
    if len(cols) == 3 and not frame.columns.duplicated().any():
        try:
            seen: set = set()
            out = []
            for t in zip(*(frame[c].tolist() for c in cols)):
                if not (isinstance(t[0], str) and isinstance(t[1], str)):
                    raise TypeError  # a missing task or metric: pandas decides what equals what
                if t not in seen:
                    seen.add(t)
                    out.append(dict(zip(cols, t)))
            return out
        except TypeError:
            pass
    return frame[cols].drop_duplicates().to_dict("records")


def meaning_of(rows: Any, task: str, metric: str) -> Metric:
    """The declaration of one (task, metric) in `rows` (the fallback when it has none)."""
    return declarations(rows).get((task, metric)) or fallback(task, metric)


def undeclared_note(declared: Mapping[tuple[str, str], Metric]) -> str | None:
    """One line naming the metrics that carried no declaration, or None when every one did."""
    built_in = sorted(f"{t}/{m}" for (t, m), d in declared.items() if not d.declared and (t, m) in BUILT_IN)
    other = sorted(f"{t}/{m}" for (t, m), d in declared.items() if not d.declared and (t, m) not in BUILT_IN)
    parts = []
    if built_in:
        parts.append(f"{', '.join(built_in)} read with ropebench's built-in meaning")
    if other:
        parts.append(f"{', '.join(other)} treated as plain means (no direction, bar or reach)")
    if not parts:
        return None
    return (
        "Rows without a metric declaration (written before declarations, or by hand): "
        + "; ".join(parts)
        + "."
    )
