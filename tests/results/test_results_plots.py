"""Plots: files are written, and the data behind the axes is the right rows."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.store import RecordWriter

LENGTHS = [1024, 2048, 4096, 8192, 16384]


@pytest.fixture(scope="module")
def synthetic_frame(synthetic_records, tmp_path_factory):
    """results.load of a run of synthetic records (tests/results/synthetic.py)."""
    run = tmp_path_factory.mktemp("run")
    RecordWriter(run).write(synthetic_records("run"))
    return results.load(run)


def _is_png(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _curves(ax):
    """(x, y) of every drawn line, as tuples, for comparison with the table."""
    return [
        (tuple(np.asarray(line.get_xdata(), float)), tuple(np.round(np.asarray(line.get_ydata(), float), 6)))
        for line in ax.get_lines()
    ]


def test_perplexity_plot(synthetic_frame, tmp_path):
    p = results.plot_perplexity(synthetic_frame, tmp_path / "ppl.png")
    assert _is_png(p.path)
    ax = p.figure.axes[0]
    assert ax.get_yscale() == "log"
    curves = _curves(ax)
    t = results.table(synthetic_frame, "perplexity", "ppl")
    for (method, factor), row in t.iterrows():  # every method x factor line carries exactly the table's means
        assert (tuple(map(float, LENGTHS)), tuple(np.round(row.to_numpy(float), 6))) in curves
    # the dashed trained-context line (8192, from task_options)
    vline = [line for line in ax.get_lines() if tuple(line.get_xdata()) == (8192, 8192)]
    assert len(vline) == 1 and vline[0].get_linestyle() == "--"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["plain ×1", "linear ×2", "yarn ×2", "yarn ×4", "trained context (8k)"]
    title = ax.get_title()
    assert "smollm2-135m" in title and "sotu" in title and "factors 1, 2, 4" in title
    assert "length" in ax.get_xlabel() and "ppl" in ax.get_ylabel()
    # the data frame behind the plot holds only aggregated rows: one point per method x factor x length
    assert len(p.data) == 4 * 5


def test_perplexity_plot_without_trained_context_has_no_line(synthetic_frame, tmp_path):
    d = synthetic_frame.copy()
    d["task_options"] = "{}"
    p = results.plot_perplexity(d, tmp_path / "ppl.png")
    assert not [line for line in p.figure.axes[0].get_lines() if len(set(line.get_xdata())) == 1]
    p = results.plot_perplexity(d, tmp_path / "ppl2.png", trained_context=4096, factor=[1.0, 2.0])
    assert [line for line in p.figure.axes[0].get_lines() if tuple(line.get_xdata()) == (4096, 4096)]
    assert set(p.data["label"]) == {"plain ×1", "linear ×2", "yarn ×2"}


def test_passkey_heatmap(synthetic_frame, tmp_path):
    p = results.plot_passkey(synthetic_frame, tmp_path / "passkey.png")
    assert _is_png(p.path)
    panels = [ax for ax in p.figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["plain ×1", "linear ×2", "yarn ×2", "yarn ×4"]
    plain = panels[0].collections[0]
    assert plain.get_clim() == (0, 100)
    grid = np.asarray(plain.get_array(), float).reshape(3, 5)  # depth x length
    # plain: 0% beyond the trained context; 50% at depth 0.5, length 8192 (one of two trials missed)
    assert grid[:, 4].tolist() == [0, 0, 0]
    assert grid[1, 3] == 50 and grid[0, 3] == 100 and grid[2, 0] == 100
    yarn4 = np.asarray(panels[3].collections[0].get_array(), float)
    assert (yarn4 == 100).all()
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["1k", "2k", "4k", "8k", "16k"]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["0%", "50%", "100%"]
    assert "smollm2-135m" in p.figure.get_suptitle() and "filler" in p.figure.get_suptitle()
    assert p.data["size"].eq(2).all()  # two trials behind every cell


def test_classification_plot_with_chance(synthetic_frame, tmp_path):
    p = results.plot_classification(synthetic_frame, tmp_path / "cls.png")
    assert _is_png(p.path)
    ax = p.figure.axes[0]
    chance = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {0.4}
    curves = _curves(ax)
    t = results.table(synthetic_frame, "classification", "accuracy")
    for _, row in t.iterrows():
        assert (tuple(map(float, LENGTHS)), tuple(np.round(row.to_numpy(float), 6))) in curves
    assert ax.get_ylim()[0] == 0
    assert "smollm2-135m" in ax.get_title() and "sotu" in ax.get_title() and "factors" in ax.get_title()
    assert p.extra["chance"] == {length: pytest.approx(0.4) for length in LENGTHS}


def test_plot_errors(synthetic_frame, tmp_path):
    two = pd.concat([synthetic_frame, synthetic_frame.assign(model="other", run="r2")], ignore_index=True)
    with pytest.raises(results.ResultsError, match="several models.*model="):
        results.plot_perplexity(two, tmp_path / "x.png")
    assert results.plot_perplexity(two, tmp_path / "x.png", model="other").path.exists()
    with pytest.raises(results.ResultsError, match="unknown task"):
        results.plot_passkey(synthetic_frame[synthetic_frame["task"] != "passkey"], tmp_path / "y.png")


def _bands(ax):
    """(x, lo, hi) of every fill_between band, from the polygon's vertices."""
    out = []
    for coll in ax.collections:
        for path in coll.get_paths():
            v = path.vertices
            xs = sorted(set(np.round(v[:, 0], 6)))
            lo = [v[np.isclose(v[:, 0], x), 1].min() for x in xs]
            hi = [v[np.isclose(v[:, 0], x), 1].max() for x in xs]
            out.append((tuple(xs), tuple(np.round(lo, 6)), tuple(np.round(hi, 6))))
    return out


