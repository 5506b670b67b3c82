"""Tables from synthetic records: shape, values, intervals, comparisons, writers, errors."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN
from ropebench.results.stats import newcombe, wilson
from ropebench.results.store import RecordWriter

LENGTHS = [1024, 2048, 4096, 8192, 16384]


@pytest.fixture(scope="module")
def synthetic_frame_with_error_cell(synthetic_records, tmp_path_factory):
    """results.load of a run of synthetic records (tests/results/synthetic.py) with one failed cell."""
    run = tmp_path_factory.mktemp("run")
    RecordWriter(run).write(synthetic_records("run", error_cells=1))
    return results.load(run)


def test_perplexity_table_shape_and_values(synthetic_frame_with_error_cell):
    t = results.table(synthetic_frame_with_error_cell, "perplexity", "ppl")
    # factor varies within yarn (x2 and x4), so it is added to the rows automatically
    assert t.index.names == ["method", "factor"]
    assert list(t.index) == [("plain", 1.0), ("linear", 2.0), ("yarn", 2.0), ("yarn", 4.0)]  # baseline first
    assert list(t.columns) == LENGTHS
    assert t.loc[("plain", 1.0), 1024] == pytest.approx(12.0)
    assert t.loc[("plain", 1.0), 16384] == pytest.approx(14.0 * 40)
    assert t.loc[("linear", 2.0), 16384] == pytest.approx(14.0 * 1.04)
    assert t.loc[("yarn", 4.0), 16384] == pytest.approx(14.0 * 1.08)
    # n counts documents (the unit of the interval); the estimate from the 3 per-document rows (token-weighted
    # on the log scale) is the task's aggregated row
    n = results.table(synthetic_frame_with_error_cell, "perplexity", "ppl", stat="n")
    assert (n == 3).all().all()
    agg = synthetic_frame_with_error_cell[
        (synthetic_frame_with_error_cell["metric"] == "ppl") & synthetic_frame_with_error_cell["doc"].isna()
    ].set_index(["method", "factor", "length"])["value"]
    for (method, factor), row in t.iterrows():
        for length, v in row.items():
            assert v == pytest.approx(agg.loc[(method, factor, length)], rel=1e-12)


def test_filters_and_single_column(synthetic_frame_with_error_cell):
    t = results.table(synthetic_frame_with_error_cell, "perplexity", "loss", factor=2.0)
    assert t.index.name == "method" and list(t.index) == ["linear", "yarn"]
    assert t.loc["yarn", 1024] == pytest.approx(math.log(12.0 * 1.04))
    one = results.table(synthetic_frame_with_error_cell, "classification", "accuracy", cols=None, length=1024)
    assert one.shape == (4, 1) and one.iloc[:, 0].tolist() == pytest.approx([0.6] * 4)
    by_len = results.table(
        synthetic_frame_with_error_cell,
        "classification",
        "accuracy",
        rows="length",
        cols="method",
        factor=1.0,
    )
    assert list(by_len.columns) == ["plain"] and by_len.loc[16384, "plain"] == pytest.approx(0.5)


def test_passkey_mean_n_and_wilson_interval(synthetic_frame_with_error_cell):
    t = results.table(synthetic_frame_with_error_cell, "passkey", "correct")
    # plain at 8192: 3 depths x 2 trials, one miss (depth 0.5, trial 0) -> 5/6
    assert t.loc[("plain", 1.0), 8192] == pytest.approx(5 / 6)
    assert t.loc[("plain", 1.0), 16384] == 0.0
    assert (results.table(synthetic_frame_with_error_cell, "passkey", "correct", stat="n") == 6).all().all()
    lo = results.table(synthetic_frame_with_error_cell, "passkey", "correct", stat="lo").loc[
        ("plain", 1.0), 8192
    ]
    hi = results.table(synthetic_frame_with_error_cell, "passkey", "correct", stat="hi").loc[
        ("plain", 1.0), 8192
    ]
    assert (lo, hi) == pytest.approx((0.4365, 0.9699), abs=1e-4)  # Wilson 95% for 5/6 (reference values)
    assert wilson(0, 6)[0] == 0.0 and 0 < wilson(0, 6)[1] < 0.5  # informative at 0/n
    ci = results.table(synthetic_frame_with_error_cell, "passkey", "correct", with_ci=True)
    assert ci.loc[("plain", 1.0), 8192] == "0.833 [0.436, 0.970] n=6"  # [lo, hi], never a symmetric ±
    assert ci.loc[("plain", 1.0), 16384] == f"0.000 [0.000, {wilson(0, 6)[1]:.3f}] n=6"


def test_wilson_and_newcombe_reference_values():
    # Newcombe (1998), Stat. Med. 17:873, Table II: 56/70 - 48/80 -> method 10 interval 0.0524, 0.3339
    assert newcombe(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    # by hand: centre (p + z^2/2n) / (1 + z^2/n), half z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
    z, k, n = 1.959963984540054, 17, 18
    p = k / n
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    assert wilson(k, n) == pytest.approx((centre - half, centre + half), rel=1e-12)


def _frame(rows):
    """Rows of task "t"; a "ppl" row carries perplexity's declaration (the sweep copies it into each row)."""
    base = {"task": "t", "metric": "m", "method": "a", "length": 1, "status": "ok", "seed": 0}
    ppl = BUILT_IN[("perplexity", "ppl")].to_json()
    return normalize(
        pd.DataFrame([{**base, **r, "meaning": ppl if r.get("metric") == "ppl" else None} for r in rows])
    )


