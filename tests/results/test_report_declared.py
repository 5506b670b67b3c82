"""The report says what the run shows, and reads every treatment from the metrics' declarations (issue 29
item 3, 32.4/32.6, 33.4): a plugin task's rank metric, a demo-like run's summary, the headline's n and p,
distances on retrieval numbers, plots per declared metric. Expected values are worked out by hand."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN, Metric
from ropebench.results.overview import left_out

T975_7 = 2.3646  # Student's t 0.975 quantile, 7 degrees of freedom (printed tables)
RANK = Metric("rank", "lower", "rank (1 = first)", "rank of the answer", independent_unit="question", lo=1.0)


def _declare(rows, task=None):
    """Rows with their metric's built-in declaration attached, as the sweep writes them."""
    out = []
    for r in rows:
        d = BUILT_IN.get((task or r["task"], r["metric"]))
        out.append({**r, "meaning": d.to_json()} if d is not None else dict(r))
    return out


# ------------------------------------------------------------------ a plugin task with a declared rank metric
def _rank_rows():
    """Task "ranker", metric "rank" (declared a rank): 8 questions per length. At 1000 every answer ranks
    first for both methods; at 2000 plain's ranks alternate 2, 3 and ext's are all 1."""
    rows = []
    for method, ranks in (
        ("plain", {1000: [1] * 8, 2000: [2, 3] * 4}),
        ("ext", {1000: [1] * 8, 2000: [1] * 8}),
    ):
        for L, values in ranks.items():
            for q, v in enumerate(values):
                rows.append(
                    {
                        "run": "r",
                        "cell": f"{method}-{L}",
                        "task": "ranker",
                        "model": "m",
                        "method": method,
                        "factor": 1.0,
                        "options": "{}",
                        "corpus": "c",
                        "length": L,
                        "trial": q,
                        "seed": 0,
                        "metric": "rank",
                        "value": float(v),
                        "n": 1,
                        "status": "ok",
                        "meaning": RANK.to_json(),
                    }
                )
    return rows


def test_a_declared_rank_is_a_mean_with_no_reach_everywhere(tmp_path):
    df = normalize(pd.DataFrame(_rank_rows()))
    s = results.summary(df, with_ci=False).set_index("method")
    # every value 1 at 1000 and for ext at 2000: a rate would get Wilson's [0.676, 1]; a rank is a mean
    # with a t interval, which for identical values is the value itself
    assert s.loc["ext", "ranker @ longest"] == 1.0
    assert (s.loc["ext", "ranker @ longest_lo"], s.loc["ext", "ranker @ longest_hi"]) == (1.0, 1.0)
    values = [2, 3] * 4
    mean = sum(values) / 8
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 7)
    half = T975_7 * sd / math.sqrt(8)
    assert s.loc["plain", "ranker @ longest"] == pytest.approx(2.5)
    assert (s.loc["plain", "ranker @ longest_lo"], s.loc["plain", "ranker @ longest_hi"]) == pytest.approx(
        (2.5 - half, 2.5 + half), abs=1e-3
    )
    assert not [c for c in s.columns if "reach" in c]
    with pytest.raises(results.ResultsError, match="declares no reach rules"):
        results.effective_length(df, "ranker", "rank")
    # the paired difference: a mean difference (ext - plain = -1.5) with a paired t, not McNemar
    d = results.paired_differences(df, "ranker", "rank").set_index(["method", "length"])
    assert d.loc[("ext", 2000), "how"] == "delta" and d.loc[("ext", 2000), "interval"] == "paired t"
    assert d.loc[("ext", 2000), "estimate"] == pytest.approx(-1.5)
    # the report: a row in the summary, a differences table, a section and a plot, with no edit elsewhere
    run = tmp_path / "run"
    results.RecordWriter(run).write(_rank_rows())
    md = results.report(run).read_text()
    assert "ranker @ 2000" in md.split("## Summary", 1)[1].split("## Differences", 1)[0]
    assert "ranker/rank minus plain" in md and "## ranker" in md
    assert (
        "(plots/ranker_rank_m_c.png)" in md and (run / "plots" / "ranker_rank_m_c.png").stat().st_size > 5000
    )
    assert "reach_ranker" not in md


