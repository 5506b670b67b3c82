"""Effective length under every published rule (an absolute bar, RULER-style, or RULER's own 0.856; NoLiMa's
0.85 of the own short-context score; the baseline at the trained context), a summary and report driven by the
metrics present (a task the results layer never heard of shows up), and theory's predicted reach beside the
measured one. Expected values are computed by hand: Wilson's formula written out, Student's t from printed
tables, Men et al.'s sum by brute force."""

import math
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN, Metric

ROOT = Path(__file__).resolve().parents[2]
Z = 1.959963984540054
T975_23 = 2.0687  # Student's t 0.975 quantile, 23 degrees of freedom (printed tables)
# the plugin task's declarations (tasks.kit.declare(metrics=...) writes them into every row as ``meaning``)
HIT = Metric(
    "rate", "higher", "fraction of prompts", "hit", reach=("threshold", "short", "trained"), lo=0, hi=1
)
NEEDLES = {
    "hit": HIT,
    "rank1": Metric("rate", "higher", "fraction of prompts", "ranked first", reach=("threshold", "short")),
    "logprob": Metric("mean", "higher", "nats/token", "answer log-probability", hi=0.0),
}


def _declared(rows, meanings):
    """The rows with their metric's declaration attached, as the sweep writes them."""
    return [{**r, "meaning": meanings[r["metric"]].to_json()} if r["metric"] in meanings else r for r in rows]


def _wilson_hi(k, n):
    p, z2 = k / n, Z * Z
    return ((p + z2 / (2 * n)) + Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)


def _wilson_lo(k, n):
    """The lower end of Wilson's score interval (Wilson 1927), written out."""
    p, z2 = k / n, Z * Z
    return ((p + z2 / (2 * n)) - Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)


def _rows(per_length, method="plain", trials=24, options='{"trained_context": 8000}'):
    """0/1 passkey-like rows: ``per_length`` = {length: number correct of ``trials``}."""
    base = {
        "task": "needles",
        "model": "m",
        "factor": 1.0,
        "status": "ok",
        "seed": 0,
        "n": 1,
        "corpus": "c",
        "metric": "hit",
        "depth": 0.5,
        "method": method,
        "options": options,
        "meaning": HIT.to_json(),
    }
    return [
        {**base, "length": L, "trial": t, "value": float(t < k)}
        for L, k in per_length.items()
        for t in range(trials)
    ]


# ----------------------------------------------------------------------------- NoLiMa: 0.85 x own short score
def test_nolima_rule_by_hand():
    # own score 20/24 at the shortest length: the bar is 0.85 x 0.833 = 0.708 (NoLiMa's point estimate)
    e = results.effective_length(
        normalize(pd.DataFrame(_rows({1000: 20, 2000: 24, 4000: 20, 8000: 10}))),
        "needles",
        "hit",
        rule="short",
    ).iloc[0]
    bar = 0.85 * 20 / 24
    assert _wilson_lo(20, 24) >= 0.5  # the base is established (lower bound above the floor)
    assert _wilson_lo(24, 24) >= bar  # 2000 passes
    assert _wilson_lo(20, 24) < bar <= 20 / 24  # 4000 neither passes nor fails: n too small
    assert 10 / 24 < bar  # 8000 fails
    assert e["reference_length"] == 1000 and e["reference_value"] == pytest.approx(20 / 24)
    assert (e["effective_length"], e["stopped_at"], e["stopped"]) == (2000, 4000, "not established")
    assert e["first_failure"] == 8000 and e["claim"] == "2000" and "NoLiMa" in e["rule"]
    assert f"({bar:.3f}; NoLiMa)" in e["rule"]


def test_nolima_rule_needs_an_established_short_score():
    # 10/24 at the shortest length: lower bound 0.245 < 0.5, so there is no short-context score to keep 85% of
    e = results.effective_length(
        normalize(pd.DataFrame(_rows({1000: 10, 2000: 10}))), "needles", "hit", rule="short"
    ).iloc[0]
    assert _wilson_lo(10, 24) < 0.5
    assert pd.isna(e["effective_length"]) and e["claim"] == "–" and e["rule"].startswith("not computed")


