"""One parser for "text -> typed value" (extend/values.py, issue 31 item 6): the rules as a table with the
values written by hand, and every entry point — the sweep's -o, -t, --lengths and config file, lm-eval
model_args, `ropebench inspect -o` and the report's flags — giving the same value for the same text and a bad
value one line of one shape. Nothing loads a model."""

from __future__ import annotations

import glob
import math
import os
import re
from pathlib import Path

import pytest
import yaml
from ropebench.extend.values import ValueLoader, ValueTextError, as_int, as_length, as_number, parse_text

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# text -> value, by hand (docs/sweeps.md, "How text becomes a value")
RULES = [
    ("", None),
    ("  ", None),
    ("none", None),
    ("None", None),
    ("NULL", None),
    ("~", None),
    ("true", True),
    ("False", False),
    ("TRUE", True),
    ("42", 42),
    ("-7", -7),
    ("+3", 3),
    ("010", 10),
    (" 42 ", 42),
    ("16k", 16384),
    ("8K", 8192),
    ("2.5", 2.5),
    (".5", 0.5),
    ("2.", 2.0),
    ("2.0", 2.0),
    ("1e5", 100000.0),
    ("1E-3", 0.001),
    ("-2.5e+3", -2500.0),
    ("[1, 2]", [1, 2]),
    ("[4k, 1e4, true, none, no, 'x']", [4096, 10000.0, True, None, "no", "x"]),
    ("[[1, 2], []]", [[1, 2], []]),
    ("{a: 1, b: [2k]}", {"a": 1, "b": [2048]}),
    ("'16k'", "16k"),
    ('"2"', "2"),
    ("'none'", "none"),
    ("yes", "yes"),
    ("no", "no"),
    ("on", "on"),
    ("off", "off"),
    ("0x10", "0x10"),
    ("inf", "inf"),
    ("nan", "nan"),
    ("1_000", "1_000"),
    ("1.5k", "1.5k"),
    ("2x", "2x"),
    ("2024-01-01", "2024-01-01"),
    ("yarn", "yarn"),
    ("Qwen/Qwen2-0.5B", "Qwen/Qwen2-0.5B"),
    ("a;b", "a;b"),
]


