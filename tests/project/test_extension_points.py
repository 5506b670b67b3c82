"""What a new method, task, metric, reach rule and report section each need (docs/layout.md, "Adding a
thing"): counted here, so the table cannot drift from the code."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One file: a method (a decorated function), a task (declaring it registers it) and its metric (declared
# with a reach rule). The sweep imports it with --plugin; nothing else of ropebench changes.
PLUGIN = '''
import torch
from ropebench import extend
from ropebench.tasks.kit import Metric, declare


@extend.register("halfbase-plugin")
def halfbase(rope, *, factor):
    """Halves the base whatever the factor (a test method)."""
    return (rope.theta / 2) ** (-torch.arange(0, rope.dim, 2).float() / rope.dim), 1.0


@declare("echo-plugin", options={}, metrics={"hit": Metric("rate", "higher", "trial", "a test rate",
         reach=("threshold",), lo=0.0, hi=1.0)})
def run(model, tokenizer, *, lengths, seed=0, progress=True):
    return [
        {"metric": "hit", "value": float((t + length) % 3 != 0), "n": 1, "length": length, "doc": f"t{t}"}
        for length in lengths
        for t in range(6)
    ]

'''


@pytest.mark.slow
def test_one_plugin_file_adds_a_method_a_task_and_its_metric(tmp_path, tiny_model_dir, sweep_env):
    """A method, a task and a metric with a reach rule, all in one file handed to the sweep: the rows name the
    method, the report has the task's section and the metric's table and reach, read from the declaration."""
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "sweep.py"),
            "--model",
            str(tiny_model_dir),
            "--plugin",
            str(plugin),
            "--methods",
            "plain",
            "halfbase-plugin",
            "--factors",
            "2",
            "--tasks",
            "echo-plugin",
            "--lengths",
            "32",
            "64",
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=sweep_env(),
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    from ropebench import results

    df = results.load(out)
    assert set(df.loc[df["task"] == "echo-plugin", "method"]) == {"plain", "halfbase-plugin"}
    report = (out / "report.md").read_text()
    assert "echo-plugin" in report and "hit" in report
    assert (out / "tables" / "echo-plugin_hit.csv").is_file()
    reach = results.effective_length(df, "echo-plugin", "hit")
    assert set(reach["method"]) == {"plain", "halfbase-plugin"}


def test_a_reach_rule_is_one_registered_function_with_its_words():
    """results/reach_rules.py: each rule is one function registered by `@reach_rule(kind, name, short=...,
    legend=...)`: its check and its bar in words in one entry, the legend's line printed from it."""
    from ropebench.results import reach_rules
    from ropebench.results.overview import legend_lines

    legend = legend_lines()
    assert reach_rules.rule_names() == ("threshold", "short", "trained")  # docs/results.md's three
    for (kind, name), entry in reach_rules.RULES.items():
        line = reach_rules.caption(entry, 0.8, 0.1, "plain")
        assert line.startswith("reach") and "{" not in line and line in legend, (kind, name)
        assert "{" not in reach_rules.caption(entry, "ruler", 0.1, "plain", short=True)
        assert entry.check.__module__ == reach_rules.__name__


def test_a_new_reach_rule_is_its_entry_and_nothing_else():
    """The `@reach_rule` entry is a rule's only declaration: registering a throwaway one (here, no other file
    edited) makes declarations naming it valid for its kind, puts it in a pass/fail rate's rules, the legend
    and `effective_length`; before that, a declaration naming it is refused in one line naming the rules."""
    import pandas as pd
    from ropebench import results
    from ropebench.results import reach_rules
    from ropebench.results.frame import normalize
    from ropebench.results.meaning import Metric
    from ropebench.results.overview import legend_lines
    from ropebench.tasks.kit import pass_fail_rate

    unknown = r"^metric declaration reach rule 'every' is not one of threshold, short, trained$"
    with pytest.raises(ValueError, match=unknown):
        Metric("rate", "higher", reach=("every",))
    words = "reach (every) (0/1 rate): every tested length passes"

    def every(s):  # passes each tested length: the claim is "≥ the longest"
        checks = {L: (reach_rules.PASS, ci) for L, (_, ci) in s.cells.items()}
        return reach_rules.Verdicts("every length", checks)

    reach_rules.reach_rule("rate", "every", short="every length", legend=words)(every)
    try:
        hit = Metric("rate", "higher", "fraction of prompts", "hit", reach=("every",), lo=0.0, hi=1.0)
        with pytest.raises(ValueError, match=r"'every' does not apply to a perplexity \(its rules: thresh"):
            Metric("perplexity", "lower", reach=("every",))  # registered for rates only
        assert pass_fail_rate("hit").reach == ("threshold", "short", "trained", "every")
        assert words in legend_lines()
        rows = [
            {"task": "t", "metric": "hit", "model": "m", "method": "plain", "factor": 1.0, "status": "ok"}
            | {"length": L, "trial": i, "value": float(i % 2), "n": 1, "meaning": hit.to_json()}
            for L in (32, 64)
            for i in range(4)
        ]
        reach = results.effective_length(normalize(pd.DataFrame(rows)), "t", "hit", rule="every")
        assert list(reach["claim"]) == ["≥ 64"] and list(reach["rule"]) == ["every length"]
    finally:
        del reach_rules.RULES[("rate", "every")]
    with pytest.raises(ValueError, match=unknown):
        Metric("rate", "higher", reach=("every",))


def test_a_report_section_is_one_function_of_reporting():
    """Each part of report.md after the header is one function of results/reporting.py taking the report
    being written, called once from `_write_report`: a new section is one function and its call there."""
    tree = ast.parse((ROOT / "results" / "reporting.py").read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    calls = [
        c.func.id
        for c in ast.walk(functions["_write_report"])
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    ]
    writes = [n for n, f in functions.items() if f.args.args and f.args.args[0].arg == "r"]  # r: the Report
    sections = [name for name in calls if name in writes]
    assert {"_summary", "_differences", "_reach", "_theory", "_task_section", "_legend"} <= set(sections)
    assert len(sections) == len(set(sections))  # each called once


def test_built_in_tasks_each_declare_their_metrics_once():
    """A built-in task is its module (declare: options, metrics, tables) plus its line in tasks.TASKS; the
    metric fallback for old rows (results/built_in_meanings.json) is generated from those declarations."""
    from ropebench import tasks
    from ropebench.tasks.kit import spec_of

    for name, run in tasks.TASKS.items():
        spec = spec_of(run)
        assert spec is not None and spec.name == name and spec.meanings, name