# ------------------------------------------------------------------------------------- a demo-like run
DEMO_SETTINGS = (("plain", 1.0, {}), ("ntk", 2.0, {}), ("yarn", 2.0, {}))
LONG = 12288


def _retrieval_rows(haystacks=2):
    """Retrieval at 12288: ``haystacks`` x 6 questions, the needle 4096-8192 tokens from the question. plain
    ranks the answer first on none, ntk and yarn on all; log-probability -3 for plain, -0.5 for the others
    (+0.1 per question so it has a spread)."""
    rows = []
    for method, factor, _ in DEMO_SETTINGS:
        for h in range(haystacks):
            for q in range(6):
                good = method != "plain"
                for metric, value in (
                    ("answer_top1", float(good)),
                    ("answer_logprob", (-0.5 if good else -3.0) + 0.1 * q),
                ):
                    rows.append(
                        {
                            "run": "demo",
                            "cell": f"retrieval-{method}",
                            "task": "retrieval",
                            "model": "smollm2-135m",
                            "method": method,
                            "factor": factor,
                            "options": {"trained_context": 8192},
                            "corpus": "essays",
                            "length": LONG,
                            "depth": q / 6,
                            "trial": h * 6 + q,
                            "cluster": f"haystack-{h}",
                            "distance": 4096 + 819 * q - (q == 5),
                            "seed": 0,
                            "metric": metric,
                            "value": value,
                            "n": 1,
                            "status": "ok",
                        }
                    )
    return rows


@pytest.fixture(scope="module")
def demo_like(synthetic_records):
    rows = synthetic_records(
        "demo",
        settings=tuple((m, f, {**o, "trained_context": 8192}) for m, f, o in DEMO_SETTINGS),
        lengths=(2048, 4096, 8192, LONG),
        trials=6,
    )
    for r in rows:
        if r["task"] == "passkey" and r["depth"] is not None:
            r["distance"] = int((1 - r["depth"]) * r["length"]) // 2
    return normalize(pd.DataFrame(_declare(rows + _retrieval_rows())))


def test_demo_like_summary_holds_only_informative_columns(demo_like):
    shown = results.summary(demo_like)
    assert len(shown.columns) + len(shown.index.names) <= 8
    for column in shown.columns:
        assert shown[column].nunique() > 1, f"{column} says the same in every row"
    assert not [c for c in shown.columns if "chance" == c or c.startswith("classification chance")]
    # retrieval and passkey numbers carry the needle's distance from the question (a range: several)
    located = [c for c in shown.columns if c.startswith(("passkey @", "retrieval"))]
    assert located and all("tokens from the question" in c for c in located)
    retrieval = next(c for c in shown.columns if c.startswith("retrieval"))
    assert "needle 4096–8190 tokens from the question" in retrieval
    # what was left out is named, with why
    dropped = dict(left_out(shown))
    assert dropped and all(why for why in dropped.values())


def test_retrieval_counts_haystacks_as_units(demo_like):
    """12 questions on 2 haystacks: the summary's n is the independent units when the clustering is applied
    (H1's stats); the rows behind them are never fewer."""
    s = results.summary(demo_like, with_ci=False).set_index("method")
    name = next(c for c in s.columns if c.startswith("retrieval") and c.endswith("@ longest"))
    assert s.loc["ntk", f"{name}_n"] in (2, 12) and s.loc["ntk", f"{name}_rows"] == 12


