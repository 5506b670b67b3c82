"""Evidence in results: paired differences, effective context length and the summary — expected values
computed by hand on synthetic records and on a real (tiny) sweep."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.meaning import BUILT_IN
from ropebench.results.stats import newcombe, skew_t, wilson

ROOT = Path(__file__).resolve().parents[2]
Z = 1.959963984540054


# What the rows' metrics mean, declared as a task declares them (the sweep copies it into every row): results
# read the declaration, never the metric's name
DECLARED = {"ppl": BUILT_IN[("perplexity", "ppl")], "correct": BUILT_IN[("passkey", "correct")]}


def _frame(rows):
    base = {"task": "t", "model": "m", "factor": 1.0, "length": 100, "status": "ok", "seed": 0, "n": 1}
    return normalize(pd.DataFrame([{**base, "meaning": _declared(r.get("metric")), **r} for r in rows]))


def _declared(metric):
    return DECLARED[metric].to_json() if metric in DECLARED else None


T975 = {2: 4.3027, 6: 2.4469}  # Student's t 0.975 quantiles as printed in statistical tables


def _wilson(k, n):
    """Wilson's score interval, written out (Wilson 1927)."""
    p, z2 = k / n, Z * Z
    centre, half = (
        (p + z2 / (2 * n)) / (1 + z2 / n),
        Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n),
    )
    return centre - half, centre + half


def _newcombe_paired(e, f, g, h):
    """Newcombe (1998) method 10 for paired rates as Fagerland et al. (2017, ch. 8) print it: table e (both),
    f (first only), g (second only), h (neither); continuity-corrected phi."""
    n = e + f + g + h
    p1, p2 = (e + f) / n, (e + g) / n
    (l1, u1), (l2, u2) = _wilson(e + f, n), _wilson(e + g, n)
    a = e * h - f * g
    prod = (e + f) * (g + h) * (e + g) * (f + h)
    psi = (
        0.0
        if prod == 0
        else ((a - n / 2) / math.sqrt(prod) if a > n / 2 else (0.0 if a >= 0 else a / math.sqrt(prod)))
    )
    d = p1 - p2
    return (
        d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2)),
        d + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1)),
    )


def _t_half(x, w, dof):
    """Half-width of the documented t interval of a weighted mean: t * s * sqrt(sum w^2) / sum w."""
    return T975[dof] * np.std(x, ddof=1) * math.sqrt((w * w).sum()) / w.sum()


def _prompts(method, correct, n=10):
    return [
        {"method": method, "metric": "correct", "depth": d / 10, "trial": 0, "value": float(d in correct)}
        for d in range(n)
    ]


# ----------------------------------------------------------------------------------------- paired differences
def test_paired_rate_difference_by_hand():
    # plain right on prompts 0-2, the extension on all ten: 7 prompts differ, all one way
    frame = _frame(_prompts("plain", {0, 1, 2}) + _prompts("ext", set(range(10))))
    long = results.paired_differences(frame, "t", "correct", cols="length")
    row = long[long["method"] == "ext"].iloc[0]
    assert row["estimate"] == pytest.approx(0.7) and row["n"] == 10 and row["informative"] == 7
    want = _newcombe_paired(3, 7, 0, 0)
    assert (row["lo"], row["hi"]) == pytest.approx(want, abs=1e-12)
    # exact McNemar: 7 discordant pairs all one way, p = 2 / 2**7 < 0.05
    assert row["interval"] == "paired score + McNemar" and row["significant"] and row["lo"] > 0
    base = long[long["method"] == "plain"].iloc[0]
    assert base["interval"] == "baseline" and base["estimate"] == 0.0
    shown = results.compare(
        frame.sample(frac=1.0, random_state=1), "t", "correct", cols="length", with_ci=True
    )
    assert (
        shown.loc["ext", 100] == f"0.700 [{want[0]:.3f}, {want[1]:.3f}] n=10 *"
    )  # row order does not matter