def test_perplexity_bands_are_the_table_intervals(synthetic_frame, tmp_path):
    p = results.plot_perplexity(synthetic_frame, tmp_path / "ppl.png")
    bands = _bands(p.figure.axes[0])
    lo, hi = (
        results.table(synthetic_frame, "perplexity", "ppl", stat="lo"),
        results.table(synthetic_frame, "perplexity", "ppl", stat="hi"),
    )
    assert len(bands) == 4
    for key in lo.index:  # each band spans the bootstrap interval over documents of its line
        want = (
            tuple(map(float, LENGTHS)),
            tuple(np.round(lo.loc[key].to_numpy(float), 6)),
            tuple(np.round(hi.loc[key].to_numpy(float), 6)),
        )
        assert want in bands
    assert {"lo", "hi", "n"} <= set(p.data.columns) and set(p.data["n"]) == {3}
    assert "n=3 documents" in p.figure.axes[0].get_title()
    one = results.plot_perplexity(
        synthetic_frame[synthetic_frame["doc"].isna() | (synthetic_frame["doc"] == "doc0")],
        tmp_path / "one.png",
    )
    assert not _bands(one.figure.axes[0])  # one document: no band rather than a zero-width one


def test_passkey_cells_show_counts_and_title_clears_panels(synthetic_frame, tmp_path):
    p = results.plot_passkey(synthetic_frame, tmp_path / "passkey.png")
    panels = [ax for ax in p.figure.axes if ax.get_title()]
    texts = [t.get_text() for t in panels[0].texts]
    # plain: 0/2 in the three 16k cells, 1/2 at depth 0.5 of 8k, 2/2 elsewhere
    assert len(texts) == 15 and (texts.count("2/2"), texts.count("1/2"), texts.count("0/2")) == (11, 1, 3)
    renderer = p.figure.canvas.get_renderer()
    top_of_panels = max(ax.title.get_window_extent(renderer).y1 for ax in panels)
    assert p.figure._suptitle.get_window_extent(renderer).y0 > top_of_panels  # no overlap
    for ax in panels:
        assert ax.title.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1 - 1
    for upper, lower in zip(panels[:2], panels[2:]):  # 2 x 2: a lower title stays below the x label above it
        assert lower.title.get_window_extent(renderer).y1 < upper.xaxis.label.get_window_extent(renderer).y0


