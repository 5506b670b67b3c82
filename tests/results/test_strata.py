"""Strata (issue 37 item 2): where rows sit at several needle distances, comparisons are made per distance, a
pooled mark stands only where no distance is significantly the other way, the headline says where each
setting wins and loses, and report.md has a per-distance table.

The rows: retrieval's answer_logprob on 6 haystacks (2 questions per needle position), 3 positions whose
distances are those of the README's demo (about 7.8k, 6.0k and 3.9k tokens), with the demo's shape: the
extensions far better at 7.8k, worse at 6.0k. Expected values are computed here from the generated arrays
(numpy, haystack by haystack), not by the code under test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.comparisons import stratum_differences
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN
from ropebench.results.store import RecordWriter

HAYSTACKS, TRIALS = 6, 2
DISTANCE = {0.0: 7796, 0.25: 6000, 0.5: 3938}
DEMO_SHAPE = {  # per depth: plain's mean and each extension's difference to it (docs/measured.md's shape)
    "plain": {0.0: -2.4, 0.25: -0.3, 0.5: -0.35},
    "ntk": {0.0: 1.6, 0.25: -0.35, 0.5: -0.1},
    "yarn": {0.0: 2.0, 0.25: -0.4, 0.5: -0.05},
}
FACTOR = {"plain": 1.0, "ntk": 2.0, "yarn": 2.0}


def _values(shape: dict, seed: int = 0) -> dict:
    """{(method, depth): array (haystacks, trials)}: plain's mean + a haystack effect + a question's noise;
    an extension adds its difference and its own small per-haystack noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for depth in DISTANCE:
        base = (
            shape["plain"][depth]
            + rng.normal(0, 0.1, (HAYSTACKS, 1))
            + rng.normal(0, 0.02, (HAYSTACKS, TRIALS))
        )
        out["plain", depth] = np.minimum(base, -0.001)
        for method in ("ntk", "yarn"):
            own = rng.normal(0, 0.03, (HAYSTACKS, 1))
            out[method, depth] = np.minimum(base + shape[method][depth] + own, -0.001)
    return out


def _records(values: dict) -> list[dict]:
    rows = []
    for (method, depth), v in values.items():
        for h in range(HAYSTACKS):
            for t in range(TRIALS):
                rows.append(
                    {
                        "run": "strata",
                        "cell": f"{method}-8192",
                        "model": "smollm2-135m",
                        "method": method,
                        "factor": FACTOR[method],
                        "options": {},
                        "task": "retrieval",
                        "corpus": "essay",
                        "task_options": {"variant": "niah_multikey"},
                        "length": 8192,
                        "depth": depth,
                        "doc": "niah_multikey",
                        "trial": h * TRIALS + t,
                        "cluster": f"haystack-{h}",
                        "distance": DISTANCE[depth] + (h % 3) - 1,  # a few tokens apart between haystacks
                        "metric": "answer_logprob",
                        "value": float(v[h, t]),
                        "n": 1,
                        "seed": 0,
                        "seconds": 0.1,
                        "status": "ok",
                        "error": None,
                        "meaning": BUILT_IN[("retrieval", "answer_logprob")].to_json(),
                    }
                )
    return rows


def _frame(shape: dict = DEMO_SHAPE) -> tuple[pd.DataFrame, dict]:
    values = _values(shape)
    return normalize(pd.DataFrame(_records(values))), values


def _by_hand(values: dict, method: str, depth: float | None) -> tuple[float, np.ndarray]:
    """The difference to plain over the rows, and the haystacks' contrasts (each haystack's mean minus
    plain's on it), at one depth or pooled over all."""
    depths = list(DISTANCE) if depth is None else [depth]
    a = np.concatenate([values[method, d] for d in depths], axis=1)
    b = np.concatenate([values["plain", d] for d in depths], axis=1)
    return float(a.mean() - b.mean()), a.mean(axis=1) - b.mean(axis=1)