T975 = {
    2: 4.3027,
    3: 3.1824,
}  # Student's t 0.975 quantiles as printed in statistical tables (2, 3 degrees of freedom)


def test_t_interval_over_units_by_hand():
    values = [1.0, 2.0, 3.0, 4.0]
    frame = _frame([{"trial": i, "value": v} for i, v in enumerate(values)])
    s = results.estimates(frame, "t", "m", by=["method"])
    assert s.loc[0, "mean"] == 2.5 and s.loc[0, "n"] == 4 and s.loc[0, "interval"] == "t"
    half = T975[3] * np.std(values, ddof=1) / math.sqrt(4)
    assert s.loc[0, "half"] == pytest.approx(half, rel=1e-4) and s.loc[0, "lo"] + s.loc[
        0, "half"
    ] == pytest.approx(2.5)
    assert results.estimates(frame.sample(frac=1.0, random_state=2), "t", "m", by=["method"]).equals(s)
    for m in (1, 2):  # below 3 units: no interval, not a zero-width or a +-12.7 s.e. one
        few = results.estimates(frame[frame["trial"] < m], "t", "m", by=["method"])
        assert math.isnan(few.loc[0, "half"]) and few.loc[0, "interval"] == "none" and few.loc[0, "n"] == m


def test_perplexity_interval_is_t_over_documents_token_weighted():
    # three documents of different lengths: the cell is exp(sum n_i loss_i / sum n_i); the interval is t on
    # the per-document losses, exp'd back, with the larger of Kish's variance s^2 sum(n^2) / sum(n)^2 and
    # HC2's sum(n_i^2 r_i^2 / (1 - n_i / N)) / N^2 (results.stats.skew_t)
    docs = [("d0", 2.0, 100), ("d1", 3.0, 300), ("d2", 2.5, 50)]
    frame = _frame([{"metric": "ppl", "doc": d, "value": math.exp(loss), "n": n} for d, loss, n in docs])
    loss, n = np.array([d[1] for d in docs]), np.array([d[2] for d in docs], float)
    s = results.estimates(frame, "t", "ppl", by=["method"])
    centre = (loss * n).sum() / n.sum()  # 2.7222...
    assert s.loc[0, "mean"] == pytest.approx(math.exp(centre), rel=1e-12) and s.loc[0, "interval"] == "t"
    kish = (0.5 * math.sqrt(100**2 + 300**2 + 50**2) / 450) ** 2  # s = 0.5 (losses 2, 3, 2.5)
    hc2 = ((n * (loss - centre)) ** 2 / (1 - n / 450)).sum() / 450**2
    assert hc2 > kish  # the heavy document sits far from the centre: HC2's variance, on effective n - 1 =
    # 450^2 / (100^2 + 300^2 + 50^2) - 1 = 0.98 dof x 0.65 -> at least 1 dof, t = 12.706; the losses are not
    # skewed (2, 2.5, 3), so the interval is symmetric
    half = 12.706205 * math.sqrt(hc2)
    assert (math.log(s.loc[0, "lo"]), math.log(s.loc[0, "hi"])) == pytest.approx(
        (centre - half, centre + half), abs=1e-4 * half
    )


