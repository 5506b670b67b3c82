"""What a report says about LongPPL (the perplexity task's `longppl` rows): the evaluator, the selection and
its settings as used, the key-token count per length and setting, the lengths whose evidence the evaluator's
context limits (task_options.key_evidence_within) and the setting that is itself the evaluator (its own losses
chose the key tokens: task_options.key_tokens.evaluator_is_setting). Reads records only."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from .overview import setting_label
from .tables import is_unit

KEY_TOKENS = "longppl_key_tokens"
SETTINGS = ("trunc_len", "sliding_window", "alpha", "beta")


def _options(text: Any) -> dict:
    try:
        opts = json.loads(text) if isinstance(text, str) else (text if isinstance(text, dict) else {})
    except ValueError:
        return {}
    return opts if isinstance(opts, dict) else {}


def _describe(kt: dict) -> str:
    """One selection's evaluator and settings, as the rows recorded them."""
    evaluator = kt.get("evaluator", "?")
    who = (
        "self (the evaluated model with no patch: plain on its shipped RoPE)"
        if evaluator == "self"
        else f"{evaluator} (named)"
    )
    used = ", ".join(f"{k} {kt[k]:g}" for k in SETTINGS if isinstance(kt.get(k), (int, float)))
    context = kt.get("evaluator_context")
    seen = f"; the evaluator sees at most {context} tokens" if context else ""
    return f"evaluator {who}; {used}{seen}"


def longppl_lines(ok: pd.DataFrame, task: str) -> list[str]:
    """The markdown lines of the LongPPL paragraph of `task` (none when it wrote no key-token counts)."""
    rows = ok[(ok["task"] == task) & (ok["metric"] == KEY_TOKENS)]
    if rows.empty:
        return []
    recorded = rows["task_options"] if "task_options" in rows.columns else pd.Series([None] * len(rows))
    rows = rows.assign(_opts=[_options(t) for t in recorded])
    selections: dict[str, dict] = {}
    for opts in rows["_opts"]:
        kt = opts.get("key_tokens") if isinstance(opts.get("key_tokens"), dict) else {}
        selections.setdefault(_describe(kt), kt)
    lines = ["### LongPPL", ""]
    for described, kt in selections.items():
        selection = kt.get("selection") or "not recorded (rows written before the selection was recorded)"
        lines.append(f"Key tokens: {described}. Selection: {selection}.")
    lines.append("")
    lines += _count_table(rows)
    lines += _self_note(rows)
    lines += _evidence_note(rows)
    return lines


def _count_table(rows: pd.DataFrame) -> list[str]:
    """Key tokens behind each length's LongPPL, per setting (summed over documents; `n` = documents)."""
    agg = rows[~is_unit(rows)]  # the task writes one count per length (doc null); per-document ones if any
    agg = agg if len(agg) else rows
    table: dict[str, dict[int, str]] = {}
    lengths: set[int] = set()
    for (model, method, factor, length), g in agg.groupby(
        ["model", "method", "factor", "length"], dropna=False, sort=True
    ):
        label = setting_label(method, factor)
        if agg["model"].nunique(dropna=False) > 1:
            label = f"{model}: {label}"
        kt = g["_opts"].iloc[0].get("key_tokens") or {}
        minimum = kt.get("min_key_tokens")
        k = int(g["value"].sum())
        docs = int(g["n"].fillna(0).sum())
        cell = f"{k} in {docs} doc{'s' if docs != 1 else ''}"
        if isinstance(minimum, (int, float)) and k < minimum:
            cell += f" (withheld: < {int(minimum)})"
        table.setdefault(label, {})[int(length)] = cell
        lengths.add(int(length))
    ordered = sorted(lengths)
    out = [
        "Key tokens per length and setting (over the documents; LongPPL is withheld below the minimum):",
        "",
        "| setting | " + " | ".join(str(L) for L in ordered) + " |",
        "|---|" + "---|" * len(ordered),
    ]
    for label, cells in table.items():
        out.append(f"| {label} | " + " | ".join(cells.get(L, "") for L in ordered) + " |")
    return [*out, ""]


def _self_note(rows: pd.DataFrame) -> list[str]:
    """The setting that is the evaluator: its own losses chose the key tokens every setting is scored on."""
    own = rows[rows["_opts"].map(lambda o: bool((o.get("key_tokens") or {}).get("evaluator_is_setting")))]
    if own.empty:
        return []
    who = sorted({setting_label(m, f) for m, f in zip(own["method"], own["factor"], strict=True)})
    note = (
        f"{', '.join(who)} is the evaluator itself: its own losses chose the key tokens, which favours it "
        "in a LongPPL comparison with it (the swap-test bias is in docs/measured.md); the other settings "
        "share those key tokens, so comparisons among them are symmetric. Name an evaluator "
        "(key_tokens.evaluator) for a selection symmetric in every pair."
    )
    return [note, ""]


def _evidence_note(rows: pd.DataFrame) -> list[str]:
    """Lengths past the evaluator's context: its long context there is a window, so key tokens are those whose
    evidence lies within it."""
    limited = rows[rows["_opts"].map(lambda o: isinstance(o.get("key_evidence_within"), (int, float)))]
    if limited.empty:
        return []
    out = []
    within_of = limited["_opts"].map(lambda o: int(o["key_evidence_within"]))
    for within, g in limited.groupby(within_of, sort=True):
        lengths = ", ".join(str(int(L)) for L in sorted(g["length"].unique()))
        out.append(
            f"Evidence limited by the evaluator's context at {lengths}: it sees at most {within} tokens, so "
            f"the key tokens there are those whose evidence lies within {within} tokens before them; LongPPL "
            "at these lengths says nothing of evidence further back."
        )
    return [*out, ""]


def annotate_key_counts(ax, df: pd.DataFrame, data: pd.DataFrame, task: str, metric: str) -> None:
    """On a `longppl` plot, each point's key-token count (the task's `longppl_key_tokens` value of that
    setting and length): a reader sees what every point rests on before joining two of them."""
    if metric != "longppl" or data.empty:
        return
    rows = df[(df["task"] == task) & (df["metric"] == KEY_TOKENS)]
    rows = rows[~is_unit(rows)] if len(rows) else rows
    counts = {
        (setting_label(m, f), int(L)): int(v)
        for m, f, L, v in zip(rows["method"], rows["factor"], rows["length"], rows["value"], strict=True)
    }
    for _, p in data.iterrows():
        k = counts.get((setting_label(p["method"], p["factor"]), int(p["length"])))
        if k is not None and pd.notna(p["value"]):
            ax.annotate(
                f"{k}", (p["length"], p["value"]), textcoords="offset points", xytext=(4, 4), fontsize=7
            )
    ax.text(
        0.01, 0.01, "labels: key tokens behind each point", transform=ax.transAxes, fontsize=7, color="0.3"
    )