def test_each_distance_is_compared_on_its_own_haystacks():
    frame, values = _frame()
    by = stratum_differences(frame, "retrieval", "answer_logprob")
    for method in ("ntk", "yarn"):
        for depth, distance in DISTANCE.items():
            row = by[(by["method"] == method) & (by["depth"] == depth)].iloc[0]
            estimate, contrasts = _by_hand(values, method, depth)
            assert row["estimate"] == pytest.approx(estimate, abs=1e-12)
            assert row["n"] == HAYSTACKS and row["distance"] == distance
            if (np.sign(contrasts) == np.sign(estimate)).all():  # the exact test's smallest p, 2 / 2^6
                assert row["p"] == pytest.approx(2 / 2**HAYSTACKS) and row["significant"]
            else:  # at 6 haystacks one disagreeing gives p >= 4 / 64: no mark, and what could be marked
                assert row["p"] >= 4 / 2**HAYSTACKS and not row["significant"]
                assert row["detectable"] > 0
    assert by["significant"].sum() >= 5  # the shape's large effects are all found


def test_a_pooled_mark_is_withdrawn_where_a_distance_is_significantly_the_other_way():
    frame, values = _frame()
    pooled = results.paired_differences(frame, "retrieval", "answer_logprob")
    for method in ("ntk", "yarn"):
        row = pooled[pooled["method"] == method].iloc[0]
        estimate, contrasts = _by_hand(values, method, None)
        assert row["estimate"] == pytest.approx(estimate, abs=1e-12)
        assert (contrasts > 0).all()  # pooled, every haystack favours the extension...
        assert row["against"] >= 1 and row["mixed"]  # ...but at 6.0k every haystack favours plain
        assert not row["significant"]
    shown = results.compare(frame, "retrieval", "answer_logprob", with_ci=True)
    assert shown.loc["ntk", 8192].endswith(" ±") and "*" not in shown.loc["ntk", 8192]


def test_distances_that_agree_keep_the_pooled_mark():
    agree = {**DEMO_SHAPE, "ntk": {0.0: 1.6, 0.25: 0.4, 0.5: 0.3}, "yarn": {0.0: 2.0, 0.25: 0.5, 0.5: 0.2}}
    frame, _ = _frame(agree)
    pooled = results.paired_differences(frame, "retrieval", "answer_logprob")
    for method in ("ntk", "yarn"):
        row = pooled[pooled["method"] == method].iloc[0]
        assert row["significant"] and not row["mixed"] and row["against"] == 0


def test_the_report_says_where_each_setting_wins_and_loses(tmp_path):
    _, values = _frame()
    run = tmp_path / "run"
    writer = RecordWriter(run, rank=0)
    writer.write_manifest(config={"grid": "strata"}, seed=0, device="cpu")
    writer.write(_records(values))
    writer.finish()
    text = results.report(run).read_text(encoding="utf-8")
    headline = text.split("Runs:")[0]
    # no pooled claim: the one headline line is per distance
    assert "beat plain" not in headline and "needle 3937–7797" not in headline
    for setting in ("ntk ×2", "yarn ×2"):
        line = headline.split(f"{setting} beats plain at ~7796 tokens")[1].split(";")[0]
        assert "trails plain at" in line and "~6000 tokens" in line
    assert "pooled over distances: no mark" in headline
    assert "power" in headline  # the power of each claim at its size
    # the per-distance table: per setting and distance, difference, interval, n, p
    assert "by the needle's distance from the question" in text
    table = text.split("| setting | length | distance | difference [95%] | n | p |")[1].split("\n\n")[0]
    estimate, _ = _by_hand(values, "ntk", 0.25)
    assert f"| ntk ×2 | 8192 | ~6000 tokens | {estimate:.3f} [" in table
    assert "| 6 | 0.031 |" in table
    # the summary marks neither extension on the pooled value, and says why
    summary = text.split("## Summary")[1].split("## Differences")[0]
    assert summary.count("rows) ±") == 2 and "rows) *" not in summary