def test_too_few_differing_pairs_are_not_marked():
    # 4 of 10 prompts differ, all one way: the score interval excludes 0, but the exact McNemar test over 4
    # discordant pairs can not reach p < 0.05 (2 / 2**4), so no mark
    frame = _frame(_prompts("plain", set(range(6))) + _prompts("ext", set(range(10))))
    row = results.paired_differences(frame, "t", "correct", cols="length").query("method == 'ext'").iloc[0]
    assert row["lo"] > 0 and row["informative"] == 4 and not row["significant"]
    assert (
        not results.compare(frame, "t", "correct", cols="length", with_ci=True).loc["ext", 100].endswith("*")
    )


def test_paired_perplexity_ratio_by_hand():
    rng = np.random.default_rng(5)
    loss_p, loss_e = rng.uniform(2, 3, 7), rng.uniform(2, 3, 7)
    tokens = rng.integers(50, 500, 7).astype(float)
    rows = [
        {"method": m, "metric": "ppl", "doc": f"d{i}", "value": math.exp(loss[i]), "n": int(tokens[i])}
        for m, loss in (("plain", loss_p), ("ext", loss_e))
        for i in range(7)
    ]
    rows.append(
        {"method": "ext", "metric": "ppl", "doc": "only-ext", "value": 99.0, "n": 10}
    )  # no pair: dropped
    long = results.paired_differences(_frame(rows), "t", "ppl", cols="length")
    row = long[long["method"] == "ext"].iloc[0]
    assert row["how"] == "ratio" and row["n"] == 7

    log_ratio = (loss_e * tokens).sum() / tokens.sum() - (loss_p * tokens).sum() / tokens.sum()
    assert row["estimate"] == pytest.approx(math.exp(log_ratio), rel=1e-12)
    # paired t over the documents' log ratios, token-weighted (Kish): 6 degrees of freedom
    half = _t_half(loss_e - loss_p, tokens, 6)
    assert (math.log(row["lo"]), math.log(row["hi"])) == pytest.approx(
        (log_ratio - half, log_ratio + half), abs=1e-4 * half
    )
    assert row["interval"] == "paired t" and row["significant"] == (row["lo"] > 1 or row["hi"] < 1)


def test_rates_without_units_use_newcombe(synthetic_records):
    df = normalize(pd.DataFrame(synthetic_records("r")))
    shown = results.compare(df, "classification", "accuracy", with_ci=True)
    lo, hi = newcombe(16, 20, 10, 20)  # yarn x2 0.8 vs plain 0.5 at 16384, 20 queries each
    assert lo > 0 and shown.loc[("yarn", 2.0), 16384] == f"0.300 [{lo:.3f}, {hi:.3f}] n=20 *"
    # per-query rows, when a task records them, are paired instead
    paired = normalize(pd.DataFrame(synthetic_records("r", per_query=True)))
    row = (
        results.paired_differences(paired, "classification", "accuracy")
        .query("method == 'yarn' and factor == 2.0 and length == 16384")
        .iloc[0]
    )
    assert row["interval"] == "paired score + McNemar" and row["informative"] == 6
    assert row["estimate"] == pytest.approx(0.3) and row["p"] == pytest.approx(2 / 2**6)


# ------------------------------------------------------------------------------------------ effective length
@pytest.fixture(scope="module")
def synthetic_six_trial_frame(synthetic_records):
    """Synthetic records (tests/results/synthetic.py), 6 trials: 3 depths x 6 trials = 18 prompts per length;
    plain misses one prompt at 8192, the x2 settings one at 16384."""
    return normalize(pd.DataFrame(synthetic_records("r", trials=6)))


def _by_setting(e):
    return {(r.method, r.factor): r for r in e.itertuples()}