def test_nolima_rule_claims_nothing_from_one_length():
    """One tested length is only the base: it passes by definition, so alone it must not claim itself (the
    demo's passkey at 10240 read "≥ 10240" for 6/6)."""
    e = results.effective_length(
        normalize(pd.DataFrame(_rows({10240: 24}))), "needles", "hit", rule="short"
    ).iloc[0]
    assert pd.isna(e["effective_length"]) and e["claim"] == "–" and e["rule"].startswith("not computed")


def test_the_three_rules_can_disagree():
    # the own short score is 0.75, so NoLiMa's bar (0.64) is below the absolute 0.8, which 18/24 already
    # misses; 21/24 (lower bound 0.69) passes NoLiMa's; plain at 8000 (the trained context) sets the third bar
    rows = _rows({1000: 18, 2000: 21, 4000: 24, 8000: 24}) + _rows(
        {1000: 18, 2000: 21, 4000: 21, 8000: 21}, "ext"
    )
    df = normalize(pd.DataFrame(rows))
    by = {
        rule: results.effective_length(df, "needles", "hit", rule=rule).set_index("method")["claim"]
        for rule in ("threshold", "short", "trained")
    }
    assert _wilson_lo(21, 24) >= 0.85 * 18 / 24 and _wilson_lo(21, 24) < 0.8 <= 21 / 24
    # 18/24 misses 0.8 on its estimate, but its upper bound does not: the data do not establish a failure
    assert 18 / 24 < 0.8 <= _wilson_hi(18, 24)
    assert by["threshold"]["ext"] == "not established (n too small)"
    assert by["short"]["ext"] == "≥ 8000"
    # plain's lower bound at 8000 (24/24: 0.862) is the bar at every length: 18/24 at 1000 holds it inside
    assert 18 / 24 < _wilson_lo(24, 24) <= _wilson_hi(18, 24)
    assert by["trained"]["ext"] == by["trained"]["plain"] == "not established (n too small)"


def test_a_failure_needs_the_favourable_bound_to_miss():
    """Issue 33.4: 16/16 at 4096 and 11/16 at 8192 (Wilson [0.444, 0.858], holding 0.8) is no failure at
    8192; 2/16 (upper bound below 0.8) is."""
    lo, hi = _wilson_lo(11, 16), _wilson_hi(11, 16)
    assert (round(lo, 3), round(hi, 3)) == (0.444, 0.858) and lo < 0.8 < hi
    e = results.effective_length(
        normalize(pd.DataFrame(_rows({4096: 16, 8192: 11}, trials=16))), "needles", "hit"
    ).iloc[0]
    assert (e["effective_length"], e["stopped_at"], e["stopped"]) == (4096, 8192, "not established")
    assert pd.isna(e["first_failure"]) and e["claim"] == "≥ 4096"
    assert (e["fail_lo"], e["fail_hi"]) == pytest.approx((lo, hi))
    assert _wilson_hi(2, 16) < 0.8
    failed = results.effective_length(
        normalize(pd.DataFrame(_rows({4096: 16, 8192: 2}, trials=16))), "needles", "hit"
    ).iloc[0]
    assert (failed["stopped"], failed["first_failure"], failed["claim"]) == ("failed", 8192, "4096")


def test_nolima_base_must_be_a_short_length():
    """NoLiMa's base is a short-context score: with the trained context 8000, a base at 4000 (> 8000 / 4)
    gives no "short" reach, however well it scores; one at 2000 does."""
    rows = _rows({4000: 24, 8000: 24, 16000: 24})
    e = results.effective_length(normalize(pd.DataFrame(rows)), "needles", "hit", rule="short").iloc[0]
    assert pd.isna(e["effective_length"]) and e["rule"].startswith("not computed") and "≤ 2000" in e["rule"]
    e = results.effective_length(
        normalize(pd.DataFrame(_rows({2000: 24, 8000: 24, 16000: 24}))), "needles", "hit", rule="short"
    ).iloc[0]
    assert e["claim"] == "≥ 16000" and e["reference_length"] == 2000


