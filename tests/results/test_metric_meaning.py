"""Metric meaning is declared once, by the task (results/meaning.py, tasks/kit.py `declare(metrics=...)`), and
results read the declaration, never the metric's name or values (issue 29 item 1)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from ropebench import results, tasks
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN, UNDECLARED, Metric, declarations, undeclared_note
from ropebench.results.tables import out_of_range
from ropebench.tasks.kit import declare


def test_built_in_tasks_declare_exactly_the_fallback_for_their_old_rows():
    """BUILT_IN is what rows written before declarations are read with: it must say what the tasks declare."""
    declared = {
        (name, metric): meaning
        for name, run in tasks.TASKS.items()
        for metric, meaning in run.spec.meanings.items()
    }
    assert declared == {key: m for key, m in BUILT_IN.items() if key[0] != "theory"}
    for name, run in tasks.TASKS.items():  # every metric a task lists has a declaration
        assert set(run.spec.metrics) == set(run.spec.meanings), name


def test_pass_fail_is_derived_from_reach_rules():
    spec = tasks.TASKS["retrieval"].spec
    assert spec.pass_fail == {"answer_top1", "all_found"}
    assert tasks.TASKS["classification"].spec.pass_fail == frozenset()  # graded against chance
    assert spec.meaning("answer_rank").kind == "rank" and spec.meaning("nothing") is None


def test_plugin_strings_declare_nothing_unless_pass_fail():
    @declare("toy", options={}, metrics={"hit": "0/1", "size": "tokens"}, pass_fail=("hit",), register=False)
    def run(model, tokenizer, *, lengths, seed=0, progress=True):
        return []

    hit = run.spec.meaning("hit")
    assert (hit.kind, hit.direction, hit.reach, hit.lo, hit.hi) == (
        "rate",
        "higher",
        ("threshold", "short", "trained"),
        0.0,
        1.0,
    )
    assert run.spec.meaning("size") is None and run.spec.metrics == {"hit": "0/1", "size": "tokens"}
    assert run.spec.pass_fail == {"hit"}


def test_a_metric_in_pass_fail_without_reach_is_a_contradiction():
    with pytest.raises(TypeError, match="pass_fail"):

        @declare("bad", options={}, metrics={"acc": Metric("rate", "higher")}, pass_fail=("acc",))
        def run(model, tokenizer, *, lengths, seed=0, progress=True):
            return []


def test_a_declaration_names_only_reach_rules_of_its_kind():
    """The rules are registered by (kind, name) (results/reach_rules.py): NoLiMa's `short` is for rates, and a
    rank or mean has no rule; each refused in one line naming the rules its kind has."""
    with pytest.raises(ValueError, match=r"^metric declaration reach rule 'short' does not apply to a "):
        Metric("perplexity", "lower", reach=("short",))
    with pytest.raises(ValueError, match=r"a perplexity \(its rules: threshold, trained\)$"):
        Metric("perplexity", "lower", reach=("short",))
    with pytest.raises(ValueError, match=r"'threshold' does not apply to a rank \(its rules: none\)$"):
        Metric("rank", "lower", reach=("threshold",))
    with pytest.raises(ValueError, match=r"^metric declaration reach rule 'nolima' is not one of thresh"):
        Metric("rate", "higher", reach=("nolima",))


# ------------------------------------------------------------------------------- results read the meaning
def _rows(metric, values, meaning=None, task="plugin"):
    """One setting's per-prompt rows of one metric at one length, as the sweep writes them."""
    return [
        {
            "task": task,
            "metric": metric,
            "model": "m",
            "method": "plain",
            "factor": 1.0,
            "length": 100,
            "status": "ok",
            "seed": 0,
            "n": 1,
            "trial": i,
            "value": float(v),
            "meaning": None if meaning is None else meaning.to_json(),
        }
        for i, v in enumerate(values)
    ]


RANK = Metric("rank", "lower", "rank (1 = first)", "rank of the answer", lo=1.0)
T975_4 = 2.776445  # Student's t 0.975 quantile, 4 degrees of freedom (printed tables)