def test_passkey_effective_length_uses_the_wilson_lower_bound(synthetic_six_trial_frame):
    e = _by_setting(results.effective_length(synthetic_six_trial_frame, "passkey"))
    assert wilson(18, 18)[0] >= 0.8 > wilson(17, 18)[0]  # 18/18 passes; 17/18 (0.944) is not established
    plain = e[("plain", 1.0)]
    assert (plain.effective_length, plain.stopped_at, plain.stopped) == (4096, 8192, "not established")
    # 0/18 at 16384 is a failure: the reach is 4096, not "≥ 4096"
    assert (
        plain.claim == "4096" and plain.first_failure == 16384 and plain.fail_value == pytest.approx(17 / 18)
    )
    linear = e[("linear", 2.0)]  # 17/18 at 16384, nothing longer failed: at least 8192
    assert linear.claim == "≥ 8192" and pd.isna(linear.first_failure) and linear.stopped_at == 16384
    assert e[("yarn", 4.0)].claim == "≥ 16384" and pd.isna(
        e[("yarn", 4.0)].first_failure
    )  # never beyond tested
    assert e[("yarn", 4.0)].at_lo == pytest.approx(wilson(18, 18)[0])
    loose = _by_setting(results.effective_length(synthetic_six_trial_frame, "passkey", threshold=0.7))
    assert loose[("plain", 1.0)].claim == "8192" and loose[("linear", 2.0)].claim == "≥ 16384"
    assert results.effective_length(synthetic_six_trial_frame, "passkey")["method"].iloc[0] == "plain"


def test_passkey_effective_length_ruler_rule(synthetic_six_trial_frame):
    e = _by_setting(
        results.effective_length(synthetic_six_trial_frame, "passkey", rule="trained")
    )  # trained context from task_options
    # the bar: plain's own Wilson lower bound at its trained context (17/18 at 8192)
    assert e[("plain", 1.0)].reference_value == pytest.approx(wilson(17, 18)[0])
    assert e[("plain", 1.0)].claim == "8192"  # 0/18 at 16384
    assert e[("linear", 2.0)].claim == "≥ 16384"  # 17/18 at 16384 meets the bar
    none = results.effective_length(
        synthetic_six_trial_frame.assign(task_options="{}"), "passkey", rule="trained"
    )
    assert (
        none["effective_length"].isna().all() and none["rule"].str.contains("trained context unknown").all()
    )
    given = _by_setting(
        results.effective_length(
            synthetic_six_trial_frame.assign(task_options="{}"),
            "passkey",
            rule="trained",
            trained_context={"smollm2-135m": 4096},
        )
    )
    assert given[("plain", 1.0)].reference_length == 4096 and given[("plain", 1.0)].claim == "4096"


def test_perplexity_effective_length_tolerance(synthetic_six_trial_frame):
    e = _by_setting(
        results.effective_length(synthetic_six_trial_frame, "perplexity")
    )  # ppl_tail, reference at 8192
    plain = e[("plain", 1.0)]
    assert (
        plain.metric == "ppl_tail"
        and plain.reference_length == 8192
        and plain.reference_value == pytest.approx(13.5)
    )
    assert plain.claim == "8192" and plain.fail_value == pytest.approx(560 / 13.5)  # ratio at 16384: x41.5
    yarn4 = e[("yarn", 4.0)]
    assert yarn4.claim == "≥ 16384" and yarn4.at_value == pytest.approx(15.12 / 14.58)  # +3.7% <= +10%
    strict = _by_setting(results.effective_length(synthetic_six_trial_frame, "perplexity", tolerance=0.03))
    assert strict[("yarn", 4.0)].claim == "8192"
    with pytest.raises(
        results.ResultsError, match="unknown rule 'best' — use one of: threshold, short, trained$"
    ):
        results.effective_length(synthetic_six_trial_frame, "passkey", rule="best")


