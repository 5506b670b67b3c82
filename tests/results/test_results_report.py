"""Report, CLI (exit codes, one-line errors) and the lm-eval import."""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from ropebench import results
from ropebench.results.__main__ import main
from ropebench.results.store import RecordWriter

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def synthetic_run_dir(synthetic_records, tmp_path):
    """A sweep's run directory: manifest and synthetic records with one failed cell."""
    d = tmp_path / "sweep"
    w = RecordWriter(d, rank=0)
    w.write_manifest(config={"grid": "synthetic"}, seed=0, device="cpu")
    w.write(synthetic_records("sweep", error_cells=1))
    w.finish()
    return d


def lm_eval_json(path: Path) -> Path:
    """A results file in lm-eval 0.4.13's layout (EvaluationTracker.save_results_aggregated)."""
    blob = {
        "results": {
            "arc_easy": {
                "alias": "arc_easy",
                "acc,none": 0.75,
                "acc_stderr,none": 0.0433,
                "acc_norm,none": 0.7,
                "acc_norm_stderr,none": 0.046,
            },
            "gsm8k": {
                "alias": "gsm8k",
                "exact_match,strict-match": 0.1,
                "exact_match_stderr,strict-match": 0.03,
                "exact_match,flexible-extract": 0.12,
                "exact_match_stderr,flexible-extract": "N/A",
            },
            "ropebench_passkey_4k": {
                "alias": "passkey 4k",
                "exact_match,none": 0.9,
                "exact_match_stderr,none": 0.05,
            },
        },
        "group_subtasks": {"arc_easy": [], "gsm8k": [], "ropebench_passkey_4k": []},
        "configs": {
            "arc_easy": {"task": "arc_easy", "metadata": {"version": 1.0}},
            "gsm8k": {"task": "gsm8k", "metadata": {"version": 3.0}},
            "ropebench_passkey_4k": {
                "task": "ropebench_passkey_4k",
                "metadata": {"version": 0, "length": 4096},
            },
        },
        "versions": {"arc_easy": 1.0, "gsm8k": 3.0, "ropebench_passkey_4k": 0},
        "n-shot": {"arc_easy": 0, "gsm8k": 5, "ropebench_passkey_4k": 0},
        "higher_is_better": {
            "arc_easy": {"acc": True, "acc_norm": True},
            "gsm8k": {"exact_match": True},
            "ropebench_passkey_4k": {"exact_match": True},
        },
        "n-samples": {
            "arc_easy": {"original": 2376, "effective": 100},
            "gsm8k": {"original": 1319, "effective": 50},
            "ropebench_passkey_4k": {"original": 20, "effective": 20},
        },
        "config": {
            "model": "ropebench",
            "model_args": (
                "pretrained=smollm2-135m,method=yarn,factor=2,beta_fast=32,max_length=16384,dtype=float32"
            ),
            "model_num_parameters": 134515008,
            "model_dtype": "torch.float32",
            "batch_size": "1",
            "batch_sizes": [],
            "device": "cpu",
            "use_cache": None,
            "limit": 100.0,
            "bootstrap_iters": 0,
            "gen_kwargs": None,
            "random_seed": 0,
            "numpy_seed": 1234,
            "torch_seed": 1234,
            "fewshot_seed": 1234,
        },
        "git_hash": "abc1234",
        "date": 1763780000.5,
        "transformers_version": "5.23.0",
        "lm_eval_version": "0.4.13",
        "model_source": "ropebench",
        "model_name": "smollm2-135m",
        "model_name_sanitized": "smollm2-135m",
        "total_evaluation_time_seconds": "12.3",
        "task_hashes": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob, indent=2))
    return path


def _summary_table(md):
    """The summary's markdown table lines (header, rule, rows)."""
    part = md.split("## Summary", 1)[1].split("\n## ", 1)[0]
    return [line for line in part.splitlines() if line.startswith("|")]