def test_a_declared_rank_whose_values_are_all_one_gets_mean_statistics():
    """Five prompts all ranked first: a rank, not a 0/1 rate (no Wilson interval); a t interval over five
    equal values has zero width."""
    frame = normalize(pd.DataFrame(_rows("rank", [1, 1, 1, 1, 1], RANK)))
    cell = results.estimates(frame, "plugin", "rank", by=["method"]).iloc[0]
    assert (cell["mean"], cell["lo"], cell["hi"], cell["interval"], cell["n"]) == (1.0, 1.0, 1.0, "t", 5)
    varied = normalize(pd.DataFrame(_rows("rank", [1, 2, 1, 3, 1], RANK)))
    cell = results.estimates(varied, "plugin", "rank", by=["method"]).iloc[0]
    values = np.array([1, 2, 1, 3, 1], float)
    half = T975_4 * values.std(ddof=1) / math.sqrt(5)
    assert (cell["lo"], cell["hi"]) == pytest.approx((1.6 - half, 1.6 + half)) and cell["interval"] == "t"


def test_a_declared_rate_gets_wilson_and_the_same_values_undeclared_get_the_fallback_mean():
    rate = Metric("rate", "higher", "fraction of prompts", "hit", reach=("threshold",), lo=0.0, hi=1.0)
    values = [1, 1, 1, 0, 1]
    z = 1.959963984540054
    p, n = 0.8, 5
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    declared = results.estimates(normalize(pd.DataFrame(_rows("hit", values, rate))), "plugin", "hit")
    assert declared.loc[0, "interval"] == "wilson"
    assert (declared.loc[0, "lo"], declared.loc[0, "hi"]) == pytest.approx((centre - half, centre + half))
    undeclared = results.estimates(normalize(pd.DataFrame(_rows("hit", values))), "plugin", "hit")
    t_half = T975_4 * np.std(values, ddof=1) / math.sqrt(5)
    assert undeclared.loc[0, "interval"] == "t"
    assert (undeclared.loc[0, "lo"], undeclared.loc[0, "hi"]) == pytest.approx((0.8 - t_half, 0.8 + t_half))


def test_declarations_note_and_fallback():
    frame = normalize(
        pd.DataFrame(
            _rows("rank", [1, 2], RANK) + _rows("other", [3, 4]) + _rows("correct", [1], task="passkey")
        )
    )
    found = declarations(frame)
    assert found[("plugin", "rank")] == RANK and found[("plugin", "rank")].declared
    assert found[("plugin", "other")] is UNDECLARED
    assert found[("passkey", "correct")] == BUILT_IN[("passkey", "correct")]
    assert not found[("passkey", "correct")].declared
    note = undeclared_note(found)
    assert "passkey/correct read with ropebench's built-in meaning" in note
    assert "plugin/other treated as plain means" in note and "plugin/rank" not in note


def test_old_rows_without_the_new_columns_load(tmp_path):
    """A records file written before meaning/cluster/distance existed loads; the columns read None, and its
    metrics take the built-in meaning."""
    old = {
        "run": "old",
        "cell": "c1",
        "model": "m",
        "method": "plain",
        "factor": 1.0,
        "options": "{}",
        "task": "passkey",
        "corpus": "sotu",
        "task_options": "{}",
        "length": 100,
        "depth": 0.5,
        "doc": None,
        "trial": 0,
        "metric": "correct",
        "value": 1.0,
        "n": 1,
        "seed": 0,
        "seconds": 0.1,
        "status": "ok",
        "error": None,
    }
    (tmp_path / "records.jsonl").write_text(json.dumps(old) + "\n" + json.dumps({**old, "trial": 1}) + "\n")
    df = results.load(tmp_path)
    assert len(df) == 2 and df[["meaning", "cluster", "distance"]].isna().all().all()
    assert list(df.columns[: len(results.SCHEMA)]) == list(results.SCHEMA)
    assert results.estimates(df, "passkey", "correct").loc[0, "interval"] == "wilson"


