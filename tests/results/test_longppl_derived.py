"""results/longppl.py: LongPPL derived when results load from the cells' per-token losses, key tokens chosen
from the mean long-context loss of the compared settings. Expected values are worked out here with plain
numpy arithmetic; the selection is symmetric in the settings (permuting them changes nothing, swapping two
settings' losses swaps their values exactly), and one setting alone gets the paper's rule on its own losses
(tasks.key_tokens.paper_rule, itself tested against the `longppl` package)."""

import base64
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import torch
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.longppl import derive, select
from ropebench.results.store import RecordWriter
from ropebench.tasks.key_tokens import paper_rule

NAN = float("nan")
ALPHA, BETA = 1.0, -2.0  # key where short - mean long > 1 and mean long < 2
SHORT = [NAN, 3.0, 3.0, 3.0, 3.0, 4.0]  # position first + 0 has no short window
PLAIN = [0.0, 0.5, 1.5, 2.5, 0.2, 3.5]
NTK = [0.0, 1.0, 2.5, 1.0, 0.2, 1.0]
YARN = [0.1, 0.2, 0.3, 0.4, 2.0, 0.5]


def b64(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


def token_row(method, factor, long, *, doc="d1", short=SHORT, minimum=1, run="run"):
    """One `longppl_token_losses` row as the perplexity cell writes it (evaluator self)."""
    key_tokens = {"trunc_len": 2, "sliding_window": 1, "alpha": ALPHA, "beta": BETA, "evaluator": "self"}
    losses = {
        "first": 1,
        "tokens": len(long),
        "short": b64(short),
        "long": b64(long),
        "short_context": "self:x",
    }
    return {
        "run": run,
        "cell": f"{method}-{factor}",
        "model": "tiny",
        "method": method,
        "factor": factor,
        "options": {},
        "task": "perplexity",
        "corpus": "sotu",
        "length": 7,
        "doc": doc,
        "metric": "longppl_token_losses",
        "value": len(long),
        "n": len(long),
        "seconds": 1.0,
        "seed": 0,
        "status": "ok",
        "error": None,
        "task_options": {"key_tokens": dict(key_tokens, min_key_tokens=minimum), "token_losses": losses},
    }


def derived(rows) -> pd.DataFrame:
    return derive(normalize(pd.DataFrame.from_records(rows)))


def values(df, metric="longppl", doc="d1"):
    """{method: (value, n)} of one metric's rows of one document (doc None: the pooled rows)."""
    rows = df[(df["metric"] == metric) & (df["doc"].isna() if doc is None else df["doc"] == doc)]
    return {m: (v, n) for m, v, n in zip(rows["method"], rows["value"], rows["n"], strict=True)}


def test_key_tokens_and_values_by_hand(tmp_path):
    """Two settings through results.load: the key tokens are the rule on their mean long loss, each setting
    is scored over them with its own losses, and the token-loss rows are gone from the frame."""
    short, plain, ntk = np.array(SHORT, np.float32), np.array(PLAIN, np.float32), np.array(NTK, np.float32)
    mean = (plain.astype(np.float64) + ntk.astype(np.float64)) / 2  # [0, .75, 2, 1.75, .2, 2.25]
    with np.errstate(invalid="ignore"):
        keys = ((short - mean) > ALPHA) & (mean < -BETA)
    assert np.flatnonzero(keys).tolist() == [1, 3, 4]  # 2: short - mean is 1 exactly; 5: mean 2.25
    w = RecordWriter(tmp_path / "run", rank=0)
    w.write_manifest(config={"grid": "longppl"}, seed=0, device="cpu")
    w.write([token_row("plain", 1.0, PLAIN), token_row("ntk", 2.0, NTK)])
    w.finish()
    df = results.load(tmp_path / "run")
    assert not (df["metric"] == "longppl_token_losses").any()
    got = values(df)
    assert got["plain"] == (pytest.approx(np.exp(plain[keys].astype(np.float64).mean()), rel=1e-12), 3)
    assert got["ntk"] == (pytest.approx(np.exp(ntk[keys].astype(np.float64).mean()), rel=1e-12), 3)
    assert values(df, "longppl_key_tokens", None) == {"plain": (3, 1), "ntk": (3, 1)}  # n: documents
    kt = json.loads(df[df["metric"] == "longppl"]["task_options"].iloc[0])["key_tokens"]
    assert kt["compared_settings"] == ["ntk ×2", "plain"] and "token_losses" not in kt
    assert kt["selection"] == (
        "the paper's rule on the mean long-context loss of the compared settings: ntk ×2, plain; "
        "short context: the unpatched model"
    )
    meaning = json.loads(df[df["metric"] == "longppl"]["meaning"].iloc[0])
    assert meaning["kind"] == "perplexity" and meaning["direction"] == "lower"


def test_permuting_the_settings_changes_nothing():
    """Three settings in every order: the same key tokens (count) and bit-identical values."""
    rows = [token_row("plain", 1.0, PLAIN), token_row("ntk", 2.0, NTK), token_row("yarn", 4.0, YARN)]
    outcomes = []
    for order in itertools.permutations(rows):
        df = derived(list(order))
        outcomes.append(dict(sorted(values(df).items())))
    assert all(o == outcomes[0] for o in outcomes)
    mean = (
        np.array(PLAIN, np.float32).astype(float) + np.array(NTK, np.float32) + np.array(YARN, np.float32)
    ) / 3
    with np.errstate(invalid="ignore"):
        keys = ((np.array(SHORT, np.float32) - mean) > ALPHA) & (mean < -BETA)
    assert {n for _, n in outcomes[0].values()} == {int(keys.sum())} and keys.sum() > 0


def test_swapping_two_settings_losses_swaps_their_values_exactly():
    one = values(derived([token_row("plain", 1.0, PLAIN), token_row("ntk", 2.0, NTK)]))
    other = values(derived([token_row("plain", 1.0, NTK), token_row("ntk", 2.0, PLAIN)]))
    assert (other["plain"], other["ntk"]) == (one["ntk"], one["plain"])  # exact, not approximate


def test_one_setting_alone_is_the_papers_rule_on_its_own_losses():
    rng = np.random.default_rng(0)
    short = rng.uniform(0, 6, 400).astype(np.float32)
    long = rng.uniform(0, 4, 400).astype(np.float32)
    short[:50] = NAN
    rule = paper_rule(torch.from_numpy(short), torch.from_numpy(long), ALPHA, BETA).numpy()
    assert np.array_equal(select(short, [long], ALPHA, BETA), rule) and 0 < rule.sum() < 350
    got = values(derived([token_row("plain", 1.0, long, short=short)]))["plain"]
    assert got == (pytest.approx(np.exp(long[rule].astype(np.float64).mean()), rel=1e-12), int(rule.sum()))


def test_pooled_value_and_the_minimum():
    """Two documents: the pooled LongPPL is exp of the key-token-weighted mean loss; below the cell's
    min_key_tokens only the count row is written."""
    rows = [
        token_row(m, f, x, doc=d)
        for d in ("d1", "d2")
        for m, f, x in (("plain", 1.0, PLAIN), ("ntk", 2.0, NTK))
    ]
    df = derived(rows)
    pooled, per_doc = values(df, doc=None), [values(df, doc=d) for d in ("d1", "d2")]
    assert pooled["plain"][1] == 6 and pooled["plain"][0] == pytest.approx(per_doc[0]["plain"][0], rel=1e-12)
    withheld = derived([token_row("plain", 1.0, PLAIN, minimum=4), token_row("ntk", 2.0, NTK, minimum=4)])
    assert set(withheld["metric"]) == {"longppl_key_tokens"}
    assert values(withheld, "longppl_key_tokens", None)["plain"] == (3, 1)


def test_settings_with_other_short_losses_are_not_compared():
    """Another text (short losses differ) is another selection: each setting then stands alone."""
    other_short = [NAN, 9.0, 9.0, 9.0, 9.0, 9.0]
    df = derived([token_row("plain", 1.0, PLAIN), token_row("ntk", 2.0, NTK, short=other_short)])
    kt = {
        m: json.loads(t)["key_tokens"]["compared_settings"] for m, t in zip(df["method"], df["task_options"])
    }
    assert kt == {"plain": ["plain"], "ntk": ["ntk ×2"]}


def test_rows_written_by_the_task_pass_through():
    frame = normalize(pd.DataFrame.from_records([dict(token_row("plain", 1.0, PLAIN), metric="longppl")]))
    assert derive(frame) is frame


def test_a_sweep_of_two_settings_loads_longppl_on_shared_key_tokens(tmp_path, tiny_model_dir, monkeypatch):
    """End to end: the sweep runs the perplexity cell (evaluator self) for plain and ntk x2 on a tiny model,
    results.load derives `longppl` for both settings from one key-token set per document and length."""
    from ropebench import sweep_lib

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = [
        "--model",
        str(tiny_model_dir),
        "--tasks",
        "perplexity",
        "--lengths",
        "64",
        "96",
        "--out",
        str(out),
    ]
    options = ["-t", "perplexity.num_docs=2", "-t", "perplexity.key_tokens={alpha: 0, beta: -100}"]
    assert sweep_lib.main([*argv, *options, "--quiet", "--methods", "plain", "ntk", "--factors", "2"]) == 0
    df = results.load(out)
    assert not (df["metric"] == "longppl_token_losses").any()
    rows = df[(df["metric"] == "longppl") & (df["status"] == "ok")]
    per_doc = rows[rows["doc"].notna()]
    keys = {m: sorted(zip(g["length"], g["doc"], g["n"])) for m, g in per_doc.groupby("method")}
    assert set(keys) == {"plain", "ntk"} and keys["plain"] == keys["ntk"] and len(keys["plain"]) == 4
    pooled = rows[rows["doc"].isna()]
    assert sorted(pooled["method"]) == ["ntk", "ntk", "plain", "plain"]
    compared = {json.dumps(json.loads(t)["key_tokens"]["compared_settings"]) for t in rows["task_options"]}
    assert compared == {json.dumps(["ntk ×2", "plain"])}
