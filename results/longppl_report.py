"""What a report says about LongPPL (the perplexity task's `longppl` rows): the selection and its settings as
used — by default the mean long-context loss of the compared settings, named (results/longppl.py derives
those rows when results load), else a named evaluator's —, the key-token count per length and setting, the
lengths whose evidence a named evaluator's context limits (task_options.key_evidence_within) and, in runs
written before the default selection was symmetric, the setting that was itself the evaluator (its own losses
chose the key tokens: task_options.key_tokens.evaluator_is_setting). Reads records only."""

from __future__ import annotations

import pandas as pd

from .overview import setting_label
from .store import json_object
from .tables import is_unit

KEY_TOKENS = "longppl_key_tokens"
SETTINGS = ("trunc_len", "sliding_window", "alpha", "beta")


def _used(kt: dict) -> str:
    return ", ".join(f"{k} {kt[k]:g}" for k in SETTINGS if isinstance(kt.get(k), (int, float)))


def _describe(kt: dict) -> str:
    """One selection's evaluator and settings, as the rows recorded them."""
    evaluator = kt.get("evaluator", "?")
    who = (
        "self (the evaluated model with no patch: plain on its shipped RoPE)"
        if evaluator == "self"
        else f"{evaluator} (named)"
    )
    context = kt.get("evaluator_context")
    seen = f"; the evaluator sees at most {context} tokens" if context else ""
    return f"evaluator {who}; {_used(kt)}{seen}"


def _selection_line(kt: dict) -> str:
    """The selection the rows rest on: the compared settings' mean loss (named), or the evaluator's."""
    compared = kt.get("compared_settings")
    if isinstance(compared, list) and compared:
        n = len(compared)
        return (
            "Key tokens: chosen once per document and length by the paper's rule from the unpatched model's "
            f"short-context losses and the mean long-context loss of the {n} compared setting"
            f"{'s' if n != 1 else ''} ({', '.join(map(str, compared))}); {_used(kt)}. Every setting's "
            "LongPPL is over these same key tokens: the selection is symmetric in the settings."
        )
    selection = kt.get("selection") or "not recorded (rows written before the selection was recorded)"
    return f"Key tokens: {_describe(kt)}. Selection: {selection}."


def longppl_lines(ok: pd.DataFrame, task: str) -> list[str]:
    """The markdown lines of the LongPPL paragraph of `task` (none when it wrote no key-token counts)."""
    rows = ok[(ok["task"] == task) & (ok["metric"] == KEY_TOKENS)]
    if rows.empty:
        return []
    recorded = rows["task_options"] if "task_options" in rows.columns else pd.Series([None] * len(rows))
    rows = rows.assign(_opts=[json_object(t) for t in recorded])
    selections = dict.fromkeys(
        _selection_line(opts.get("key_tokens") if isinstance(opts.get("key_tokens"), dict) else {})
        for opts in rows["_opts"]
    )
    lines = ["### LongPPL", "", *selections, ""]
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
    """The setting that is the evaluator (rows written before the default selection became the compared
    settings' mean loss): its own losses chose the key tokens every setting is scored on."""
    own = rows[rows["_opts"].map(lambda o: bool((o.get("key_tokens") or {}).get("evaluator_is_setting")))]
    if own.empty:
        return []
    who = sorted({setting_label(m, f) for m, f in zip(own["method"], own["factor"], strict=True)})
    note = (
        f"{', '.join(who)} is the evaluator itself: its own losses chose the key tokens, which favours it "
        "in a LongPPL comparison with it (the swap-test bias is in docs/measured.md); the other settings "
        "share those key tokens, so comparisons among them are symmetric. These rows predate the default "
        "selection from the compared settings' mean loss (symmetric in every pair): rerun the cells for it."
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