def test_nolima_base_is_capped_at_2048_tokens_for_a_long_trained_context():
    """Issue 37: a quarter of a 128K trained context is 32768 tokens, no short context; NoLiMa's bases are
    250-1K tokens, so the base may be at most 2048 tokens whatever the trained context."""
    long_model = '{"trained_context": 131072}'
    at_4096 = _rows({4096: 24, 65536: 24, 131072: 24}, options=long_model)
    e = results.effective_length(normalize(pd.DataFrame(at_4096)), "needles", "hit", rule="short").iloc[0]
    assert pd.isna(e["effective_length"]) and e["rule"].startswith("not computed")
    assert "≤ 2048" in e["rule"] and "add a length ≤ 2048" in e["rule"]
    at_2048 = _rows({2048: 24, 65536: 24, 131072: 24}, options=long_model)
    e = results.effective_length(normalize(pd.DataFrame(at_2048)), "needles", "hit", rule="short").iloc[0]
    assert e["reference_length"] == 2048 and e["claim"] == "≥ 131072"
    # below the cap a quarter of the trained context still rules: 8000 / 4 = 2000 < 2048 (the test above)
    at_2048_short_model = _rows({2048: 24, 8000: 24})
    e = results.effective_length(
        normalize(pd.DataFrame(at_2048_short_model)), "needles", "hit", rule="short"
    ).iloc[0]
    assert pd.isna(e["effective_length"]) and "≤ 2000" in e["rule"]


@pytest.mark.parametrize("short_length", [4096, 0, 1.5, True])
def test_nolima_short_length_above_the_cap_is_refused(short_length):
    rows = normalize(pd.DataFrame(_rows({1024: 24, 8000: 24})))
    with pytest.raises(results.ResultsError, match="short_length must be a length in tokens from 1 to 2048"):
        results.effective_length(rows, "needles", "hit", rule="short", short_length=short_length)


def test_nolima_cap_is_named_in_the_legend():
    from ropebench.results.overview import legend_lines

    (line,) = [x for x in legend_lines(rules={("rate", "short")}) if x.startswith("reach (short)")]
    assert "min(a quarter of the trained context, 2048) tokens" in line and "250-1K" in line


# ---------------------------------------------------------------------------- perplexity against the baseline
def _ppl_rows(method, per_doc):
    return [
        {
            "task": "perplexity",
            "model": "m",
            "factor": 1.0,
            "status": "ok",
            "seed": 0,
            "corpus": "c",
            "options": '{"trained_context": 8192}',
            "method": method,
            "metric": "ppl_tail",
            "meaning": BUILT_IN[("perplexity", "ppl_tail")].to_json(),
            "length": L,
            "doc": f"d{i}",
            "value": v,
            "n": 100,
        }
        for L, values in per_doc.items()
        for i, v in enumerate(values)
    ]


def test_perplexity_trained_rule_is_relative_to_the_baseline():
    plain = {4096: [10.0, 11.0, 12.0], 8192: [10.0, 11.0, 12.0], 16384: [40.0, 44.0, 48.0]}
    ext = {L: [1.2 * v for v in plain[8192]] for L in (4096, 8192, 16384)}  # flat, but 20% above plain
    df = normalize(pd.DataFrame(_ppl_rows("plain", plain) + _ppl_rows("ext", ext)))
    own = results.effective_length(df, "perplexity", rule="threshold").set_index("method")
    vs_plain = results.effective_length(df, "perplexity", rule="trained").set_index("method")
    assert own.loc["ext", "claim"] == "≥ 16384"  # flat against its own value at 8192
    # every document 1.2 x plain's at the trained context: the ratio is 1.2 > 1.1 already there
    assert (
        vs_plain.loc["ext", "claim"] == "< 8192"
        and vs_plain.loc["ext", "at_value"] != vs_plain.loc["ext", "at_value"]
    )
    assert vs_plain.loc["ext", "fail_value"] == pytest.approx(1.2)
    assert vs_plain.loc["ext", "reference_value"] == pytest.approx(
        math.exp(np.log([10.0, 11.0, 12.0]).mean())
    )
    assert "plain's value at 8192" in vs_plain.loc["ext", "rule"]
    assert vs_plain.loc["plain", "claim"] == own.loc["plain", "claim"] == "8192"
    with pytest.raises(results.ResultsError, match="does not declare rule 'short'"):
        results.effective_length(df, "perplexity", rule="short")