def test_t_interval_over_several_aggregate_rows():
    frame = _frame([{"run": f"r{i}", "value": v} for i, v in enumerate([1.0, 2.0, 3.0, 4.0])])
    s = results.estimates(frame, "t", "m", by=["method"])
    assert s.loc[0, "interval"] == "t" and s.loc[0, "n"] == 4
    assert s.loc[0, "half"] == pytest.approx(T975[3] * 1.2909944 / 2, rel=1e-4)


def test_rates_known_only_as_totals_get_wilson(synthetic_frame_with_error_cell):
    # classification rows are aggregates: accuracy over n=20 queries -> Wilson(accuracy x 20, 20)
    s = results.estimates(
        synthetic_frame_with_error_cell, "classification", "accuracy", by=["method", "factor", "length"]
    )
    row = s[(s["method"] == "plain") & (s["length"] == 16384)].iloc[0]
    assert (row["mean"], row["n"], row["interval"]) == (0.5, 20, "wilson")
    assert (row["lo"], row["hi"]) == pytest.approx(wilson(10, 20), rel=1e-12)


def test_error_rows_are_not_averaged(synthetic_frame_with_error_cell):
    assert "error" in set(synthetic_frame_with_error_cell["status"])
    t = results.table(synthetic_frame_with_error_cell, "passkey", "correct")
    assert 65536 not in t.columns


def test_compare_ratio_and_delta(synthetic_frame_with_error_cell):
    r = results.compare(synthetic_frame_with_error_cell, "perplexity", "ppl", baseline="plain")
    assert r.shape == (4, 5)
    assert (r.loc[("plain", 1.0)] == 1.0).all()
    assert r.loc[("linear", 2.0), 16384] == pytest.approx(14.56 / 560)
    assert r.loc[("yarn", 4.0), 1024] == pytest.approx(1.08)
    d = results.compare(synthetic_frame_with_error_cell, "classification", "accuracy", how="delta")
    assert d.loc[("yarn", 2.0), 16384] == pytest.approx(0.3)
    assert d.loc[("yarn", 2.0), 1024] == pytest.approx(0.0)
    with pytest.raises(results.ResultsError, match="available methods: .*linear"):
        results.compare(synthetic_frame_with_error_cell, "perplexity", "ppl", baseline="nope")


def test_unknown_task_metric_column(synthetic_frame_with_error_cell):
    with pytest.raises(
        results.ResultsError,
        match=r"unknown task 'ppl' — available tasks: classification, "
        r"passkey, perplexity",
    ):
        results.table(synthetic_frame_with_error_cell, "ppl", "ppl")
    with pytest.raises(results.ResultsError, match=r"unknown metric 'acc' .*accuracy, chance, macro_f1"):
        results.table(synthetic_frame_with_error_cell, "classification", "acc")
    with pytest.raises(results.ResultsError, match="unknown column"):
        results.table(synthetic_frame_with_error_cell, "classification", "accuracy", colour="red")
    with pytest.raises(results.ResultsError, match="available: 1, 2, 4"):
        results.table(synthetic_frame_with_error_cell, "classification", "accuracy", factor=8.0)


def test_markdown_csv_latex_render(synthetic_frame_with_error_cell, tmp_path):
    t = results.table(synthetic_frame_with_error_cell, "perplexity", "ppl")
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
    ci_tex = results.to_latex(
        results.table(synthetic_frame_with_error_cell, "passkey", "correct", with_ci=True)
    )
    assert r"0.833 [0.436, 0.970] n=6" in ci_tex and r"\begin{tabular}{llrrrrr}" in ci_tex
    paths = results.write_table(t, tmp_path / "tables" / "ppl", caption="PPL")
    assert sorted(p.suffix for p in paths.values()) == [".csv", ".md", ".tex"]
    back = pd.read_csv(paths["csv"], index_col=[0, 1])
    assert back.loc[("plain", 1.0), "16384"] == pytest.approx(560.0)
