"""LongPPL (Fang et al., ICLR 2025, arXiv:2410.23771) derived when results load, key tokens chosen once per
document from the settings compared.

The paper's per-token rule (key: short-context loss minus long-context loss above alpha, long-context loss
below -beta) on the short-context losses the settings share (the unpatched model's short windows, written by
tasks/key_losses.py) and the mean of the compared settings' long-context losses, per (task, model, corpus,
document, length); each setting's LongPPL is exp(mean of its own long losses over those key tokens). So the
selection favours no setting (the evaluated model's own losses would favour the one that chose: the swap test
of docs/measured.md): permuting the settings changes nothing, swapping two settings' losses swaps their values
exactly, and one setting alone gets the paper's rule on its own losses.

`derive(frame)` replaces the bulky `longppl_token_losses` rows by `longppl` rows (per document and per length,
withheld below the cell's recorded min_key_tokens) and `longppl_key_tokens` rows (per length), in the schema
the task wrote before; `results.load` calls it. Rows written by a task that selected by itself (a named
evaluator, or runs before this) pass through untouched.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from .meaning import BUILT_IN
from .store import canonical_json, json_object, setting_label

TOKEN_LOSSES = "longppl_token_losses"
LONGPPL, KEY_TOKENS = "longppl", "longppl_key_tokens"
SETTING = ("method", "factor", "options")
# rows of one cell at one length: everything that identifies a row except the document
CELL = ("run", "cell", "model", "method", "factor", "options", "task", "corpus", "length")
MIN_KEY_TOKENS = 30  # what the task wrote before it recorded min_key_tokens (tasks/key_tokens.py)
SHORT_CONTEXT = "the unpatched model"


def decode(text: str) -> np.ndarray:
    """The float32 losses of base64 text of little-endian float32 bytes (tasks/key_losses.py)."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def select(short: np.ndarray, longs: list[np.ndarray], alpha: float, beta: float) -> np.ndarray:
    """The paper's rule on `short` and the mean of `longs` (in the order given: callers sort them): key where
    short - mean > alpha and mean < -beta, in float32 as the package compares; NaN (no short window) never
    key. With one array of losses this is `tasks.key_tokens.paper_rule` on it."""
    mean = np.mean(np.stack([np.asarray(x, dtype=np.float64) for x in longs]), axis=0).astype(np.float32)
    short = np.asarray(short, dtype=np.float32)
    return ((short - mean) > np.float32(alpha)) & (mean < np.float32(-beta))


def key_loss(long: np.ndarray, keys: np.ndarray) -> tuple[float, int]:
    """The sum of a setting's own losses over the key tokens, and their count."""
    return float(np.asarray(long, dtype=np.float64)[keys].sum()), int(keys.sum())


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """The frame with its `longppl_token_losses` rows replaced by the `longppl` and `longppl_key_tokens` rows
    derived from them (unchanged when it has none)."""
    if "metric" not in df.columns or not (df["metric"] == TOKEN_LOSSES).any():
        return df
    is_losses = df["metric"] == TOKEN_LOSSES
    parsed = [_parse(r) for r in df[is_losses].to_dict("records")]
    per_doc = _per_document(parsed)
    rows = _rows(parsed, per_doc)
    rest = df[~is_losses]
    new = pd.DataFrame.from_records(rows, columns=list(df.columns)) if rows else df.iloc[0:0]
    return pd.concat([rest, new], ignore_index=True) if len(new) else rest.reset_index(drop=True)


def _parse(row: dict) -> dict:
    """One token-losses row: its own columns, its task options without the losses, the losses decoded and
    the keys it is grouped by."""
    opts = json_object(row.get("task_options"))
    losses = opts.pop("token_losses", {}) or {}
    kt = opts.get("key_tokens") if isinstance(opts.get("key_tokens"), dict) else {}
    rule = (kt.get("trunc_len"), kt.get("sliding_window"), kt.get("alpha"), kt.get("beta"))
    short_text = losses.get("short", "")
    group = tuple(_text(row.get(c)) for c in ("task", "model", "corpus", "doc", "length"))
    return {
        "row": row,
        "options": opts,
        "short": decode(short_text),
        "long": decode(losses.get("long", "")),
        "alpha": float(kt.get("alpha", 0.0)),
        "beta": float(kt.get("beta", -2.0)),
        # settings are compared where they share the text, the rule and the short-context losses
        "group": (*group, _text(losses.get("first")), json.dumps(rule), short_text),
        "setting": tuple(_text(row.get(c)) for c in SETTING),
    }