# ----------------------------------------------------------------------------- a task results never heard of
# ------------------------------------------------------------------------- the absolute bar, and RULER's own
def test_rulers_own_bar_is_a_named_option():
    """RULER's threshold is Llama-2-7B's 4K score, 85.6% on its 13-task average (Hsieh et al. 2024): 18/18 has
    Wilson lower bound 18 / (18 + z²) = 0.824, above the default 0.8 but below 0.856, whose upper bound (1)
    does not miss: it passes the default bar and is not established under RULER's."""
    from ropebench.results.reach_rules import bar_value

    assert bar_value("ruler") == 0.856 == bar_value("RULER")
    assert bar_value("0.9") == 0.9 and bar_value(0.7) == 0.7
    lo = _wilson_lo(18, 18)
    assert lo == pytest.approx(18 / (18 + Z * Z)) and 0.8 <= lo < 0.856
    df = normalize(pd.DataFrame(_rows({2000: 18}, trials=18)))
    default = results.effective_length(df, "needles", "hit").iloc[0]
    ruler = results.effective_length(df, "needles", "hit", threshold="ruler").iloc[0]
    assert default["claim"] == "≥ 2000" and ruler["claim"] == "not established (n too small)"
    assert "absolute bar 0.856 (RULER's:" in ruler["rule"]
    # the default is named for what it is: an absolute bar, with RULER's own number beside it
    assert default["rule"] == (
        "Wilson lower bound ≥ absolute bar 0.8 (RULER-style; RULER's own bar is 0.856, Llama-2-7B's 4K "
        "average over 13 tasks)"
    )
    for bad in ("rulers", 0, 1.5, True):
        with pytest.raises(
            results.ResultsError, match="threshold must be an accuracy in \\(0, 1\\] or one of: ruler"
        ):
            results.effective_length(df, "needles", "hit", threshold=bad)