def test_headline_cites_n_and_p(demo_like, tmp_path):
    run = tmp_path / "run"
    results.RecordWriter(run).write(demo_like.to_dict("records"))
    md = results.report(run).read_text()
    head = md.split("\n\n", 2)[1].splitlines()
    assert 1 <= len(head) <= 5
    # passkey at 12288: ntk x2 and yarn x2 6/... vs plain's 0: every difference line gives n and p
    diffs = [line for line in head if " beat " in line or " trail " in line]
    assert diffs
    for line in diffs:
        assert "n = " in line and ("p = " in line or "p ≤ " in line or "p < " in line or "excludes" in line)
    passkey = next(line for line in diffs if "passkey" in line)
    assert "ntk ×2 and yarn ×2 beat plain" in passkey and "tokens from the question" in passkey
    # 18 prompts per setting at 12288: ntk/yarn miss one (depth 0.5, trial 0), plain all: 17 discordant
    # pairs all one way, McNemar p = 2 / 2**17
    assert 2 / 2**17 < 0.001
    assert "17/18 and 17/18 vs 0/18" in passkey and "p < 0.001" in passkey
    assert "n = 18 trials" in passkey
    assert "vs 0/18 (n = 18 trials, McNemar" in passkey  # one row per trial: the counts are of the units
    # retrieval has plots by length and by needle distance
    assert "plots/retrieval_answer_top1_by_distance_smollm2-135m_essays.png" in md
    assert "plots/retrieval_answer_logprob_by_distance_smollm2-135m_essays.png" in md


def test_headline_gives_n_in_haystacks_and_names_question_counts_as_rows(tmp_path):
    """6 haystacks x 6 questions: n is 6 (haystacks), never the 36 questions. Each haystack's contrast is the
    same one way, so the exact sign-flip test over 6 clusters gives p = 2 / 2**6 = 0.031 for both settings;
    the 0/1 counts are of the 36 rows (questions) and say so, the log-probability line names its rows apart
    from n."""
    run = tmp_path / "run"
    results.RecordWriter(run).write(_declare(_retrieval_rows(haystacks=6)))
    head = results.report(run).read_text().split("\n\n", 2)[1].splitlines()
    top1 = next(line for line in head if "answer_top1" in line)
    logprob = next(line for line in head if "answer_logprob" in line)
    assert f"{2 / 2**6:.3f}" == "0.031"
    assert top1.endswith(": 36/36 and 36/36 vs 0/36 rows (n = 6 haystacks, sign-flip p ≤ 0.031).")
    # ntk/yarn minus plain per question: (-0.5 + 0.1 q) - (-3 + 0.1 q) = 2.5 on every question
    assert "difference 2.500 [2.500, 2.500]" in logprob
    assert logprob.endswith("(n = 6 haystacks, sign-flip p ≤ 0.031; 36 rows on them).")
    for line in (top1, logprob):
        assert "n = 36" not in line and "rows on 6" not in line


def test_headline_says_when_nothing_is_significant(tmp_path):
    rows = [r for r in _rank_rows() if r["length"] == 1000]  # the same ranks everywhere
    run = tmp_path / "run"
    results.RecordWriter(run).write(rows)
    md = results.report(run).read_text()
    head = md.split("\n\n", 2)[1]
    assert head.startswith("Nothing is significant") and "at least 6 independent units" in head
    assert "at most 0" in head and len(head.splitlines()) == 1


def test_values_outside_the_declared_range_are_left_out_and_counted(tmp_path):
    """Issue 41 item 4: a value outside its metric's declared range is in no table or comparison, and the
    report says how many were left out."""
    rows = [r for r in _rank_rows() if r["length"] == 1000]
    rows[0] = {**rows[0], "value": 0.5}  # a rank below 1, the declared lower end
    run = tmp_path / "run"
    results.RecordWriter(run).write(rows)
    md = results.report(run).read_text()
    left = [line for line in md.splitlines() if line.startswith("Left out of every table")]
    expected = (
        "Left out of every table, comparison and reach: 1 value outside the metric's declared range — "
        "ranker/rank 1 row (0.5; range [1, inf]); check the task that wrote them."
    )
    assert left == [expected]
    df = results.load(run)
    cells = results.estimates(df, "ranker", "rank").set_index("method")
    # plain keeps its 7 questions of rank 1 (8 written, one out of range), ext its 8
    assert cells.loc["plain", "n"] == 7 and cells.loc["plain", "mean"] == 1.0 and cells.loc["ext", "n"] == 8
    pairs = results.paired_differences(df, "ranker", "rank", "plain").set_index("method")
    assert pairs.loc["ext", "n"] == 7  # the left-out question pairs with nothing