def test_summary_one_row_per_setting(synthetic_six_trial_frame):
    s = results.summary(synthetic_six_trial_frame, with_ci=False)
    assert len(s) == 4 and s["method"].iloc[0] == "plain"
    plain = s[s["method"] == "plain"].iloc[0]
    assert plain["ppl @ trained_length"] == 8192 and plain["ppl @ trained"] == pytest.approx(13.5)
    assert plain["ppl @ longest"] == pytest.approx(560.0) and plain["ppl @ longest_n"] == 3
    assert plain["ppl_tail ratio"] == pytest.approx(560 / 13.5) and plain["ppl_tail reach"] == "8192"
    assert plain["passkey reach"] == "4096" and plain["passkey @ longest"] == 0.0
    assert (plain["passkey @ longest_lo"], plain["passkey @ longest_hi"]) == pytest.approx(wilson(0, 18))
    assert plain["classification @ longest"] == 0.5 and plain["classification chance"] == pytest.approx(0.4)
    yarn4 = s[(s["method"] == "yarn") & (s["factor"] == 4.0)].iloc[0]
    assert yarn4["passkey @ longest_significant"] and yarn4["classification @ longest_significant"]
    shown = results.summary(synthetic_six_trial_frame)
    assert shown.loc[("yarn", 4.0, "beta_fast=32"), "passkey reach"] == "≥ 16384"
    assert shown.loc[("yarn", 4.0, "beta_fast=32"), "passkey @ 16384"] == "1.000 [0.824, 1.000] n=18 *"
    # ppl at the trained context says less than at the longest length: it is what gives way to the 8-column
    # limit (index columns included), and the footnote says so
    assert len(shown.columns) + len(shown.index.names) <= 8
    assert dict(results.overview.left_out(shown))["ppl @ 8192 (trained)"].startswith("no room")


# ------------------------------------------------------------------------------------------ a real tiny sweep
@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory, smollm2_tokenizer, tiny_llama_factory):
    """plain and yarn x2 on a random tiny Llama (trained context 128) through scripts/sweep.py: all three
    tasks."""

    model_dir = tmp_path_factory.mktemp("tiny")
    tok = smollm2_tokenizer
    tiny_llama_factory(
        max_position_embeddings=128,
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    ).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path_factory.mktemp("sweep") / "run"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "sweep.py"),
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--methods",
        "plain",
        "yarn",
        "--factors",
        "2",
        "--tasks",
        "perplexity",
        "passkey",
        "classification",
        "-t",
        "perplexity.lengths=[32,64,128,256]",
        "-t",
        "perplexity.num_docs=3",
        "-t",
        "passkey.lengths=[96,192]",
        "-t",
        "passkey.depths=[0.25,0.75]",
        "-t",
        "passkey.trials=2",
        "-t",
        "classification.lengths=[128]",
        "-t",
        "classification.num_docs=4",
        "--quiet",
    ]
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, results.load(out)


def test_real_sweep_perplexity_intervals_by_hand(real_sweep):
    _, df = real_sweep
    docs = df[(df["metric"] == "loss") & df["doc"].notna() & (df["method"] == "yarn") & (df["length"] == 256)]
    docs = docs.sort_values("doc")
    loss, tokens = docs["value"].to_numpy(float), docs["n"].to_numpy(float)
    assert len(docs) == 3
    t = results.table(df, "perplexity", "ppl", stat="mean")
    agg = df[(df["metric"] == "ppl") & df["doc"].isna() & (df["method"] == "yarn") & (df["length"] == 256)]
    # the token-weighted estimate over the task's per-document rows is the task's own aggregate
    assert t.loc["yarn", 256] == pytest.approx(float(agg["value"].iloc[0]), rel=1e-9)
    # the skew-robust t over the 3 documents' token-weighted losses (results.stats.skew_t, calibrated in
    # tests/results/test_interval_calibration.py), exp'd back
    _, lo, hi = skew_t(loss, tokens)
    got = (
        results.table(df, "perplexity", "ppl", stat="lo").loc["yarn", 256],
        results.table(df, "perplexity", "ppl", stat="hi").loc["yarn", 256],
    )
    assert (math.log(got[0]), math.log(got[1])) == pytest.approx((float(lo), float(hi)), rel=1e-9)
    # paired ratio yarn / plain over the same three documents: t over the per-document log ratios
    plain = df[
        (df["metric"] == "loss") & df["doc"].notna() & (df["method"] == "plain") & (df["length"] == 256)
    ]
    plain = plain.set_index("doc").loc[docs["doc"]]
    lp, tp = plain["value"].to_numpy(float), plain["n"].to_numpy(float)
    log_ratio = (loss * tokens).sum() / tokens.sum() - (lp * tp).sum() / tp.sum()
    row = (
        results.paired_differences(df, "perplexity", "ppl")
        .query("method == 'yarn' and length == 256")
        .iloc[0]
    )
    assert row["estimate"] == pytest.approx(math.exp(log_ratio), rel=1e-9)
    half = _t_half(loss - lp, (tokens + tp) / 2, 2)
    assert (math.log(row["lo"]), math.log(row["hi"])) == pytest.approx(
        (log_ratio - half, log_ratio + half), abs=1e-4 * half
    )
    assert not row["significant"]  # 3 documents can not make a difference significant