def test_the_cli_takes_rulers_bar_by_name(monkeypatch, capsys):
    """`ropebench report RUN --bar ruler` (or --threshold ruler) hands RULER's 0.856 to the report; a number
    passes as given, the default is 0.8, and a name it does not know is one line and exit 2."""
    from ropebench.results import reporting  # a submodule: imported here, not by an earlier test
    from ropebench.results.__main__ import main

    given = []
    monkeypatch.setattr(reporting, "report", lambda *a, **kw: given.append(kw["threshold"]) or "r")
    for argv in (["--bar", "ruler"], ["--threshold", "RULER"], ["--bar", "0.9"], []):
        assert main(["report", "run", *argv]) == 0
    assert given == [0.856, 0.856, 0.9, 0.8]
    capsys.readouterr()
    assert main(["report", "run", "--bar", "strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: threshold must be an accuracy") and "ruler" in err[0]


@pytest.fixture(scope="module")
def needles(synthetic, synthetic_task_records):
    trained = synthetic.TRAINED
    settings = (("plain", 1.0, {"trained_context": trained}), ("yarn", 2.0, {"trained_context": trained}))
    return _declared(synthetic_task_records("needles", settings=settings, trials=24), NEEDLES)


def test_unknown_suite_shows_in_summary_with_every_rule(needles):
    df = normalize(pd.DataFrame(needles))
    s = results.summary(df, with_ci=False).set_index("method")
    # hit: plain 24/24 up to 8192, 0/24 at 16384; yarn x2 24/24 everywhere
    assert s.loc["plain", "needles hit @ longest"] == 0.0 and s.loc["yarn", "needles hit @ longest"] == 1.0
    assert s.loc["plain", "needles hit @ longest_lo"] == 0.0
    assert s.loc["yarn", "needles hit @ longest_lo"] == pytest.approx(_wilson_lo(24, 24))
    assert s.loc["yarn", "needles hit @ longest_significant"]  # 24 discordant prompts, all one way
    assert _wilson_lo(24, 24) >= 0.85  # so the absolute 0.8 and NoLiMa's 0.85 x 1.0 both pass at 24/24
    for rule in ("", " (short)", " (trained)"):
        assert s.loc["plain", f"needles hit reach{rule}"] == "8192"
        assert s.loc["yarn", f"needles hit reach{rule}"] == "≥ 16384"
    assert "NoLiMa" in s.loc["plain", "needles hit reach (short)_rule"]
    assert s.loc["plain", "needles rank1 reach"] == "≥ 16384"  # rank1 holds to twice the reach
    assert "needles rank1 reach (trained)" not in s.columns  # not a rule its declaration names
    # logprob (a mean): the value with a t interval over the 24 prompts, a paired difference, no reach
    values = -2.9 + 0.05 * (np.arange(24) - 11.5)
    half = T975_23 * values.std(ddof=1) / math.sqrt(24)
    assert s.loc["plain", "needles logprob @ longest"] == pytest.approx(-2.9)
    assert (
        s.loc["plain", "needles logprob @ longest_lo"],
        s.loc["plain", "needles logprob @ longest_hi"],
    ) == pytest.approx((-2.9 - half, -2.9 + half), abs=1e-4)
    assert s.loc["yarn", "needles logprob @ longest_significant"]
    assert not any(c.startswith("needles logprob reach") for c in s.columns)
    shown = results.summary(df)
    # two settings, one task: every informative column fits; rank1 is 24/24 at 16384 and its reach "≥ 16384"
    # in both rows: they say nothing about the settings and are named in the footnote instead
    assert {"needles hit @ 16384", "needles logprob @ 16384", "needles hit reach"} <= set(shown.columns)
    left = dict(results.overview.left_out(shown))
    assert left["needles rank1 reach"] == "≥ 16384 in every row"
    assert left["needles rank1 @ 16384"].endswith("in every row") and "needles rank1 @ 16384" not in shown
    assert (
        shown.loc[("yarn", 2.0), "needles hit @ 16384"] == f"1.000 [{_wilson_lo(24, 24):.3f}, 1.000] n=24 *"
    )


def test_unknown_suite_shows_in_the_report(needles, tmp_path):
    run = tmp_path / "run"
    results.RecordWriter(run).write(needles)
    md = results.report(run).read_text()
    stems = {p.stem for p in (run / "tables").iterdir()}
    assert {
        "needles_hit_vs_plain",
        "needles_rank1_vs_plain",
        "needles_logprob_vs_plain",
        "reach_needles_hit_threshold",
        "reach_needles_hit_short",
        "reach_needles_hit_trained",
        "reach_needles_rank1_short",
    } <= stems
    assert (
        md.index("## Summary")
        < md.index("## Differences to plain")
        < md.index("## Effective context length")
        < md.index("## needles")
        < md.index("## Legend")
    )
    assert "needles hit reach (short) (needles/hit)" in md and "NoLiMa" in md
    # the default bar is named with its value, and 0.8 is never called RULER's (RULER's own is 0.856)
    assert "absolute bar 0.8 (RULER-style; RULER's own bar is 0.856" in md
    assert not re.search(r"RULER[^;.]*\b0\.8\b", md)
    ruler = results.report(run, tmp_path / "ruler", threshold="ruler").read_text()
    assert "absolute bar 0.856 (RULER's: Llama-2-7B's 4K average over its 13 tasks" in ruler
    assert "absolute bar 0.8 " not in ruler
    # the headline's reach line names the bar short, with its value
    assert "- needles hit reach (Wilson lower bound ≥ absolute bar 0.8): " in md
    assert "- needles hit reach (Wilson lower bound ≥ RULER's bar 0.856): " in ruler
    assert "needles/logprob minus plain" in md and "[95% interval: paired t]" in md  # a mean: differences
    plots = {p.stem for p in (run / "plots").iterdir()}
    # every headline metric of the task gets a plot from its declaration: rates with depths a heatmap
    assert {
        "needles_hit_heatmap_smollm2-135m_filler",
        "needles_rank1_heatmap_smollm2-135m_filler",
        "needles_logprob_smollm2-135m_filler",
    } <= plots


# ---------------------------------------------------------------------------------- theory beside measurement
def test_theory_only_in_its_own_section(synthetic_records, synthetic_theory_records, tmp_path):
    """Men et al.'s number is a bound for a base trained for a context: the theory section shows it, labelled
    by its declaration, and neither the summary nor the reach tables set it beside a measurement."""
    rows = synthetic_records("r", tasks=("passkey",), trials=6) + synthetic_theory_records("r", limit=10000)
    df = normalize(pd.DataFrame(rows))
    numeric = results.summary(df, with_ci=False)
    assert not [c for c in numeric.columns if "Men" in c or "predicted" in c]
    assert not [c for c in results.summary(df).columns if "Men" in c or "predicted" in c]
    run = tmp_path / "run"
    results.RecordWriter(run).write(rows)
    md = results.report(run).read_text()
    summary_part = md.split("## Summary", 1)[1].split("## Theory", 1)[0]
    assert "Men et al" not in summary_part
    theory = md.split("## Theory (not measurements)", 1)[1].split("\n## ", 1)[0]
    label = BUILT_IN[("theory", "men_reach")].description
    table = [line for line in theory.splitlines() if line.startswith("|")]
    assert label in table[0]
    cells = {line.split("|")[1].strip(): line for line in table[2:]}
    assert "| 3616 |" in cells["plain"] and "| ≥ 10000 |" in cells["yarn ×4"]  # held up to the limit
    assert "not a training-free prediction" in theory
    assert "## theory" not in md  # theory rows are no task


# ------------------------------------------------------------------------------ the sweep records theory rows
def _first_negative(inv_freq, limit):
    """Men et al.'s criterion by brute force: the first m with sum_i cos(m theta_i) < 0, else the limit."""
    m = np.arange(limit, dtype=np.float64)[:, None]
    bad = np.flatnonzero(np.cos(m * np.asarray(inv_freq, np.float64)[None, :]).sum(axis=1) < 0)
    return int(bad[0]) if bad.size else limit


@pytest.mark.parametrize(
    "method, factor, theta_scale, divide",
    [
        ("plain", 1.0, 1.0, 1.0),
        ("pi", 2.0, 1.0, 2.0),  # position interpolation: every frequency / 2
        # dynamic NTK at factor x the trained context (2 x 128): base x (2 * 256 / 128 - 1)^(d / (d - 2)),
        # d = 16
        ("dynamic-ntk", 2.0, 3.0 ** (16 / 14), 1.0),
    ],
)
def test_theory_records_from_the_patched_frequencies(method, factor, theta_scale, divide, tiny_llama_factory):
    from ropebench import extend
    from ropebench.sweep_lib import run as R

    model = tiny_llama_factory(max_position_embeddings=128)  # head_dim 16, rope_theta 1e4
    theta = model.config.rope_parameters["rope_theta"]
    inv = (theta * theta_scale) ** -(np.arange(0, 16, 2) / 16) / divide
    with extend.patched(model, method, factor) as handle:
        rows = {r["metric"]: r for r in R.theory_records(model, handle, longest=256)}
    assert rows["men_reach"]["value"] == _first_negative(inv, 1024)
    assert rows["men_reach"]["task_options"]["limit"] == 4 * 256
    trained = theta ** -(np.arange(0, 16, 2) / 16)  # Liu et al.'s d_crit: fixed by pretraining
    assert rows["critical_dimension"]["value"] == 2 * int((2 * math.pi / trained <= 128).sum())
    assert rows["base_lower_bound"]["length"] == 128
    b = rows["base_lower_bound"]["value"]  # the criterion holds for plain RoPE of that base up to 128
    assert _first_negative(b ** -(np.arange(0, 16, 2) / 16), 128) == 128


def test_no_theory_rows_for_position_remapping(tiny_llama_factory):
    from ropebench import extend
    from ropebench.sweep_lib import run as R

    model = tiny_llama_factory(max_position_embeddings=128)
    with extend.patched(model, "self-extend", 2.0) as handle:
        assert R.theory_records(model, handle, longest=256) == []
