"""Tables from synthetic records: shape, values, intervals, comparisons, writers, errors."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest

import results
from results.store import RecordWriter
from results.synthetic import synthetic_records
from results.tables import wilson

LENGTHS = [1024, 2048, 4096, 8192, 16384]


@pytest.fixture(scope="module")
def df(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    RecordWriter(run).write(synthetic_records("run", error_cells=1))
    return results.load(run)


def test_perplexity_table_shape_and_values(df):
    t = results.table(df, "perplexity", "ppl")
    # factor varies within yarn (x2 and x4), so it is added to the rows automatically
    assert t.index.names == ["method", "factor"]
    assert list(t.index) == [("plain", 1.0), ("linear", 2.0), ("yarn", 2.0), ("yarn", 4.0)]  # baseline first
    assert list(t.columns) == LENGTHS
    assert t.loc[("plain", 1.0), 1024] == pytest.approx(12.0)
    assert t.loc[("plain", 1.0), 16384] == pytest.approx(14.0 * 40)
    assert t.loc[("linear", 2.0), 16384] == pytest.approx(14.0 * 1.04)
    assert t.loc[("yarn", 4.0), 16384] == pytest.approx(14.0 * 1.08)
    # the aggregated row (doc None) is used, not the per-document rows
    n = results.table(df, "perplexity", "ppl", stat="n")
    assert (n == 1).all().all()


def test_filters_and_single_column(df):
    t = results.table(df, "perplexity", "loss", factor=2.0)
    assert t.index.name == "method" and list(t.index) == ["linear", "yarn"]
    assert t.loc["yarn", 1024] == pytest.approx(math.log(12.0 * 1.04))
    one = results.table(df, "classification", "accuracy", cols=None, length=1024)
    assert one.shape == (4, 1) and one.iloc[:, 0].tolist() == pytest.approx([0.6] * 4)
    by_len = results.table(df, "classification", "accuracy", rows="length", cols="method", factor=1.0)
    assert list(by_len.columns) == ["plain"] and by_len.loc[16384, "plain"] == pytest.approx(0.5)


def test_passkey_mean_n_and_wilson_interval(df):
    t = results.table(df, "passkey", "correct")
    # plain at 8192: 3 depths x 2 trials, one miss (depth 0.5, trial 0) -> 5/6
    assert t.loc[("plain", 1.0), 8192] == pytest.approx(5 / 6)
    assert t.loc[("plain", 1.0), 16384] == 0.0
    assert (results.table(df, "passkey", "correct", stat="n") == 6).all().all()
    lo = results.table(df, "passkey", "correct", stat="lo").loc[("plain", 1.0), 8192]
    hi = results.table(df, "passkey", "correct", stat="hi").loc[("plain", 1.0), 8192]
    assert (lo, hi) == pytest.approx((0.4365, 0.9699), abs=1e-4)  # Wilson 95% for 5/6 (reference values)
    assert wilson(0, 6)[0] == 0.0 and 0 < wilson(0, 6)[1] < 0.5  # informative at 0/n
    ci = results.table(df, "passkey", "correct", with_ci=True)
    assert ci.loc[("plain", 1.0), 8192] == f"0.833 ± {(0.9699 - 0.4365) / 2:.3f}"


def test_t_interval_for_continuous_values():
    rows = [{"task": "t", "metric": "m", "method": "a", "length": 1, "trial": i, "value": v, "status": "ok"}
            for i, v in enumerate([1.0, 2.0, 3.0, 4.0])]
    frame = results.frame.normalize(pd.DataFrame(rows))
    s = results.summarize(frame, "t", "m", by=["method"])
    assert s.loc[0, "mean"] == 2.5 and s.loc[0, "n"] == 4
    assert s.loc[0, "half"] == pytest.approx(3.182 * 1.2909944 / 2, rel=1e-4)
    single = results.summarize(frame[frame["trial"] == 0], "t", "m", by=["method"])
    assert math.isnan(single.loc[0, "half"])  # one value: no interval, not a fake one


def test_error_rows_are_not_averaged(df):
    assert "error" in set(df["status"])
    t = results.table(df, "passkey", "correct")
    assert 65536 not in t.columns


def test_compare_ratio_and_delta(df):
    r = results.compare(df, "perplexity", "ppl", baseline="plain")
    assert r.shape == (4, 5)
    assert (r.loc[("plain", 1.0)] == 1.0).all()
    assert r.loc[("linear", 2.0), 16384] == pytest.approx(14.56 / 560)
    assert r.loc[("yarn", 4.0), 1024] == pytest.approx(1.08)
    d = results.compare(df, "classification", "accuracy", how="delta")
    assert d.loc[("yarn", 2.0), 16384] == pytest.approx(0.3)
    assert d.loc[("yarn", 2.0), 1024] == pytest.approx(0.0)
    with pytest.raises(results.ResultsError, match="available methods: .*linear"):
        results.compare(df, "perplexity", "ppl", baseline="nope")


def test_unknown_task_metric_column(df):
    with pytest.raises(results.ResultsError, match=r"unknown task 'ppl' — available tasks: classification, "
                                                   r"passkey, perplexity"):
        results.table(df, "ppl", "ppl")
    with pytest.raises(results.ResultsError, match=r"unknown metric 'acc' .*accuracy, chance, macro_f1"):
        results.table(df, "classification", "acc")
    with pytest.raises(results.ResultsError, match="unknown column"):
        results.table(df, "classification", "accuracy", colour="red")
    with pytest.raises(results.ResultsError, match="available: 1, 2, 4"):
        results.table(df, "classification", "accuracy", factor=8.0)


def test_markdown_csv_latex_render(df, tmp_path):
    t = results.table(df, "perplexity", "ppl")
    md = results.to_markdown(t, caption="PPL")
    lines = md.strip().splitlines()
    assert lines[0] == "**PPL**"
    assert lines[2] == "| method | factor | 1024 | 2048 | 4096 | 8192 | 16384 |"
    assert lines[3] == "|:---|:---|---:|---:|---:|---:|---:|"
    assert lines[4] == "| plain | 1 | 12.00 | 12.50 | 13.00 | 13.50 | 560.0 |"
    assert len(lines) == 4 + 4
    tex = results.to_latex(t.rename(index={"yarn": "yarn_v2"}), caption="100% ppl", label="tab:x")
    assert r"\begin{tabular}{llrrrrr}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"yarn\_v2 & 4 & 12.96" in tex and r"\caption{100\% ppl}" in tex
    ci_tex = results.to_latex(results.table(df, "passkey", "correct", with_ci=True))
    assert r"0.833 $\pm$ 0.267" in ci_tex
    paths = results.write_table(t, tmp_path / "tables" / "ppl", caption="PPL")
    assert sorted(p.suffix for p in paths.values()) == [".csv", ".md", ".tex"]
    back = pd.read_csv(paths["csv"], index_col=[0, 1])
    assert back.loc[("plain", 1.0), "16384"] == pytest.approx(560.0)