def test_new_columns_are_normalised(tmp_path):
    rows = [
        {"task": "plugin", "metric": "hit", "value": 1.0, "trial": 0, "cluster": 3, "distance": 4096.0},
        {
            "task": "plugin",
            "metric": "hit",
            "value": 0.0,
            "trial": 1,
            "cluster": "haystack-0",
            "distance": None,
        },
    ]
    rows[0]["meaning"] = {"kind": "rank", "lo": 1.0}  # a dict (hand-written) becomes canonical JSON text
    df = normalize(pd.DataFrame(rows))
    assert df["cluster"].tolist() == ["3", "haystack-0"]  # an integer id reads as its digits, not "3.0"
    assert str(df["distance"].dtype) == "Int64" and df["distance"].iloc[0] == 4096
    assert df["meaning"].iloc[0] == '{"kind":"rank","lo":1.0}' and df["meaning"].iloc[1] is None
    assert Metric.from_record(df["meaning"].iloc[0]) == Metric("rank", lo=1.0)


def test_out_of_range_names_rows_that_break_the_declared_range():
    rate = Metric("rate", "higher", "fraction of prompts", "hit", lo=0.0, hi=1.0)
    frame = normalize(pd.DataFrame(_rows("hit", [1, 0, 3], rate) + _rows("rank", [0.5, 2], RANK)))
    bad = out_of_range(frame)
    assert sorted(zip(bad["metric"], bad["value"])) == [("hit", 3.0), ("rank", 0.5)]
    assert out_of_range(frame[frame["value"].between(1, 2)]).empty
    # issue 41: a value outside the range is left out of the cell (the rate of 1 and 0: 1/2, n = 2), not only
    # named
    cell = results.estimates(frame, "plugin", "hit").iloc[0]
    assert (cell["n"], cell["mean"], cell["interval"]) == (2, 0.5, "wilson")


def test_bad_arguments_are_one_line_results_errors():
    with pytest.raises(results.ResultsError, match=r"successes exceed trials") as e:
        results.wilson(5, 3)
    assert "\n" not in str(e.value)
    with pytest.raises(results.ResultsError, match=r"finite number >= 0"):
        results.wilson(-1, 3)
    with pytest.raises(results.ResultsError, match=r"expected the records as a DataFrame, got str") as e:
        results.table("x", "passkey", "correct")
    assert "\n" not in str(e.value)
    with pytest.raises(results.ResultsError, match=r"lacks the column"):
        results.table(pd.DataFrame({"a": [1]}), "passkey", "correct")


# ------------------------------------------------------------------------- the declaration travels with rows
def _cell(task):
    from ropebench.sweep_lib import grid

    return grid.make_cell(
        model="m",
        method="plain",
        factor=1,
        options={},
        task=task,
        task_options={},
        lengths=(100,),
        seed=0,
        dtype="float32",
    )


def test_the_sweep_attaches_each_metrics_declaration_to_its_rows(monkeypatch):
    from ropebench.sweep_lib.run import ok_rows

    @declare("toy", options={}, metrics={"rank": RANK, "size": "tokens"}, register=False)
    def run(model, tokenizer, *, lengths, seed=0, progress=True):
        return []

    monkeypatch.setitem(tasks.TASKS, "toy", run)
    rows = ok_rows(_cell("toy"), "r", [{"metric": "rank", "value": 1.0}, {"metric": "size", "value": 9.0}])
    assert Metric.from_record(rows[0]["meaning"]) == RANK
    assert "meaning" not in rows[1]  # a plain string declares nothing: results' fallback
    passkey = ok_rows(_cell("passkey"), "r", [{"metric": "correct", "value": 1.0}])
    assert passkey[0]["meaning"] == BUILT_IN[("passkey", "correct")].to_json()
    theory = ok_rows(_cell("theory"), "r", [{"metric": "men_reach", "value": 3616.0}])
    assert Metric.from_record(theory[0]["meaning"]).reference


def test_a_field_newer_than_the_record_takes_the_built_in_value():
    """Rows written before `by_position` existed still plot perplexity's loss_bin by position; a plugin metric
    without the field gets the default."""
    import json

    from ropebench.results.meaning import BUILT_IN, declarations

    old = {k: v for k, v in BUILT_IN[("perplexity", "loss_bin")].to_record().items() if k != "by_position"}
    rows = [
        {"task": "perplexity", "metric": "loss_bin", "meaning": json.dumps(old)},
        {"task": "mine", "metric": "loss_bin", "meaning": json.dumps(old)},
    ]
    got = declarations(rows)
    assert got[("perplexity", "loss_bin")].by_position is True
    assert got[("mine", "loss_bin")].by_position is False