def test_real_sweep_passkey_classification_and_reach(real_sweep):
    out, df = real_sweep
    pk = df[
        (df["task"] == "passkey")
        & (df["metric"] == "correct")
        & (df["method"] == "plain")
        & (df["length"] == 192)
    ]
    k, n = int(pk["value"].sum()), len(pk)
    assert n == 4
    assert results.table(df, "passkey", "correct", with_ci=True).loc[
        "plain", 192
    ] == results.tables.fmt_interval(k / n, *wilson(k, n), n)
    acc = df[(df["metric"] == "accuracy") & (df["method"] == "yarn") & df["doc"].isna()].iloc[0]
    per_query = df[(df["metric"] == "accuracy") & (df["method"] == "yarn") & df["doc"].notna()]
    assert len(per_query) == acc["n"] and per_query["value"].sum() == pytest.approx(acc["value"] * acc["n"])
    cell = results.estimates(df, "classification", "accuracy").query("method == 'yarn'").iloc[0]
    assert cell["n"] == acc["n"] and (cell["lo"], cell["hi"]) == pytest.approx(
        wilson(acc["value"] * acc["n"], acc["n"])
    )
    # perplexity reach by hand from the per-document ppl_tail (trained context 128, recorded by the sweep in
    # the manifest and by the patch in every row): 256 passes when the upper bound of its paired ratio to 128
    # is within +10%, fails only when the lower bound is not (verdicts symmetric in evidence)
    trained = json.loads((out / "manifest.json").read_text())["extra"]["trained_context"]
    assert set(trained.values()) == {128}
    assert {json.loads(o)["trained_context"] for o in df["options"].dropna().unique()} == {128}
    e = results.effective_length(df, "perplexity").set_index("method")
    for method in ("plain", "yarn"):
        tail = df[(df["metric"] == "ppl_tail") & (df["method"] == method) & df["doc"].notna()]
        at, ref = (tail[tail["length"] == L].sort_values("doc") for L in (256, 128))
        d = np.log(at["value"].to_numpy(float)) - np.log(ref["value"].to_numpy(float))
        w = (at["n"].to_numpy(float) + ref["n"].to_numpy(float)) / 2
        ratio = math.exp(
            (np.log(at["value"].to_numpy(float)) * at["n"].to_numpy(float)).sum() / at["n"].sum()
            - (np.log(ref["value"].to_numpy(float)) * ref["n"].to_numpy(float)).sum() / ref["n"].sum()
        )
        upper, lower = ratio * math.exp(_t_half(d, w, 2)), ratio * math.exp(-_t_half(d, w, 2))
        want = "≥ 256" if upper <= 1.1 else ("128" if lower > 1.1 else "≥ 128")
        assert e.loc[method, "reference_length"] == 128 and e.loc[method, "claim"] == want
    md = (out / "report.md").read_text()
    assert (
        md.index("## Summary")
        < md.index("## Differences to plain")
        < md.index("## Effective context length")
        < md.index("## perplexity")
    )
    first_table = md.split("## Summary", 1)[1].split("\n\n")[2]
    assert "| plain |" in first_table and "| yarn |" in first_table
    # a random tiny model: columns that say the same for both settings are named in one footnote line
    assert len([line for line in md.splitlines() if line.startswith("Not in the summary: ")]) == 1
    assert str(out) not in md.split("## Summary")[1]  # models by short name in tables, not absolute paths