def _text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _per_document(parsed: list[dict]) -> dict[int, dict]:
    """For each parsed row (by index): its key-token loss sum and count, and the settings compared."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(parsed):
        groups.setdefault(p["group"], []).append(i)
    out: dict[int, dict] = {}
    for members in groups.values():
        first_of: dict[tuple, int] = {}  # one losses array per setting (a setting in two runs counts once)
        for i in members:
            first_of.setdefault(parsed[i]["setting"], i)
        order = sorted(first_of)  # canonical: the mean never depends on the order the rows came in
        head = parsed[members[0]]
        keys = select(
            head["short"], [parsed[first_of[s]]["long"] for s in order], head["alpha"], head["beta"]
        )
        names = _names([parsed[first_of[s]]["row"] for s in order])
        for i in members:
            total, count = key_loss(parsed[i]["long"], keys)
            out[i] = {"sum": total, "count": count, "compared": names}
    return out


def _names(rows: list[dict]) -> list[str]:
    """Each compared setting's label ("ntk ×2"); with its options where two share a label."""
    labels = [setting_label(r.get("method"), r.get("factor")) for r in rows]
    return [
        f"{label} {_text(r.get('options'))}" if labels.count(label) > 1 else label
        for label, r in zip(labels, rows, strict=True)
    ]


def _rows(parsed: list[dict], per_doc: dict[int, dict]) -> list[dict]:
    """Per cell and length: the count row always, the per-document and pooled LongPPL rows where the key
    tokens over the documents reach the cell's minimum."""
    cells: dict[tuple, list[int]] = {}
    for i, p in enumerate(parsed):
        cells.setdefault(tuple(_text(p["row"].get(c)) for c in CELL), []).append(i)
    out = []
    for members in cells.values():
        head = parsed[members[0]]
        compared = list(dict.fromkeys(n for i in members for n in per_doc[i]["compared"]))
        opts = _selection_options(head["options"], compared)
        total = sum(per_doc[i]["sum"] for i in members)
        count = sum(per_doc[i]["count"] for i in members)
        seconds = sum(_seconds(parsed[i]["row"]) for i in members)
        out.append(_row(head["row"], KEY_TOKENS, count, len(members), seconds, opts, doc=None))
        kt = opts.get("key_tokens") or {}
        if count < kt.get("min_key_tokens", MIN_KEY_TOKENS):
            continue  # withheld: the count row says how many there were
        for i in members:
            d = per_doc[i]
            if d["count"]:
                value = math.exp(d["sum"] / d["count"])
                row = parsed[i]["row"]
                out.append(_row(row, LONGPPL, value, d["count"], _seconds(row), opts, doc=row.get("doc")))
        out.append(_row(head["row"], LONGPPL, math.exp(total / count), count, seconds, opts, doc=None))
    return out


def _selection_options(options: dict, compared: list[str]) -> dict:
    """The cell's task options with the selection the derived rows rest on."""
    kt = dict(options.get("key_tokens") or {})
    kt.update(
        selection=(
            "the paper's rule on the mean long-context loss of the compared settings: "
            f"{', '.join(compared)}; short context: {SHORT_CONTEXT}"
        ),
        compared_settings=compared,
        short_context=SHORT_CONTEXT,
    )
    return dict(options, key_tokens=kt)


def _seconds(row: dict) -> float:
    v = row.get("seconds")
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else 0.0


def _row(template: dict, metric: str, value: float, n: int, seconds: float, opts: dict, *, doc) -> dict:
    meaning = BUILT_IN.get(("perplexity", metric))
    return dict(
        template,
        metric=metric,
        value=float(value),
        n=int(n),
        seconds=float(seconds),
        doc=doc,
        task_options=opts if isinstance(template.get("task_options"), dict) else canonical_json(opts),
        meaning=meaning.to_json() if meaning is not None else template.get("meaning"),
    )