def test_models_are_labelled_by_short_name(synthetic_frame, tmp_path):
    d = synthetic_frame.assign(model="/tmp/pytest-of-x/pytest-1/tiny-llama0")
    titles = [
        results.plot_perplexity(d, tmp_path / "a.png").figure.axes[0].get_title(),
        results.plot_passkey(d, tmp_path / "b.png").figure.get_suptitle(),
        results.plot_classification(d, tmp_path / "c.png").figure.axes[0].get_title(),
    ]
    for t in titles:
        assert "tiny-llama0" in t and "/tmp" not in t


def test_classification_interval_band_and_chance(synthetic_frame, tmp_path):
    p = results.plot_classification(synthetic_frame, tmp_path / "cls.png")
    ax = p.figure.axes[0]
    plain = p.data[p.data["label"] == "plain ×1"].set_index("length")
    assert (plain.loc[16384, "lo"], plain.loc[16384, "hi"]) == pytest.approx(results.wilson(10, 20))
    bands = _bands(ax)
    assert (
        tuple(map(float, LENGTHS)),
        tuple(np.round(plain["lo"].to_numpy(float), 6)),
        tuple(np.round(plain["hi"].to_numpy(float), 6)),
    ) in bands
    assert "n=20 queries" in ax.get_title()
    assert [line for line in ax.get_lines() if line.get_linestyle() == "--"]  # chance line still there


def test_metric_and_distance_plots_label_chance_axes_and_title_alike(tmp_path):
    """plot_metric and plot_by_distance share one finishing step: the declared chance (0.25 here) dashed and
    labelled, the y axis named by the declaration's unit and direction, a title naming task, metric, model,
    corpus and factor. 4 prompts per setting at each of two lengths, the needle at distance L / 2."""
    from ropebench.results.frame import normalize
    from ropebench.results.meaning import Metric
    from ropebench.results.plots import plot_by_distance, plot_metric

    hit = Metric("rate", "higher", "fraction of prompts", "hit", chance=0.25, lo=0, hi=1)
    rows = [
        {
            "run": "r",
            "task": "quiz",
            "model": "/tmp/x/tiny",
            "method": method,
            "factor": factor,
            "options": "{}",
            "corpus": "c",
            "length": L,
            "depth": 0.5,
            "trial": t,
            "distance": L // 2,
            "seed": 0,
            "metric": "hit",
            "value": float(t < k),
            "n": 1,
            "status": "ok",
            "meaning": hit.to_json(),
        }
        for method, factor, k in (("plain", 1.0, 1), ("ext", 2.0, 3))
        for L in (1000, 2000)
        for t in range(4)
    ]
    df = normalize(pd.DataFrame(rows))
    by_length = plot_metric(df, tmp_path / "l.png", task="quiz", metric="hit")
    by_distance = plot_by_distance(df, tmp_path / "d.png", task="quiz", metric="hit")
    for plot, what in ((by_length, "vs length"), (by_distance, "by needle distance")):
        ax = plot.figure.axes[0]
        chance = [line for line in ax.get_lines() if line.get_label() == "chance"]
        assert len(chance) == 1 and tuple(chance[0].get_ydata()) == (0.25, 0.25)
        assert chance[0].get_linestyle() == "--" and plot.extra["chance"] == {0: 0.25}
        assert ax.get_ylabel() == "hit (fraction of prompts, higher is better)"
        title = ax.get_title()
        assert title.startswith(f"quiz: hit {what} — tiny\ncorpus: c · factors 1, 2 · ")
        assert "chance" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert by_length.figure.axes[0].get_xlabel() == "length (tokens)"
    assert by_distance.figure.axes[0].get_xlabel() == "needle distance from the question (tokens)"
    # the distance plot: one point per length x depth, at the needle's distance
    assert sorted(by_distance.data["distance"].unique()) == [500, 1000]