def test_summary_with_two_models_groups_by_short_model_name(synthetic_records):
    rows = synthetic_records("a", tasks=("passkey",)) + synthetic_records(
        "b", tasks=("passkey",), model="/tmp/x/tiny-llama"
    )
    shown = results.summary(normalize(pd.DataFrame(rows)))
    assert shown.index.names[:2] == ["model", "method"]
    assert [k[:2] for k in shown.index][:2] == [("tiny-llama", "plain"), ("tiny-llama", "linear")]
    assert {k[0] for k in shown.index} == {"tiny-llama", "smollm2-135m"}


def test_no_length_within_the_trained_context_is_said_not_guessed(
    synthetic_records, synthetic_six_trial_frame, tmp_path
):
    # passkey only past the trained context (8192): the RULER rule has no reference, every column still there
    past = synthetic_six_trial_frame[
        (synthetic_six_trial_frame["task"] != "passkey") | (synthetic_six_trial_frame["length"] == 16384)
    ]
    e = results.effective_length(past, "passkey", rule="trained")
    assert e["effective_length"].isna().all() and e["rule"].str.startswith("not computed: no correct").all()
    assert {"at_value", "fail_value", "at_n"} <= set(e.columns)
    run = tmp_path / "run"
    results.RecordWriter(run).write(
        [r for r in synthetic_records("r", trials=6) if r["task"] != "passkey" or r["length"] == 16384]
    )
    md = results.report(run).read_text()
    # the rule the grid does not support gets no table, only its reason in one line
    assert "passkey reach (trained): no correct at a tested length ≤ the trained context 8192" in md
    assert "reach_passkey_correct_trained" not in md


# ------------------------------------------------------------------------------------ reach claims need a bar
def _passkey_rows(method, correct, trials, lengths=(4096, 8192, 16384), options="{}"):
    return [
        {
            "method": method,
            "metric": "correct",
            "task": "passkey",
            "length": L,
            "depth": 0.5,
            "trial": t,
            "value": float(correct(L, t)),
            "options": options,
            "corpus": "filler",
        }
        for L in lengths
        for t in range(trials)
    ]


def test_too_few_trials_establish_no_reach_and_are_no_failure():
    # 3/3 everywhere: nothing failed, but even 3/3 has a Wilson lower bound of 0.44 < 0.8
    frame = _frame(_passkey_rows("plain", lambda L, t: 1, 3))
    row = results.effective_length(frame, "passkey").iloc[0]
    assert _wilson(3, 3)[0] < 0.8
    assert row["claim"] == "not established (n too small)" and pd.isna(row["first_failure"])
    assert (row["stopped_at"], row["stopped"]) == (4096, "not established")
    # a real failure at the shortest length still reads "< 4096"
    failed = results.effective_length(_frame(_passkey_rows("plain", lambda L, t: 0, 3)), "passkey").iloc[0]
    assert failed["claim"] == "< 4096" and failed["first_failure"] == 4096