def test_withheld_longppl_is_said_with_its_key_tokens(synthetic_records, tmp_path):
    """LongPPL rests on key tokens: where a length's count stays below the task's minimum (recorded in the
    rows' task_options) no longppl row is written, and the report says so in one line per length."""
    rows = synthetic_records("r", tasks=("perplexity",), settings=(("plain", 1.0, {}),), lengths=(1024, 2048))
    extra = []
    for L, count in ((1024, 41), (2048, 12)):
        base = next(r for r in rows if r["length"] == L and r["metric"] == "ppl" and r["doc"] is None)
        topts = {**base["task_options"], "key_tokens": {"min_key_tokens": 30}}
        extra.append({**base, "metric": "longppl_key_tokens", "value": count, "n": 3, "task_options": topts})
        if count >= 30:
            extra.append({**base, "metric": "longppl", "value": 20.0, "n": count, "task_options": topts})
    run = tmp_path / "run"
    results.RecordWriter(run).write(_declare(rows + extra))
    md = results.report(run).read_text()
    lines = [line for line in md.splitlines() if line.startswith("LongPPL withheld")]
    assert lines == [
        "LongPPL withheld at 2048: 12 key tokens in 3 documents (below the minimum of 30), for plain."
    ]


# -------------------------------------------------------------------------------------------- bad arguments
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"baseline": "nosuch"}, "baseline method 'nosuch' is not in the records — use one of: plain, ext"),
        ({"trained_context": -5}, "trained_context must be a positive number of tokens, got -5"),
        ({"trained_context": 0}, "trained_context must be a positive number"),
    ],
)
def test_summary_refuses_bad_arguments_in_one_line(kwargs, needle):
    df = normalize(pd.DataFrame(_rank_rows()))
    with pytest.raises(results.ResultsError) as e:
        results.summary(df, **kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_summary_of_an_empty_frame_is_one_line():
    with pytest.raises(results.ResultsError, match="no records to summarise") as e:
        results.summary(pd.DataFrame())
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ the plots
def test_perplexity_title_promises_a_band_only_when_drawn(demo_like, tmp_path):
    three = results.plot_perplexity(demo_like, tmp_path / "three.png")
    assert "band: skew_t 95% (each edge alone 94%)" in three.figure.axes[0].get_title()
    one = demo_like[(demo_like["task"] != "perplexity") | demo_like["doc"].isin([None, "doc0"])]
    one = one[(one["task"] != "perplexity") | one["doc"].notna()]
    single = results.plot_perplexity(one, tmp_path / "one.png")
    assert single.data["lo"].isna().all() and "band: 95%" not in single.figure.axes[0].get_title()


def test_plot_by_distance_one_line_per_method(demo_like, tmp_path):
    from ropebench.results.plots import plot_by_distance

    plot = plot_by_distance(demo_like, tmp_path / "d.png", task="retrieval", metric="answer_logprob")
    assert set(plot.data["label"]) == {"plain ×1", "ntk ×2", "yarn ×2"}
    # per distance: both haystacks' question q, so plain's value there is -3 + 0.1 q
    plain = plot.data[plot.data["label"] == "plain ×1"].sort_values("distance")
    assert plain["distance"].tolist() == [4096 + 819 * q - (q == 5) for q in range(6)]
    assert plain["value"].tolist() == pytest.approx([-3.0 + 0.1 * q for q in range(6)])