def _cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_writes_tables_plots_and_failures(synthetic_run_dir, tmp_path):
    path = results.report(synthetic_run_dir)
    assert path == synthetic_run_dir / "report.md"
    md = path.read_text()
    headings = [
        "## Summary",
        "## Differences to plain",
        "## Effective context length",
        "## perplexity",
        "## passkey",
        "## classification",
        "## Legend",
        "## Failed cells (1)",
    ]
    assert [md.index(h) for h in headings] == sorted(md.index(h) for h in headings)  # the summary leads
    # the headline: at most 5 lines before anything else, each difference with its n and p. yarn x4 finds
    # all 6 pass keys at 16384 where plain finds none: 6 discordant pairs, exact McNemar p = 2 / 2**6
    head = md.split("\n\n", 2)[1].splitlines()
    assert md.startswith("# ropebench report\n\n") and 1 <= len(head) <= 5
    assert all(line.startswith("- ") for line in head)
    passkey = next(line for line in head if "passkey correct" in line)
    assert "6/6 vs 0/6" in passkey and "n = 6 trials" in passkey and f"p = {2 / 2**6:.3f}" in passkey
    # the summary: informative columns only, at most 8 with the index, none the same in every row
    table = _summary_table(md)
    header = _cells(table[0])
    assert header[:3] == ["method", "factor", "options"] and len(header) <= 8
    rows = [_cells(line) for line in table[2:]]
    assert len(rows) == 4 and rows[0][:2] == ["plain", "1"]
    for i, name in enumerate(header[3:], start=3):
        assert len({r[i] for r in rows}) > 1, f"{name} says the same in every row"
    assert "ppl @ 16384" in header and "passkey @ 16384" in header
    assert "classification @ 16384 (chance 0.4)" in header  # the chance level folded into its value's label
    assert rows[0][header.index("ppl @ 16384")].startswith("560.0 [")
    assert next(line for line in md.splitlines() if line.startswith("Not in the summary: "))
    # every printed number carries n and an interval: ppl over documents, passkey over prompts (Wilson)
    assert "0.833 [0.436, 0.970] n=6" in md and " ± " not in md
    assert "| chance |  | 0.400 |" in md and "chance (chance)" not in md
    assert "OutOfMemoryError" in md and "65536" in md
    links = [line.split("](")[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert {Path(link).name.split("_")[0] for link in links} == {"classification", "passkey", "perplexity"}
    for link in links:
        assert (synthetic_run_dir / link).stat().st_size > 10_000
    stems = {p.stem for p in (synthetic_run_dir / "tables").iterdir()}
    assert {
        "summary",
        "perplexity_ppl",
        "perplexity_ppl_tail",
        "perplexity_ppl_vs_plain",
        "passkey_correct_vs_plain",
        "classification_accuracy_vs_plain",
        "reach_perplexity_ppl_tail_threshold",
        "passkey_correct",
        "classification_accuracy",
        "classification_macro_f1",
    } <= stems
    for stem in stems - {"classification_macro_f1", "perplexity_loss"}:  # details: csv/md only
        for ext in ("md", "csv", "tex"):
            assert (synthetic_run_dir / "tables" / f"{stem}.{ext}").stat().st_size > 0
    assert "tables/classification_macro_f1.csv" in md
    csv = pd.read_csv(synthetic_run_dir / "tables" / "passkey_correct.csv", index_col=[0, 1])
    assert csv.loc[("plain", 1.0), "8192"] == pytest.approx(5 / 6)  # numeric csv, CI strings only in md/tex
    assert "0.833 [0.436, 0.970] n=6" in (synthetic_run_dir / "tables" / "passkey_correct.md").read_text()
    numeric = pd.read_csv(synthetic_run_dir / "tables" / "summary.csv")
    assert {
        "ppl @ trained_lo",
        "passkey @ longest_n",
        "ppl_tail reach_length",
        "passkey reach (short)_rule",
    } <= set(numeric.columns)
    assert "Manifest `sweep/manifest.json`" in md
    # the legend: one short line per rule shown, below the tables
    legend = md.split("## Legend", 1)[1].split("\n## ", 1)[0]
    assert all(len(line) < 260 for line in legend.splitlines())


def test_report_out_dir_and_lm_eval_section(synthetic_run_dir, tmp_path):
    j = lm_eval_json(tmp_path / "lm" / "smollm2-135m" / "results_2026-01-01T00-00-00.json")
    out = tmp_path / "rep"
    assert (
        main(["report", str(synthetic_run_dir), str(j), "--out", str(out), "--trained-context", "4096"]) == 0
    )
    md = (out / "report.md").read_text()
    assert "## arc_easy" in md and "## gsm8k" in md
    assert not (synthetic_run_dir / "report.md").exists()


def test_from_lm_eval_rows(tmp_path):
    j = lm_eval_json(tmp_path / "results_x.json")
    df = results.from_lm_eval(j)
    assert list(df.columns[: len(results.SCHEMA)]) == list(results.SCHEMA)
    got = {(r.task, r.metric): r for r in df.itertuples()}
    assert set(got) == {
        ("arc_easy", "acc"),
        ("arc_easy", "acc_norm"),
        ("gsm8k", "exact_match,strict-match"),
        ("gsm8k", "exact_match,flexible-extract"),
        ("ropebench_passkey_4k", "exact_match"),
    }
    acc = got[("arc_easy", "acc")]
    assert (acc.value, acc.n, acc.stderr, acc.seed) == (0.75, 100, 0.0433, 0)
    assert (acc.model, acc.method, acc.factor, acc.options) == (
        "smollm2-135m",
        "yarn",
        2.0,
        '{"beta_fast":32}',
    )
    assert json.loads(acc.task_options)["max_length"] == 16384 and acc.status == "ok"
    assert pd.isna(got[("gsm8k", "exact_match,flexible-extract")].stderr)  # "N/A" stderr
    assert got[("gsm8k", "exact_match,strict-match")].n == 50
    assert got[("ropebench_passkey_4k", "exact_match")].length == 4096  # from configs.metadata.length
    assert pd.isna(acc.length)
    # no method in model_args: an unmodified model
    blob = json.loads(j.read_text())
    blob["config"]["model_args"] = {"pretrained": "HuggingFaceTB/SmolLM2-135M"}
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "results_y.json").write_text(json.dumps(blob))
    plain = results.from_lm_eval(tmp_path / "plain")  # a directory of results files works too
    assert set(plain["method"]) == {"plain"} and set(plain["factor"]) == {1.0}
    # a recorded factor of 0 is no default of 1: it is refused, naming the file
    for where, zero in (("model_args", {"pretrained": "x", "method": "pi", "factor": "0"}), ("config", 0)):
        bad = json.loads(j.read_text())
        if where == "config":
            bad["config"].update(
                ropebench_method="pi", ropebench_factor=zero
            )  # what the ropebench model records
        else:
            bad["config"]["model_args"] = zero
            bad["config"].pop("ropebench_method", None)
        (tmp_path / "zero.json").write_text(json.dumps(bad))
        with pytest.raises(
            results.ResultsError, match=r"zero.json: the run's factor .* is not a finite number > 0"
        ):
            results.from_lm_eval(tmp_path / "zero.json")
    # lm-eval rows sit in the same tables as the sweep's rows
    both = pd.concat([df, plain], ignore_index=True)
    t = results.table(both, "arc_easy", "acc", cols=None)
    assert t.loc["plain", "acc"] == 0.75 and t.loc["yarn", "acc"] == 0.75
    with pytest.raises(results.ResultsError, match="not found"):
        results.from_lm_eval(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text('{"x": 1}')
    with pytest.raises(results.ResultsError, match="no 'results' section"):
        results.from_lm_eval(tmp_path / "bad.json")


def test_load_mixes_run_dirs_and_lm_eval(synthetic_run_dir, tmp_path):
    j = lm_eval_json(tmp_path / "r.json")
    df = results.load([synthetic_run_dir, j])
    assert {"perplexity", "arc_easy"} <= set(df["task"])
    assert "stderr" in df.columns


def test_cli_table(synthetic_run_dir, capsys):
    assert main(["table", str(synthetic_run_dir), "--task", "perplexity", "--metric", "ppl"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "| method | factor | 1024 | 2048 | 4096 | 8192 | 16384 |"
    assert (
        main(
            [
                "table",
                str(synthetic_run_dir),
                "--task",
                "perplexity",
                "--metric",
                "ppl",
                "--baseline",
                "plain",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    assert "0.026" in capsys.readouterr().out
    # plain at 16384: 3 documents at 560 x exp(-0.1, 0, +0.1), equal tokens, not skewed: t on the log scale,
    # s = 0.1, 0.65 x 2 = 1.3 dof (results.stats.skew_t): 560 x exp(+-7.5005 x 0.1 / sqrt(3))
    for task, metric, cell in (
        ("perplexity", "ppl", "| 560.0 [363.2, 863.5] n=3 |"),
        ("passkey", "correct", "| 0.833 [0.436, 0.970] n=6 |"),
        ("classification", "accuracy", "| 0.500 [0.299, 0.701] n=20 |"),
    ):
        assert (
            main(["table", str(synthetic_run_dir), "--task", task, "--metric", metric, "--ci"]) == 0
        )  # --ci for every task
        assert cell in capsys.readouterr().out
    assert (
        main(
            [
                "table",
                str(synthetic_run_dir),
                "--task",
                "passkey",
                "--metric",
                "correct",
                "--baseline",
                "plain",
                "--ci",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| plain | 1 | baseline |" in out and "n=6" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["report", "{tmp}/missing"], "run directory not found"),
        (["report", "{tmp}/empty"], "no records in"),
        (["table", "{run}", "--task", "nope", "--metric", "ppl"], "unknown task 'nope' — available tasks"),
        (["table", "{run}", "--task", "perplexity", "--metric", "acc"], "unknown metric 'acc'"),
        (["report", "{run}", "--threshold", "80"], "threshold must be an accuracy in (0, 1]"),
        (["report", "{run}", "--tolerance", "-0.1"], "--tolerance: '-0.1' is not 0 or more"),
        (["report", "{run}", "--bar", "strict"], "threshold must be an accuracy in (0, 1] or one of: ruler"),
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, needle, synthetic_run_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = [a.format(tmp=tmp_path, run=synthetic_run_dir) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0] and " — " in err[0]


def test_cli_subprocess_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ropebench.results", "report", str(tmp_path / "missing")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: run directory not found") and "Traceback" not in proc.stderr


def test_report_takes_the_trained_context_from_the_rows_not_the_manifest(synthetic_records, tmp_path):
    """After -o original_max_position_embeddings=4096 every row records 4096 (the patch's resolved options),
    while the manifest holds the model config's 8192: the report's line, labels and reach use 4096 and say
    their bar."""
    settings = (("plain", 1.0, {"trained_context": 4096}), ("yarn", 2.0, {"trained_context": 4096}))
    d = tmp_path / "run"
    w = RecordWriter(d)
    w.write_manifest(
        config={"grid": "synthetic"}, seed=0, device="cpu", extra={"trained_context": {"smollm2-135m": 8192}}
    )
    w.write(synthetic_records("run", settings=settings, tasks=("perplexity", "passkey"), trials=6))
    w.finish()
    md = results.report(d).read_text()
    assert "of ppl_tail / its value at 4096 ≤ 1.1" in md and "at 8192 ≤" not in md
    assert "ppl_tail 16384 / 4096" in md or "ppl @ 4096 (trained)" in md
    assert "8192 (trained)" not in md
    df = results.load(d)
    plot = results.plot_perplexity(df, tmp_path / "ppl.png")
    dashed = [ln for ln in plot.figure.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert [ln.get_xdata()[0] for ln in dashed] == [4096]
    # rows without a recorded trained context fall back to the manifest's
    bare = tmp_path / "bare"
    w = RecordWriter(bare)
    w.write_manifest(config={}, seed=0, device="cpu", extra={"trained_context": {"smollm2-135m": 4096}})
    rows = synthetic_records("bare", tasks=("perplexity",))
    w.write([{**r, "task_options": {}} for r in rows])
    w.finish()
    assert "of ppl_tail / its value at 4096 ≤ 1.1" in results.report(bare).read_text()