def test_ruler_rule_needs_a_baseline_that_does_the_task():
    # every passkey 0/16: plain's lower bound at its trained context is 0, which every length "meets"
    rows = [
        r
        for m in ("plain", "yarn")
        for r in _passkey_rows(m, lambda L, t: 0, 16, options='{"trained_context": 8192}')
    ]
    e = results.effective_length(_frame(rows), "passkey", rule="trained")
    assert not e["claim"].str.startswith("≥").any() and e["effective_length"].isna().all()
    assert e["rule"].str.contains("no bar to pass").all() and (e["reference_value"] == 0).all()
    # a baseline that retrieves 16/16 at 8192 sets the bar Wilson(16, 16).lo: yarn's 16/16 at 16384 meets it
    rows = _passkey_rows(
        "plain", lambda L, t: L <= 8192, 16, options='{"trained_context": 8192}'
    ) + _passkey_rows("yarn", lambda L, t: 1, 16, options='{"trained_context": 8192}')
    e = _by_setting(results.effective_length(_frame(rows), "passkey", rule="trained"))
    assert e[("yarn", 1.0)].reference_value == pytest.approx(_wilson(16, 16)[0]) and _wilson(16, 16)[0] >= 0.5
    assert e[("yarn", 1.0)].claim == "≥ 16384" and e[("plain", 1.0)].claim == "8192"


def test_perplexity_reach_from_one_document_is_not_established(synthetic_six_trial_frame):
    one = synthetic_six_trial_frame[
        (synthetic_six_trial_frame["task"] != "perplexity")
        | synthetic_six_trial_frame["doc"].isna()
        | (synthetic_six_trial_frame["doc"] == "doc0")
    ]
    e = _by_setting(results.effective_length(one, "perplexity"))
    # one document: no interval for the ratio, so not even the reference length is established; yarn x4 at
    # +3.7% would have read "≥ 16384" from the point estimate, and plain's x41.5 at 16384 is no established
    # failure either (verdicts are symmetric in evidence: without an interval neither side is shown)
    assert e[("yarn", 4.0)].claim == "not established (n too small)"
    assert e[("plain", 1.0)].claim == "not established (n too small)"
    assert pd.isna(e[("plain", 1.0)].first_failure)


def test_trained_context_comes_from_the_rows_patch_options(synthetic_six_trial_frame):
    # -o original_max_position_embeddings=4096: every row's resolved options say 4096, the task_options 8192
    rows = synthetic_six_trial_frame.assign(
        options=synthetic_six_trial_frame["options"].map(
            lambda o: json.dumps({**json.loads(o), "trained_context": 4096}, sort_keys=True)
        )
    )
    e = results.effective_length(rows, "perplexity")
    assert set(e["reference_length"]) == {4096} and set(e["trained_context"]) == {4096}
    s = results.summary(rows, with_ci=False)
    assert set(s["ppl @ trained_length"]) == {4096}
    assert set(results.effective_length(rows, "perplexity", trained_context=8192)["reference_length"]) == {
        8192
    }


def test_real_sweep_records_theory_beside_the_reach(real_sweep):
    """The sweep records, per setting, Men et al.'s reach of the patched frequencies (task "theory"); the
    report shows it in its theory section only. Tiny Llama: head_dim 16, rope_theta 1e4; checked up to
    4 x 256."""
    out, df = real_sweep
    assert (df["task"] != "theory").all()  # kept beside the records (theory.json), not in them
    theory = results.reach.load_theory(out)
    theory = theory[theory["metric"] == "men_reach"].set_index("method")
    inv = 1e4 ** -(np.arange(0, 16, 2) / 16)
    sums = np.cos(np.arange(1024, dtype=np.float64)[:, None] * inv[None, :]).sum(axis=1)
    first = int(np.flatnonzero(sums < 0)[0]) if (sums < 0).any() else 1024  # by brute force
    assert theory.loc["plain", "value"] == first and set(theory.index) == {"plain", "yarn"}
    md = (out / "report.md").read_text()
    # theory has its own section, labelled by the rows' declarations; no reach table sets it beside a
    # measurement
    theory_md = md.split("## Theory (not measurements)", 1)[1].split("\n## ", 1)[0]
    assert "Men et al." in theory_md and "not a training-free prediction" in theory_md
    assert "Men et al" not in md.split("## Effective context length", 1)[1].split("## Theory", 1)[0]
    assert "## theory" not in md and "| theory |" not in md