def same(a, b) -> bool:
    """Equal values of equal types, all the way down (1 is not 1.0 is not True)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("text, value", RULES, ids=[repr(t) for t, _ in RULES])
def test_rules(text, value):
    assert same(parse_text(text), value), parse_text(text)


def test_values_that_are_not_text_pass_through():
    for value in (None, 3, 2.5, True, [1, "16k"], {"a": "b"}):
        assert parse_text(value) is value


@pytest.mark.parametrize("text", ["[1, 2", "{a: 1", "[1] x"])
def test_a_list_or_mapping_that_does_not_parse_is_one_line(text):
    with pytest.raises(ValueTextError) as e:
        parse_text(text, "-o yarn.short_factor")
    message = str(e.value)
    assert message.startswith(f"-o yarn.short_factor: {text!r} is not a ") and " — write e.g. " in message
    assert "\n" not in message


def test_a_number_beyond_float_is_inf_and_too_many_digits_is_one_line():
    assert parse_text("1e400") == math.inf
    with pytest.raises(ValueTextError, match="is not a number of a usable size"):
        parse_text("9" * 5000, "--lengths")


def test_whole_numbers_lengths_and_numbers():
    assert as_int("1e5", "x", "1") == 100000 and type(as_int(2.0, "x", "1")) is int
    assert as_length("16k", "lengths") == 16384 and as_length("'8k'", "lengths") == 8192
    assert as_number("1e-1", "--tolerance", "0.1", low=0) == 0.1
    for bad, fragment in [("2.5", "is not an integer"), ("0", "is not positive"), ("true", "is not an int")]:
        with pytest.raises(ValueTextError, match=fragment):
            as_length(bad, "lengths")
    with pytest.raises(ValueTextError, match=r"^--threshold: 'nan' is not a finite number — write e.g. 0.8$"):
        as_number("nan", "--threshold", "0.8")
    with pytest.raises(ValueTextError, match=r"^x: 2 is not from 0 to 1 — "):
        as_number(2, "x", "0.5", low=0, high=1)


# ------------------------------------------------------------------------------------------------- YAML
def load(text: str):
    return yaml.load(text, Loader=ValueLoader)


@pytest.mark.parametrize(
    "text", [t for t, _ in RULES if t.strip() and t.strip()[0] not in "'\"[{~"] + ["'16k'", "[4k, no]"]
)
def test_a_yaml_value_is_the_command_lines_value(text):
    assert same(load(f"key: {text}\n")["key"], parse_text(text))


def test_yaml_11_quirks_follow_the_rules():
    got = load("a: no\nb: off\nc: 1e5\nd: 0x10\ne: 010\nf: 2024-01-01\ng:\nh: 16k\ni: '16k'\nj: ~\n")
    assert got == {
        "a": "no",
        "b": "off",
        "c": 100000.0,
        "d": "0x10",
        "e": 10,
        "f": "2024-01-01",
        "g": None,
        "h": 16384,
        "i": "16k",
        "j": None,
    }
    assert load("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n")["other"] == {"x": 1, "y": 2}  # merge keys stay


def test_every_shipped_config_reads_as_before():
    """The shipped configs hold nothing the rules read otherwise than YAML 1.1 did."""
    from ropebench.sweep_lib.config import read_yaml

    files = sorted(glob.glob(str(ROOT / "scripts" / "configs" / "*.yaml")))
    assert files
    for f in files:
        assert read_yaml(f) == yaml.safe_load(Path(f).read_text()), f


# ---------------------------------------------------------------------------------------- entry points
SAME_TEXT = ["16k", "1e5", "2.5", "-7", "true", "none", "no", "0x10", "'16k'", "[1, 16k]", "yarn"]


def sweep_config(argv, tmp_path, config: str | None = None) -> dict:
    from ropebench.sweep_lib.cli import load_config, parser

    base = ["--model", "smollm2-135m", "--out", str(tmp_path / "o")]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        base += ["--config", str(tmp_path / "c.yaml")]
    return load_config(parser().parse_args(base + argv))


def via_option(text, tmp_path):
    cfg = sweep_config(
        ["--methods", "yarn", "--tasks", "perplexity", "--lengths", "64", "-o", f"yarn.k={text}"], tmp_path
    )
    return cfg["methods"][0]["options"]["k"]


def via_task_option(text, tmp_path):
    argv = ["--methods", "plain", "--tasks", "perplexity", "--lengths", "64", "-t", f"perplexity.k={text}"]
    return sweep_config(argv, tmp_path)["tasks"]["perplexity"]["options"]["k"]


def via_config(text, tmp_path):
    config = f"methods: [plain]\nlengths: [64]\ntasks:\n  perplexity: {{k: {text}}}\n"
    return sweep_config([], tmp_path, config)["tasks"]["perplexity"]["options"]["k"]


def via_model_args(text, tmp_path):
    """lm-eval's own parsing of the command line, then ropebench's (integrations.lm_eval.main does both);
    an HFLM argument (revision) takes any value."""
    from lm_eval._cli.utils import key_val_to_dict
    from ropebench.integrations.lm_eval.model import split_model_args, typed_model_args

    written = f"revision={text}"
    argv = ["run", "--model", "ropebench", "--model_args", written, "--tasks", "x"]
    args = typed_model_args(argv, key_val_to_dict(written))
    return split_model_args("plain", args)[1]["revision"]


def via_inspect(text, monkeypatch):
    """`ropebench inspect MODEL --method M -o KEY=VALUE`, with the config read and the preview stubbed."""
    from ropebench import extend
    from ropebench.extend.__main__ import main

    seen = {}
    monkeypatch.setattr(extend.loading, "load_config", lambda *a, **k: None)
    monkeypatch.setattr(extend.inspector, "skeleton", lambda config: None)
    monkeypatch.setattr(extend, "inspect", lambda model, method, factor, **o: seen.update(o) or "")
    assert main(["inspect", "smollm2-135m", "--method", "yarn", "-o", f"k={text}"]) == 0
    return seen["k"]


@pytest.mark.parametrize("text", SAME_TEXT)
def test_every_entry_point_gives_the_same_value(text, tmp_path, monkeypatch):
    expected = parse_text(text)
    for entry in (via_option, via_task_option, via_config, via_model_args):
        assert same(entry(text, tmp_path), expected), (entry.__name__, text)
    assert same(via_inspect(text, monkeypatch), expected), ("via_inspect", text)


def test_lengths_read_alike_everywhere(tmp_path, monkeypatch):
    """A length in --lengths, -t TASK.lengths, a config, model_args max_length and --trained-context."""
    from ropebench.integrations.lm_eval.model import _max_length
    from ropebench.results import reporting
    from ropebench.results.__main__ import main as results_main

    seen = {}
    monkeypatch.setattr(reporting, "report", lambda runs, **kw: seen.update(kw) or "r.md")
    for text, tokens in [("16k", 16384), ("1e5", 100000), ("'8k'", 8192), ("4096", 4096)]:
        got = [
            sweep_config(["--methods", "plain", "--tasks", "perplexity", "--lengths", text], tmp_path),
            sweep_config(
                ["--methods", "plain", "--tasks", "perplexity", "-t", f"perplexity.lengths={text}"],
                tmp_path,
                "lengths: [64]\n",
            ),
            sweep_config(["--methods", "plain", "--tasks", "perplexity"], tmp_path, f"lengths: [{text}]\n"),
        ]
        assert [c["tasks"]["perplexity"]["lengths"] for c in got] == [[tokens]] * 3, text
        assert _max_length(text) == tokens
        assert results_main(["report", str(tmp_path), "--trained-context", text]) == 0
        assert seen["trained_context"] == tokens


SHAPE = re.compile(
    r"^error: (?P<where>[^:]+): (?P<value>'[^']*'|\S+) is not (?P<what>[^—]+) — write e\.g\. \S.*$"
)


def one_error_line(capsys) -> str:
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_bad_value_is_one_line_of_one_shape_everywhere(tmp_path, capsys):
    """'16q' where a length is needed, and an unclosed list, at every entry point: `error: WHERE: VALUE is not
    WHAT — write e.g. EXAMPLE`, exit 2, before anything loads."""
    from ropebench.extend.__main__ import main as inspect_main
    from ropebench.integrations.lm_eval import main as lm_eval_main
    from ropebench.results.__main__ import main as results_main
    from ropebench.sweep_lib.cli import main as sweep_main

    (tmp_path / "c.yaml").write_text(
        "model: smollm2-135m\nmethods: [plain]\ntasks: [perplexity]\nlengths: [16q]\n"
    )
    base = [
        "--model",
        "smollm2-135m",
        "--methods",
        "yarn",
        "--tasks",
        "perplexity",
        "--out",
        str(tmp_path / "o"),
    ]
    lm_eval = ["run", "--model", "ropebench", "--tasks", "ropebench_passkey_16k", "--model_args"]
    calls = {
        "--lengths": lambda: sweep_main([*base, "--lengths", "16q"]),
        "-t": lambda: sweep_main([*base, "-t", "perplexity.lengths=16q"]),
        "config": lambda: sweep_main(["--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "o")]),
        "model_args": lambda: lm_eval_main([*lm_eval, "pretrained=smollm2-135m,max_length=16q"]),
        "report": lambda: results_main(["report", str(tmp_path), "--trained-context", "16q"]),
    }
    for name, call in calls.items():
        assert call() == 2, name
        line = one_error_line(capsys)
        found = SHAPE.match(line)
        assert found and found["value"] == "'16q'" and found["what"].strip() == "an integer", (name, line)
    unclosed = {
        "-o": lambda: sweep_main([*base, "--lengths", "64", "-o", "yarn.beta_fast=[1, 2"]),
        "-t": lambda: sweep_main([*base, "--lengths", "64", "-t", "perplexity.k=[1, 2"]),
        "model_args": lambda: lm_eval_main([*lm_eval, "pretrained=smollm2-135m,method=yarn,beta_fast=[1, 2"]),
        "inspect -o": lambda: inspect_main(["inspect", "m", "--method", "yarn", "-o", "beta_fast=[1, 2"]),
    }
    for name, call in unclosed.items():
        assert call() == 2, name
        line = one_error_line(capsys)
        found = SHAPE.match(line)
        assert found and found["value"] == "'[1, 2'" and found["what"].startswith("a list"), (name, line)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------ benchmarks' flags
@pytest.mark.parametrize(
    "flag, value",
    [
        ("--repeats", "0"),
        ("--window", "-1"),
        ("--lengths", "0"),
        ("--max-length", "1"),
        ("--rolling-tokens", "-5"),
    ],
)
def test_benchmark_run_numeric_flags_are_checked(flag, value, capsys):
    from ropebench.benchmarks.errors import exit_code
    from ropebench.benchmarks.run import main

    assert exit_code(main, [flag, value, "--estimate"]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: argument {flag}: must be ") and " — run " in line, line


@pytest.mark.parametrize("text, value", [r for r in RULES if "," not in r[0]], ids=lambda r: repr(r))
def test_lm_eval_model_args_are_read_by_the_same_rules(text, value):
    """An lm-eval run's model_args, read back by the results importer, give each value as every other entry
    point does (`16k` is 16384 there too, as the ropebench lm-eval model read it when it ran)."""
    from ropebench.results.lm_eval_import import parse_model_args

    assert same(parse_model_args(f"pretrained=x,opt={text}")["opt"], value)
