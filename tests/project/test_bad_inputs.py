"""Every bad input gets one line `error: <what is wrong> — <what to do>` and exit code 2 (an ExtendError for
the Python API), before any model loads, and leaves no empty run directory behind.

CASES is also the table of docs/bad-input.md: `python tests/project/test_bad_inputs.py --write-docs`
regenerates that page from this list, and `test_docs_table_matches_the_cases` fails when the two drift apart.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

DOC = ROOT / "docs" / "bad-input.md"
DOC_HEAD = """# Bad input

Every bad input is rejected **before a model loads** with one line `error: <what is wrong> — <what to do>` and
exit code 2 (an `ExtendError` from the Python API). Each rule is checked by the layer that owns it, and the
sweep, `extend.patch` and the lm-eval `model_args` call the same checks: methods, factors and option values
against the method function's signature (`extend.registry.check_method`), model specs and devices
(`extend.loading`), task names and options (`tasks.checks.check_task`), corpora (`tasks.data.check_corpus`:
empty files or directories, a hub dataset that cannot be opened — once, not per cell; binary, UTF-16 or
malformed JSON Lines files). What needs the model but not its weights is checked from its config and
tokenizer: the method patched onto a weightless skeleton of the model (`extend.preflight.check_on_config`:
start_from, temperature, layer_types, windows, list lengths), lengths against the tasks and the corpus
(`tasks.checks.check_lengths_fit`) and the memory the longest forward needs against the free memory
(`extend.memory`; `ROPEBENCH_MEMORY_GB` sets the budget). Option ranges are declared per option
(`Annotated[float, Range(gt=0)]`, checked by `extend.registry.check_options`). The sweep itself checks its
config's shape, its flags, the run directory and plugins (a syntax error or an exception in a plugin is named
with its file and line). A rejected input leaves no run directory behind. `ropebench report` writes
only into a new or empty directory or one ropebench made, never over a file ropebench did not write; records
files that are damaged or not ropebench's are named with their file and first bad line (damaged lines among
good ones are skipped with one warning); records that carry no model, method or length are no ropebench run
and are refused, naming the missing fields. The benchmarks (`ropebench bench NAME`) check their numeric flags
while parsing, each integer against its cost bound (`benchmarks/errors.py`: `at_least`, `forward_tokens`,
`count`, `fraction`), and what they pass on by the owning layer's checks, before the model loads.

This page is generated from `tests/project/test_bad_inputs.py`, which runs every case (`python
tests/project/test_bad_inputs.py --write-docs` rewrites it; DIR is the test's scratch directory).

"""


@dataclass(frozen=True)
class Case:
    shown: str  # the input as docs/bad-input.md shows it
    args: tuple  # CLI arguments; "{tmp}" is the case's scratch directory
    expect: str  # a fragment the message must contain
    kind: str = "sweep"  # sweep | results | lm_eval (ropebench lm-eval) | ropebench (the command) | api
    code: int = 2
    env: dict = field(default_factory=dict)
    out_stays: bool = False  # the case's --out existed before (so it is still there)


BASE = {
    "--model": "smollm2-135m",
    "--methods": "plain",
    "--tasks": "perplexity",
    "--lengths": "64",
    "--out": "{tmp}/o",
}


def sweep(shown, *more, expect, **kw) -> Case:
    """A sweep call: BASE, where FLAG VALUE pairs in `more` replace BASE's value (the first time) or are
    added."""
    flags, extra, used, items = dict(BASE), [], set(), list(more)
    while items:
        flag = items.pop(0)
        if flag == "--fresh":
            extra.append(flag)
            continue
        value = items.pop(0)
        if flag in flags and flag not in used:
            flags[flag] = value
            used.add(flag)
        else:
            extra += [flag, value]
    return Case(shown, tuple([x for kv in flags.items() for x in kv] + extra), expect, **kw)


def raw(shown, *args, expect, **kw) -> Case:
    return Case(shown, tuple(args), expect, **kw)


CASES = [
    # -- config files
    raw("`--config nope.yaml` (missing)", "--config", "{tmp}/nope.yaml", expect="config file not found"),
    raw("config with a YAML syntax error", "--config", "{tmp}/bad.yaml", expect="invalid YAML"),
    raw("config that is a YAML list", "--config", "{tmp}/list.yaml", expect="must hold a mapping"),
    raw("config that is a directory", "--config", "{tmp}", expect="cannot read config file"),
    raw("config key typo `lenghts:`", "--config", "{tmp}/typo.yaml", expect="did you mean lengths"),
    raw("config with a key given twice", "--config", "{tmp}/dup.yaml", expect="duplicate key 'methods'"),
    raw("config `methods: []`", "--config", "{tmp}/empty.yaml", "--out", "{tmp}/o", expect="empty grid"),
    raw(
        "config `methods: [{method: yarn, factor: 2}]`",
        "--config",
        "{tmp}/factor.yaml",
        "--out",
        "{tmp}/o",
        expect="did you mean factors",
    ),
    raw(
        "config `methods: [[1, 2]]`",
        "--config",
        "{tmp}/nested.yaml",
        "--out",
        "{tmp}/o",
        expect="must be a name or a mapping",
    ),
    raw(
        "config `options: 3`",
        "--config",
        "{tmp}/options.yaml",
        "--out",
        "{tmp}/o",
        expect="options must be a mapping",
    ),
    raw(
        "config `per_length: yes please`",
        "--config",
        "{tmp}/perlength.yaml",
        "--out",
        "{tmp}/o",
        expect="per_length must be true or false",
    ),
    raw(
        "config `trust_remote_code: maybe`",
        "--config",
        "{tmp}/trust.yaml",
        "--out",
        "{tmp}/o",
        expect="trust_remote_code must be true or false",
    ),
    raw(
        "config task without lengths",
        "--config",
        "{tmp}/nolengths.yaml",
        "--out",
        "{tmp}/o",
        expect="has no lengths",
    ),
    # -- flags
    sweep("`--lenghts 5` (unknown flag)", "--lenghts", "5", expect="unrecognized arguments"),
    sweep("`--lengths 0`", "--lengths", "0", expect="not positive"),
    sweep("`--lengths -5`", "--lengths", "-5", expect="not positive"),
    sweep("`--lengths 2.5`", "--lengths", "2.5", expect="not an integer"),
    sweep("`--lengths abc`", "--lengths", "abc", expect="not an integer"),
    sweep("`--lengths 2048 --lengths 4096`", "--lengths", "2048", "--lengths", "4096", expect="given twice"),
    sweep(
        "`--methods plain --methods yarn`", "--methods", "plain", "--methods", "yarn", expect="given twice"
    ),
    sweep(
        "`--tasks perplexity --tasks passkey`",
        "--tasks",
        "perplexity",
        "--tasks",
        "passkey",
        expect="given twice",
    ),
    sweep("`--out a --out b`", "--out", "{tmp}/o", "--out", "{tmp}/o2", expect="given twice"),
    sweep("`--factors -2`", "--methods", "yarn", "--factors", "-2", expect="not a positive number"),
    sweep("`--factors 0`", "--methods", "yarn", "--factors", "0", expect="not a positive number"),
    sweep("`--factors abc`", "--methods", "yarn", "--factors", "abc", expect="not a positive number"),
    sweep("`--factors inf`", "--methods", "yarn", "--factors", "inf", expect="not a positive number"),
    sweep(
        "`--methods yarn --factors 0.5` (yarn only extends)",
        "--methods",
        "yarn",
        "--factors",
        "0.5",
        expect="only extends context",
    ),
    sweep("`--seed x`", "--seed", "x", expect="seed: 'x' is not an integer"),
    sweep("`--seed -1`", "--seed", "-1", expect="seed must be >= 0"),
    sweep("`--out ''`", "--out", "", expect="out must be a directory path"),
    sweep("`--out` below a file", "--out", "{tmp}/afile/sub", expect="cannot write to --out"),
    sweep("`--out` is a file", "--out", "{tmp}/afile", expect="is a file", out_stays=True),
    sweep(
        "`--out` a non-empty directory of the user's",
        "--out",
        "{tmp}/mine",
        expect="non-empty directory ropebench did not make",
        out_stays=True,
    ),
    sweep(
        "`--fresh --out` a non-empty directory of the user's",
        "--out",
        "{tmp}/mine",
        "--fresh",
        expect="non-empty directory ropebench did not make",
        out_stays=True,
    ),
    sweep(
        "`--out` a run directory another sweep is writing",
        "--out",
        "{tmp}/locked",
        expect="in use by another sweep",
        out_stays=True,
    ),
    sweep("`--dtype float8`", "--dtype", "float8", expect="unknown dtype"),
    sweep("`--device tpu`", "--device", "tpu", expect="unknown device"),
    sweep("`--device mps` (no Apple GPU)", "--device", "mps", expect="MPS backend is not available"),
    sweep("`--device cuda` (no GPU)", "--device", "cuda", expect="no CUDA GPU is available"),
    # -- names against the registries
    sweep("`--methods yarm`", "--methods", "yarm", expect="did you mean yarn"),
    sweep("`--tasks passky`", "--tasks", "passky", expect="did you mean passkey"),
    sweep("`--corpus sotuu`", "--corpus", "sotuu", expect="did you mean sotu"),
    sweep("`--model smollm2-136m`", "--model", "smollm2-136m", expect="did you mean smollm2-135m"),
    sweep("`--model ./no-such-dir`", "--model", "{tmp}/no-model", expect="not a model directory"),
    sweep("`--model missing.gguf`", "--model", "{tmp}/missing.gguf", expect="GGUF file not found"),
    sweep("`--model fake.gguf` (a text file)", "--model", "{tmp}/fake.gguf", expect="is not a GGUF file"),
    sweep(
        "`--methods longrope` without its factor lists",
        "--methods",
        "longrope",
        "--factors",
        "2",
        expect="needs option",
    ),
    # -- method options
    sweep(
        "`-o yarn.beta_fats=3`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_fats=3",
        expect="did you mean beta_fast",
    ),
    sweep(
        "`-o yarn.beta_fast=abc`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_fast=abc",
        expect="option beta_fast of method 'yarn' must be a number, got 'abc'",
    ),
    sweep(
        "`-o beta_fast=abc` (every method that takes it)",
        "--methods",
        "yarn",
        "-o",
        "beta_fast=abc",
        expect="must be a number",
    ),
    sweep(
        "`-o yarn.beta_fast=[1,2]`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_fast=[1,2]",
        expect="must be a number",
    ),
    sweep(
        "`-o yarn.attention_factor=x`",
        "--methods",
        "yarn",
        "-o",
        "yarn.attention_factor=x",
        expect="must be a number (or None)",
    ),
    sweep(
        "`-o yarn.original_max_position_embeddings=-5`",
        "--methods",
        "yarn",
        "-o",
        "yarn.original_max_position_embeddings=-5",
        expect="must be a positive integer",
    ),
    sweep(
        "`-o yarn.original_max_position_embeddings=1.5`",
        "--methods",
        "yarn",
        "-o",
        "yarn.original_max_position_embeddings=1.5",
        expect="must be a positive integer",
    ),
    sweep("`-o xpos.gamma=true`", "--methods", "xpos", "-o", "xpos.gamma=true", expect="must be a number"),
    sweep(
        "`-o nosuch=1` (no method takes it)",
        "--methods",
        "yarn",
        "-o",
        "nosuch=1",
        expect="no method of the grid",
    ),
    sweep(
        "`-o pi.beta=1` (pi not in the grid)",
        "--methods",
        "yarn",
        "-o",
        "pi.beta=1",
        expect="not in the grid",
    ),
    sweep(
        "`-o yarn.beta_fast=16 -o yarn.beta_fast=32`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_fast=16",
        "-o",
        "yarn.beta_fast=32",
        expect="given twice",
    ),
    sweep(
        "`-o yarn.beta_fast` (no `=`)", "--methods", "yarn", "-o", "yarn.beta_fast", expect="is not KEY=VALUE"
    ),
    # -- task options
    sweep("`-t num_docs=1` (no task)", "-t", "num_docs=1", expect="needs TASK.KEY=VALUE"),
    sweep("`-t perplexity.num_doc=2`", "-t", "perplexity.num_doc=2", expect="did you mean num_docs"),
    sweep("`-t perplexity.seed=3`", "-t", "perplexity.seed=3", expect="is set by the sweep"),
    sweep(
        "`-t perplexity.num_docs=1 -t perplexity.num_docs=2`",
        "-t",
        "perplexity.num_docs=1",
        "-t",
        "perplexity.num_docs=2",
        expect="given twice",
    ),
    sweep(
        "`-t perplexity.protocol=slidng`",
        "-t",
        "perplexity.protocol=slidng",
        expect="protocol='slidng' must be one of truncate, sliding",
    ),
    sweep(
        "`-t perplexity.num_docs=0`",
        "-t",
        "perplexity.num_docs=0",
        expect="num_docs=0 must be a positive integer",
    ),
    sweep(
        "`-t perplexity.num_docs=abc`", "-t", "perplexity.num_docs=abc", expect="must be a positive integer"
    ),
    sweep(
        "`-t perplexity.chunk_size=-1`", "-t", "perplexity.chunk_size=-1", expect="must be a positive integer"
    ),
    sweep(
        "`-t perplexity.add_bos=maybe`",
        "-t",
        "perplexity.add_bos=maybe",
        expect="must be true, false or unset",
    ),
    sweep(
        "`-t perplexity.stride=32` with protocol truncate",
        "-t",
        "perplexity.stride=32",
        expect="only applies to protocol sliding",
    ),
    sweep(
        "`--lengths 2048 -t passkey.lengths=[4096]`",
        "--tasks",
        "passkey",
        "--lengths",
        "2048",
        "-t",
        "passkey.lengths=[4096]",
        expect="both set the lengths of passkey",
    ),
    sweep(
        "`-t passkey.depths=[1.5]`",
        "--tasks",
        "passkey",
        "-t",
        "passkey.depths=[1.5]",
        expect="not a fraction in [0, 1]",
    ),
    sweep("`-t passkey.depths=[]`", "--tasks", "passkey", "-t", "passkey.depths=[]", expect="non-empty list"),
    sweep(
        "`-t passkey.depths=[0.5,0.5]`",
        "--tasks",
        "passkey",
        "-t",
        "passkey.depths=[0.5,0.5]",
        expect="more than once",
    ),
    sweep(
        "`-t passkey.trials=0`",
        "--tasks",
        "passkey",
        "-t",
        "passkey.trials=0",
        expect="must be a positive integer",
    ),
    sweep(
        "`-t passkey.haystack=hay`",
        "--tasks",
        "passkey",
        "-t",
        "passkey.haystack=hay",
        expect="must be one of filler, corpus",
    ),
    sweep(
        "`-t classification.mode=few-shot`",
        "--tasks",
        "classification",
        "-t",
        "classification.mode=few-shot",
        expect="must be one of zero-shot, many-shot",
    ),
    sweep(
        "`-t classification.demo_fraction=1.5`",
        "--tasks",
        "classification",
        "-t",
        "classification.demo_fraction=1.5",
        expect="strictly between 0 and 1",
    ),
    sweep(
        "`-t classification.label=colour`",
        "--tasks",
        "classification",
        "-t",
        "classification.label=colour",
        expect="must be one of era, party, label",
    ),
    # -- corpora
    sweep("`--corpus` an empty directory", "--corpus", "{tmp}/emptydir", expect="an empty directory"),
    sweep("`--corpus` an empty file", "--corpus", "{tmp}/empty.txt", expect="has no documents"),
    sweep("`--corpus` a directory without text files", "--corpus", "{tmp}/pdfs", expect="no *.txt"),
    sweep("`--corpus` mixed .txt and .jsonl files", "--corpus", "{tmp}/mixed", expect="mixes file types"),
    sweep("`--corpus pg19` offline (HF_HUB_OFFLINE=1)", "--corpus", "pg19", expect="not in the local cache"),
    sweep(
        "`--corpus pg19` without network",
        "--corpus",
        "pg19",
        expect="cannot be reached",
        env={"HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"},
    ),
    # -- plugins
    sweep("`--plugin missing.py`", "--plugin", "{tmp}/missing.py", expect="plugin file not found"),
    sweep("`--plugin no_such_module`", "--plugin", "no_such_module_xyz", expect="could not be imported"),
    sweep(
        "`--plugin` a file with a syntax error",
        "--plugin",
        "{tmp}/syntax_plugin.py",
        expect="has a syntax error",
    ),
    sweep(
        "`--plugin` a file that raises",
        "--plugin",
        "{tmp}/raising_plugin.py",
        expect="raised ZeroDivisionError at raising_plugin.py:2",
    ),
    # -- results CLI
    raw(
        "`ropebench report missing-dir`",
        "report",
        "{tmp}/nope",
        kind="results",
        expect="run directory not found",
    ),
    raw(
        "`ropebench report` a directory without records",
        "report",
        "{tmp}/emptydir",
        kind="results",
        expect="no records in",
    ),
    raw(
        "`ropebench report` a directory named records.jsonl",
        "report",
        "{tmp}/fake/records.jsonl",
        kind="results",
        expect="is a directory, not a records file",
    ),
    raw(
        "`ropebench report` a records file of damaged lines",
        "report",
        "{tmp}/damaged",
        kind="results",
        expect="no records in",
    ),
    raw(
        "`ropebench report --trained-context -5`",
        "report",
        "{tmp}/run",
        "--trained-context",
        "-5",
        kind="results",
        expect="--trained-context: '-5' is not positive",
    ),
    raw(
        "`ropebench report --trained-context x`",
        "report",
        "{tmp}/run",
        "--trained-context",
        "x",
        kind="results",
        expect="--trained-context: 'x' is not an integer",
    ),
    raw(
        "`ropebench report table --rows nosuchcol`",
        "table",
        "{tmp}/run",
        "--task",
        "perplexity",
        "--metric",
        "ppl",
        "--rows",
        "nosuchcol",
        kind="results",
        expect="--rows 'nosuchcol' is not a column",
    ),
    raw(
        "`ropebench report table --cols nosuchcol`",
        "table",
        "{tmp}/run",
        "--task",
        "perplexity",
        "--metric",
        "ppl",
        "--cols",
        "nosuchcol",
        kind="results",
        expect="--cols 'nosuchcol' is not a column",
    ),
    raw(
        "`ropebench report table --task nosuch`",
        "table",
        "{tmp}/run",
        "--task",
        "nosuch",
        "--metric",
        "ppl",
        kind="results",
        expect="unknown task 'nosuch'",
    ),
    raw(
        "`ropebench report table --metric nosuch`",
        "table",
        "{tmp}/run",
        "--task",
        "perplexity",
        "--metric",
        "nosuch",
        kind="results",
        expect="unknown metric 'nosuch'",
    ),
    raw(
        "`ropebench report table` without --task",
        "table",
        "{tmp}/run",
        kind="results",
        expect="the following arguments are required",
    ),
    # -- Python API and lm-eval model_args
    raw(
        '`extend.patch(model, "yarn", 2, beta_fast="abc")`',
        "yarn",
        {"beta_fast": "abc"},
        kind="api",
        code=0,
        expect="option beta_fast of method 'yarn' must be a number, got 'abc'",
    ),
    raw(
        '`extend.patch(model, "yarn", 2, original_max_position_embeddings=-5)`',
        "yarn",
        {"original_max_position_embeddings": -5},
        kind="api",
        code=0,
        expect="must be a positive integer",
    ),
    raw(
        "`ropebench lm-eval run --model ropebench --model_args method=yarn,factor=2,beta_fast=abc`",
        "run",
        "--model",
        "ropebench",
        "--model_args",
        "method=yarn,factor=2,beta_fast=abc",
        "--tasks",
        "ropebench_passkey_16k",
        kind="lm_eval",
        expect="option beta_fast of method 'yarn' must be a number",
    ),
]

# -- issue 25 B: refused before the weights load — checked from the config, the tokenizer and the corpus
CASES += [
    sweep("`--lengths 1`", "--lengths", "1", expect="too short to score a token"),
    sweep(
        "`--tasks passkey --lengths 7`",
        "--tasks",
        "passkey",
        "--lengths",
        "7",
        expect="too short for the passkey prompt",
    ),
    sweep(
        "`--lengths 819200` (longer than every sotu speech)",
        "--lengths",
        "819200",
        expect="longer than corpus 'sotu' can fill",
    ),
    sweep("`--lengths 1e20`", "--lengths", "1e20", expect="longer than corpus 'sotu' can fill"),
    sweep(
        "`-t perplexity.stride=128` wider than the window (sliding, length 64)",
        "-t",
        "perplexity.protocol=sliding",
        "-t",
        "perplexity.loss_by_position=false",  # the demo's loss by position needs protocol truncate
        "-t",
        "perplexity.stride=128",
        expect="larger than the window",
    ),
    sweep(
        "`--tasks passkey --lengths 100000` beyond free memory (ROPEBENCH_MEMORY_GB=2)",
        "--tasks",
        "passkey",
        "--lengths",
        "100000",
        expect="the largest that fits",
        env={"ROPEBENCH_MEMORY_GB": "2"},
    ),
    sweep("`--corpus` a binary file", "--corpus", "{tmp}/binary.txt", expect="is binary, not UTF-8 text"),
    sweep("`--corpus` a UTF-16 file", "--corpus", "{tmp}/utf16.txt", expect="is UTF-16 text, not UTF-8"),
    sweep(
        "`--corpus` JSONL without a text field",
        "--corpus",
        "{tmp}/nofield.jsonl",
        expect="has no 'text' string",
    ),
    sweep("`--corpus` broken JSONL", "--corpus", "{tmp}/broken.jsonl", expect="line 2 is not valid JSON"),
    sweep("`--corpus` a single 10-token document", "--corpus", "{tmp}/tiny.txt", expect="can fill"),
    sweep("`--corpus` a 100 KB whitespace file", "--corpus", "{tmp}/spaces.txt", expect="has no documents"),
    sweep(
        "`-o yarn.start_from=bogus`",
        "--methods",
        "yarn",
        "-o",
        "yarn.start_from=bogus",
        expect="start_from must be",
    ),
    sweep(
        "`-o yarn.temperature=hot`",
        "--methods",
        "yarn",
        "-o",
        "yarn.temperature=hot",
        expect="temperature must be",
    ),
    sweep(
        "`-o yarn.layer_types=[global]` (a single-type model)",
        "--methods",
        "yarn",
        "-o",
        "yarn.layer_types=[global]",
        expect="layer_types only applies",
    ),
    sweep(
        "`-o yarn.beta_fast=-5`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_fast=-5",
        expect="option beta_fast of method 'yarn' must be > 0",
    ),
    sweep(
        "`-o self-extend.window=0`",
        "--methods",
        "self-extend",
        "-o",
        "self-extend.window=0",
        expect="option window of method 'self-extend' must be >= 1",
    ),
    sweep("`-o rerope.window=-3`", "--methods", "rerope", "-o", "rerope.window=-3", expect="must be >= 1"),
    sweep(
        "`-o rerope.window=100000` (past the trained context)",
        "--methods",
        "rerope",
        "-o",
        "rerope.window=100000",
        expect="below the trained context 8192",
    ),
    sweep(
        "`-o llama3.low_freq_factor=4 -o llama3.high_freq_factor=1`",
        "--methods",
        "llama3",
        "-o",
        "llama3.low_freq_factor=4",
        "-o",
        "llama3.high_freq_factor=1",
        expect="llama3 needs high_freq_factor",
    ),
    sweep(
        "`-o yarn.beta_slow=50`",
        "--methods",
        "yarn",
        "-o",
        "yarn.beta_slow=50",
        expect="beta_fast > beta_slow",
    ),
    sweep(
        "`--methods longrope` with 2-value factor lists",
        "--methods",
        "longrope",
        "-o",
        "longrope.short_factor=[1,2]",
        "-o",
        "longrope.long_factor=[1,2]",
        expect="must be a list of 32 numbers",
    ),
    sweep(
        "`--model` a directory whose config.json is `{}`",
        "--model",
        "{tmp}/emptycfg",
        expect="could not read the config",
    ),
    sweep("`--model` a truncated GGUF", "--model", "{tmp}/truncated.gguf", expect="damaged or truncated"),
    raw(
        "config `options: {yarm: {beta_fast: 16}}` (a misspelt method)",
        "--config",
        "{tmp}/optyarm.yaml",
        "--out",
        "{tmp}/o",
        expect="options.yarm: unknown RoPE method 'yarm' — did you mean yarn",
    ),
    sweep(
        "`--factors 1e300`", "--methods", "yarn", "--factors", "1e300", expect="beyond the supported maximum"
    ),
    sweep("`--factors 1e400` (inf)", "--methods", "yarn", "--factors", "1e400", expect="is not finite"),
    raw(
        '`extend.patch(model, "yarn", 2, beta_fast=-5)`',
        "yarn",
        {"beta_fast": -5},
        kind="api",
        code=0,
        expect="option beta_fast of method 'yarn' must be > 0",
    ),
    raw(
        "`ropebench lm-eval run --model ropebench --model_args method=yarn,factor=2,start_from=bogus`",
        "run",
        "--model",
        "ropebench",
        "--model_args",
        "method=yarn,factor=2,start_from=bogus",
        "--tasks",
        "ropebench_passkey_16k",
        kind="lm_eval",
        expect="start_from must be",
    ),
    raw(
        "`ropebench lm-eval run --model ropebench --model_args device=tpu`",
        "run",
        "--model",
        "ropebench",
        "--model_args",
        "device=tpu",
        "--tasks",
        "ropebench_passkey_16k",
        kind="lm_eval",
        expect="is not a device",
    ),
    raw(
        "`ropebench lm-eval run --model ropebench --model_args batch_size=abc`",
        "run",
        "--model",
        "ropebench",
        "--model_args",
        "batch_size=abc",
        "--tasks",
        "ropebench_passkey_16k",
        kind="lm_eval",
        expect="is not a batch size",
    ),
    raw(
        "`ropebench lm-eval run --model ropebench --tasks ropebench_passky_16k` (a mistyped task)",
        "run",
        "--model",
        "ropebench",
        "--tasks",
        "ropebench_passky_16k",
        kind="lm_eval",
        expect="tasks not found",
        env={"ROPEBENCH_CACHE": "{tmp}/empty-cache"},
    ),  # first use: refused before the GGUF is converted
]

# -- issue 32 item 3: lm-eval's walls refused up front; the `ropebench` command as strict as its subcommands
CASES += [
    raw(
        "`ropebench lm-eval run --model ropebench --tasks niah_single_1 niah_multikey_1` offline, lm-eval's "
        "essay haystack not cached",
        "run",
        "--model",
        "ropebench",
        "--tasks",
        "niah_single_1",
        "niah_multikey_1",
        "--metadata",
        '{"tokenizer": "gpt2"}',  # given: no GGUF snapshot is written for the tokenizer before the check
        kind="lm_eval",
        expect="niah_multikey_1 needs the hub dataset 'baber/paul_graham_essays'",
        env={"HF_DATASETS_CACHE": "{tmp}/empty-cache", "HF_HUB_CACHE": "{tmp}/empty-cache"},
    ),
    raw("`ropebench lm-eval --bogus-flag`", "--bogus-flag", kind="lm_eval", expect="unrecognized arguments"),
    raw("`ropebench` (no command)", kind="ropebench", expect="no command given"),
    raw("`ropebench help nosuch`", "help", "nosuch", kind="ropebench", expect="unknown command 'nosuch'"),
]


def bench(command: str, expect: str) -> Case:
    """`ropebench bench COMMAND` (split on spaces; DIR: the case's scratch directory), refused while parsing
    or by the owning layer's check, before a model loads (`no_model_loads` fails a case that gets there)."""
    args = command.replace("DIR", "{tmp}").split()
    return raw(f"`ropebench bench {command}`", "bench", *args, kind="ropebench", expect=expect)


# -- issue 32 item 4: the benchmarks' options checked before any model loads; records that are not a run
POSITIVE = "must be a positive integer"
TOKENS = "must be an integer >= 2"  # tokens of one forward (benchmarks/errors.py: forward_tokens)
CASES += [
    bench("longppl-cost --length -5", "must be an integer >= 2"),
    bench("longppl-cost --trunc-len 0", TOKENS),
    bench("longppl-cost --sliding-window -1", TOKENS),
    bench("longppl-cost --repeats 0", POSITIVE),
    bench("longppl-cost --length 1024 --trunc-len 2048", "trunc_len"),
    bench("longppl-cost --corpus nosuch", "unknown corpus"),
    bench("longppl-cost --json DIR/no/out.json", "does not exist"),
    bench("retrieval-sharing --tiny --trials 0", POSITIVE),  # SmolLM2 used to load first, even with --tiny
    bench("retrieval-sharing --tiny --depths 2.0", "must be a number from 0 to 1"),
    bench("retrieval-sharing --tiny --variants nosuch", "variants=['nosuch']"),
    bench("retrieval-sharing --tiny --lengths 0", TOKENS),
    bench("retrieval-sharing --tiny --repeats 0", POSITIVE),
    bench("cpu-dtype --tokens -5", TOKENS),
    bench("cpu-dtype --rounds 0", POSITIVE),
    bench("remap-cost --length 1", "must be an integer >= 2"),
    bench("remap-cost --layers -3", POSITIVE),
    bench("remap-cost --block 0", TOKENS),
    bench("remap-cost --cells nosuch:2", "unknown RoPE method 'nosuch'"),
    bench("shape-check --methods yarm", "unknown RoPE method 'yarm'"),
    bench("longppl-bias --num-docs 0", POSITIVE),
    raw(
        "`ropebench report` a records file whose lines carry only run/cell/task/metric/value",
        "report",
        "{tmp}/idless",
        kind="results",
        expect="is not a ropebench run: none of its 2 records carries model, method, length",
    ),
]


# -- issue 25 A: never write over a user's file; damaged or foreign records; plugins; unusable paths
CASES += [
    raw(
        "config with an integer key `1: x`",
        "--config",
        "{tmp}/intkey.yaml",
        "--out",
        "{tmp}/o",
        expect="key 1 is not a name",
    ),
    sweep("`--out` on a symlink loop", "--out", "{tmp}/loop/o", expect="ymlink loop"),
    sweep(
        "`--out` under a directory that may not be read",
        "--out",
        "{tmp}/noread/sub/o",
        expect="Permission denied",
    ),
    sweep(
        "`--out` a run directory whose records.jsonl is a directory",
        "--out",
        "{tmp}/rd_dir",
        expect="is not a regular file",
        out_stays=True,
    ),
    sweep(
        "`--out` a run directory whose record has a list as `cell`",
        "--out",
        "{tmp}/rd_celllist",
        expect="cell is a list",
        out_stays=True,
    ),
    raw(
        "`--dry-run --out` a run directory whose record is a 200000-deep JSON line",
        "--model",
        "smollm2-135m",
        "--methods",
        "plain",
        "--tasks",
        "perplexity",
        "--lengths",
        "64",
        "--out",
        "{tmp}/rd_deep",
        "--dry-run",
        expect="nested too deeply",
        out_stays=True,
    ),
    sweep(
        "`--out` a run directory whose records file is of a foreign schema",
        "--out",
        "{tmp}/rd_foreign",
        expect="none of its 2 lines is a ropebench record",
        out_stays=True,
    ),
    sweep(
        "`--plugin` a file that calls sys.exit(3)",
        "--plugin",
        "{tmp}/exit_plugin.py",
        expect="called sys.exit(3) at exit_plugin.py:2",
    ),
    sweep(
        "`--plugin` a file that raises KeyboardInterrupt",
        "--plugin",
        "{tmp}/kbi_plugin.py",
        expect="raised KeyboardInterrupt at kbi_plugin.py:1",
    ),
    sweep("`--plugin ''`", "--plugin", "", expect="names no plugin"),
    raw(
        "`ropebench report RUN --out` a directory of the user's (own report.md)",
        "report",
        "{tmp}/run",
        "--out",
        "{tmp}/mine",
        kind="results",
        expect="non-empty directory ropebench did not make",
    ),
    raw(
        "`ropebench report RUN --out` a file",
        "report",
        "{tmp}/run",
        "--out",
        "{tmp}/afile",
        kind="results",
        expect="is not a directory",
    ),
    raw(
        "`ropebench report` a run directory holding the user's tables/perplexity_ppl.md",
        "report",
        "{tmp}/ownrun",
        kind="results",
        expect="perplexity_ppl.md exists and ropebench did not write it",
    ),
    raw(
        "`ropebench report` a record with a list as `cell`",
        "report",
        "{tmp}/rd_celllist",
        kind="results",
        expect="cell is a list",
    ),
    raw(
        "`ropebench report` a 200000-deep JSON line",
        "report",
        "{tmp}/rd_deep",
        kind="results",
        expect="nested too deeply",
    ),
    raw(
        "`ropebench report` a records file of a foreign schema",
        "report",
        "{tmp}/rd_foreign",
        kind="results",
        expect="none of its 2 lines is a ropebench record",
    ),
    raw(
        "`ropebench report table --rows length --cols length`",
        "table",
        "{tmp}/run",
        "--task",
        "perplexity",
        "--metric",
        "ppl",
        "--rows",
        "length",
        "--cols",
        "length",
        kind="results",
        expect="is given twice",
    ),
]
# -- issue 41 item 1: every writer goes through one guard (extend/owned_paths.py); a folder of the user's,
# or one behind a marker that does not count, is refused before anything is written
CASES += [
    sweep(
        "`--out` a folder of the user's behind an empty marker",
        "--out",
        "{tmp}/marker_empty",
        expect="non-empty directory ropebench did not make",
        out_stays=True,
    ),
    raw(
        "`ropebench report RUN --out` a folder of the user's behind an unparsable marker",
        "report",
        "{tmp}/run",
        "--out",
        "{tmp}/marker_bad",
        kind="results",
        expect="non-empty directory ropebench did not make",
    ),
    bench("gpu --cpu-sizes --out DIR/mine", "non-empty directory ropebench did not make"),
    bench("gpu --save-tokenizer DIR/mine", "non-empty directory ropebench did not make"),
    bench("longppl-cost --json DIR/mine/report.md", "exists and ropebench did not write it"),
    raw(
        "`ropebench lm-eval run --output_path` a folder of the user's",
        "run",
        "--model",
        "hf",
        "--model_args",
        "pretrained=none",
        "--tasks",
        "x",
        "--output_path",
        "{tmp}/mine",
        kind="lm_eval",
        expect="non-empty directory ropebench did not make",
    ),
]

# -- issue 41 item 5: the classes of bad input and the rule that covers each, with the tests that check it
# (docs/bad-input.md lists them; test_every_class_names_tests_that_exist checks the names). One row a class:
# (class, rule, tests as "FILE::FUNCTION" under tests/).
WRITES = "tests/project/test_owned_paths.py"


@dataclass(frozen=True)
class BadClass:
    what: str  # the class of bad input
    rule: str  # the rule that covers it
    tests: tuple[str, ...]  # "FILE::FUNCTION" under tests/


CLASSES = [
    BadClass(
        what="`sweep --fresh` in a run directory holding the user's files (in plots/ and tables/, linked "
        "from report.md, same-stem siblings)",
        rule="--fresh removes only what the run directory's marker (`.ropebench-owned.json`) lists, and a "
        "listed file only while its sha256 matches; one changed since is kept and named in one warning line",
        tests=(
            f"{WRITES}::test_fresh_removes_only_what_the_marker_lists",
            "tests/sweep/test_sweep.py::test_fresh_deletes_only_what_ropebench_wrote",
        ),
    ),
    BadClass(
        what="`bench gpu --out DIR` over the user's report.md; `bench gpu --save-tokenizer DIR` over the "
        "user's tokenizer.json; `bench wheels --out` or the lm-eval task export deleting the user's files; "
        "`bench ... --json FILE` or `bench run --out FILE` over the user's file",
        rule="every writer goes through one guard (`extend/owned_paths.py`): a path is written only inside a "
        "new or empty folder or one ropebench made (a valid marker); files are staged and moved in only when "
        "none would replace a file ropebench did not write; checked before the work starts. A file named "
        "with --json or `bench run --out` is written when new, or replaced while ropebench wrote it and it "
        "is unchanged (its sha256 kept in the cache folder, no marker in the user's folder)",
        tests=(
            f"{WRITES}::test_bench_gpu_out_never_replaces_a_users_report",
            f"{WRITES}::test_save_tokenizer_never_replaces_a_users_tokenizer",
            f"{WRITES}::test_wheels_folder_removes_only_its_own_wheels",
            f"{WRITES}::test_lm_eval_export_never_removes_a_users_task_file",
            f"{WRITES}::test_bench_json_file_is_new_or_ropebenchs_unchanged",
            f"{WRITES}::test_bench_run_out_never_replaces_a_users_report",
        ),
    ),
    BadClass(
        what="A task entry, model name or variant holding path separators or `..` (tables written outside "
        "the run directory)",
        rule="names made from user text go through `owned_paths.safe_name` (a hash keeps different texts "
        "apart), and every path is checked to stay inside its folder: no `..`, no absolute path, no "
        "symbolic link on the way",
        tests=(
            f"{WRITES}::test_safe_name_stays_in_its_folder",
            f"{WRITES}::test_task_names_with_separators_write_only_inside_the_report",
            f"{WRITES}::test_no_write_leaves_the_folder",
        ),
    ),
    BadClass(
        what="An ownership marker that is empty, unparsable, someone else's, a folder or a symbolic link",
        rule="only a regular file with ropebench's content counts (`owned_paths.read_marker`); a folder made "
        "before the marker counts only by files whose content is ropebench's (records, manifest, lock)",
        tests=(
            f"{WRITES}::test_markers_that_do_not_count_leave_the_folder_the_users",
            f"{WRITES}::test_report_behind_broken_markers_and_links_changes_nothing",
            f"{WRITES}::test_sweep_out_behind_a_broken_marker_is_refused",
        ),
    ),
    BadClass(
        what="A copied report folder whose report.md the user annotated",
        rule="the marker holds each file's sha256: a file ropebench wrote but the user changed since is "
        "kept, and the refusal names it",
        tests=(
            f"{WRITES}::test_a_copied_report_folder_keeps_the_users_annotations",
            f"{WRITES}::test_a_file_changed_since_ropebench_wrote_it_is_kept_and_named",
            "tests/results/test_write_safety.py::test_an_annotated_copy_of_a_report_is_never_replaced",
        ),
    ),
    BadClass(
        what="lm-eval `--output_path`, or `ROPEBENCH_CACHE` (GGUF snapshots, key-token and CPU-dtype "
        "caches), pointed at a folder of the user's",
        rule="the same guard, before the model loads: lm-eval's new files are listed in the folder's "
        "marker; a cache folder of the user's gets no snapshot (one error line) and no cache file",
        tests=(
            f"{WRITES}::test_lm_eval_output_path_of_the_users_is_refused_before_the_model_loads",
            f"{WRITES}::test_lm_eval_cli_refuses_a_users_output_folder_with_one_line",
            f"{WRITES}::test_a_cache_folder_of_the_users_gets_no_snapshot_and_no_cache_file",
        ),
    ),
]

# -- issue 41 items 2 and 3: sizes bounded by their work; every check before the model loads, on every entry
# point; conflicts and types refused with one line
SIZES_TESTS = "tests/project/test_bad_inputs_sizes.py"
CASES += [
    sweep(
        "`-t retrieval.candidates=4499990` (under the answers' pool, over the work)",
        "--tasks",
        "retrieval",
        "-t",
        "retrieval.candidates=4499990",
        expect="over its cost bound 1000",
    ),
    sweep(
        "`-t retrieval.trials=400 -t retrieval.candidates=20` (the demo's 6 shared haystacks x 3 depths: "
        "7200 prompts per length, each scoring 21 answers)",
        "--tasks",
        "retrieval",
        "-t",
        "retrieval.trials=400",
        "-t",
        "retrieval.candidates=20",
        expect="7200 prompts per length, each scoring 1 + candidates=20 answers: 151200, over the cost bound",
    ),
    sweep("`-t perplexity.chunk_size=100000`", "-t", "perplexity.chunk_size=100000", expect="bound 8192"),
    sweep(
        "`-t retrieval.haystack=essay` on a corpus of 10 words",
        "--tasks",
        "retrieval",
        "--lengths",
        "2048",
        "--corpus",
        "{tmp}/tiny.txt",
        "-t",
        "retrieval.haystack=essay",
        expect="has only 10 words, fewer than the 4072 an essay haystack needs",
    ),
    sweep(
        "`-t perplexity.key_tokens={trunc_len: 1500}` with `-o yarn.original_max_position_embeddings=1024`",
        "--methods",
        "yarn",
        "--lengths",
        "2048",
        "-o",
        "yarn.original_max_position_embeddings=1024",
        "-t",
        "perplexity.key_tokens={trunc_len: 1500}",
        expect="is not below the trained context 1024 that yarn x",
    ),
    sweep(
        "`-t perplexity.key_tokens={beta: 0}` (no token can qualify)",
        "-t",
        "perplexity.key_tokens={beta: 0}",
        expect="beta=0 must be below 0",
    ),
    sweep(
        "`ROPEBENCH_MEMORY_GB=inf`",
        expect="is not a positive number of GB",
        env={"ROPEBENCH_MEMORY_GB": "inf"},
    ),
    raw(
        "`ropebench lm-eval run --tasks niah_multikey_1` offline, only an empty cache folder of its essays",
        "run",
        "--model",
        "ropebench",
        "--tasks",
        "niah_multikey_1",
        "--metadata",
        '{"tokenizer": "gpt2"}',
        kind="lm_eval",
        expect="niah_multikey_1 needs the hub dataset 'baber/paul_graham_essays'",
        env={"HF_DATASETS_CACHE": "{tmp}/emptycache", "HF_HUB_CACHE": "{tmp}/emptycache"},
    ),
    bench("gpu --cpu-sizes --remap-length 0", "must be an integer >= 2"),
    bench("gpu --cpu-sizes --lengths 4000000", "cost bound"),
    bench("gpu --cpu-sizes --demo-scale 0", POSITIVE),
    bench("gpu --cpu-sizes --device nosuch", "unknown device 'nosuch'"),
    bench("gpu --cpu-sizes --shapes nosuch", "unknown shape 'nosuch'"),
    bench("gpu --cpu-sizes --remap-length 64 --remap-length 128", "--remap-length is given twice"),
    bench("retrieval-sharing --tiny --trials 2 --trials 4", "--trials is given twice"),
    raw(
        "`ropebench report table RUN --task a --task b`",
        "table",
        "{tmp}/run",
        "--task",
        "passkey",
        "--task",
        "perplexity",
        "--metric",
        "ppl",
        kind="results",
        expect="--task is given twice",
    ),
    raw(
        "`ropebench report` a run directory whose name is not UTF-8",
        "report",
        "{tmp}/r\udcffun",
        kind="results",
        expect="is not valid UTF-8",
    ),
]
TYPES_TESTS = "tests/project/test_bad_inputs_types.py"
DECLARED = "tests/results/test_report_declared.py"
CLASSES += [
    BadClass(
        what="A size option set past what its work allows: retrieval `candidates` just under its pool's "
        "limit (millions of wrong answers drawn before any model loads), trials, haystacks, depths, "
        "generated tokens, documents, chunk and token counts; `bench gpu` lengths and scales",
        rule="every option that sets a size has a cost bound (`tasks/sizes.py`; bench flags: "
        "`at_least(..., high=)`), checked before work starts, the bound and what one unit costs in the "
        "message; retrieval also bounds prompts x (1 + candidates) per length",
        tests=(
            f"{SIZES_TESTS}::test_every_size_option_has_a_cost_bound_named_in_its_message",
            f"{SIZES_TESTS}::test_what_runs_before_the_model_at_the_bound_takes_seconds",
            f"{SIZES_TESTS}::test_retrieval_answers_per_length_are_bounded_by_their_work",
            f"{SIZES_TESTS}::test_retrieval_at_the_candidates_bound_finishes_within_seconds",
        ),
    ),
    BadClass(
        what="Checks that ran after the model loaded: lm-eval tasks whose hub data is missing or only an "
        "empty cache folder, key-token limits against a forced context, the corpus size of essay haystacks",
        rule="checked before the model loads on every entry point: a cache folder counts only with a "
        "finished file in it; the context a patch puts in force is read from a weightless skeleton "
        "(`preflight.context_in_force`); the essay's words are counted from the corpus",
        tests=(
            "tests/lm_eval/test_lm_eval.py::test_a_cached_dataset_counts_only_in_its_cache",
            f"{TYPES_TESTS}::test_an_essay_corpus_too_small_is_refused_before_the_model_loads",
            "tests/project/test_bad_inputs.py::test_bad_input_one_line_exit_2",
        ),
    ),
    BadClass(
        what="Option conflicts: a repeated flag whose first value was dropped, settings under which no token "
        "can qualify (key_tokens beta >= 0), a zero or an infinity that became a default "
        "(`bench gpu --remap-length 0`, `ROPEBENCH_MEMORY_GB=inf`)",
        rule="every single-value flag of `bench` and `report` refuses a second value (`extend/flags.py`; "
        "the sweep's own `_Once`); a zero, a negative or a non-finite size is refused while parsing",
        tests=(
            f"{TYPES_TESTS}::test_a_flag_given_twice_is_refused_by_every_parser_that_refuses_repeats",
            f"{TYPES_TESTS}::test_key_tokens_settings_under_which_no_token_can_qualify_are_refused",
            "tests/extend/test_refuse_before_load.py::test_check_fits_names_the_estimate_and_the_largest_length",
        ),
    ),
    BadClass(
        what="Tracebacks: `bench gpu` options (negative lengths, an unknown device or shape), `report` on a "
        "run path that is not UTF-8; bare Python errors from the results API on wrong argument types",
        rule="`bench gpu` checks its flags before any section runs; a run path is checked to be UTF-8 text "
        "where the results API takes it; the API's arguments are checked where a call enters it "
        "(`results/arguments.py`) and raise ResultsError",
        tests=(
            f"{TYPES_TESTS}::test_the_results_api_raises_its_own_error_for_wrong_types",
            f"{TYPES_TESTS}::test_a_run_path_that_is_not_utf8_is_refused_with_one_line",
        ),
    ),
    BadClass(
        what="A value outside its metric's declared range (a 0/1 rate of 1.5) still tabulated and paired",
        rule="left out of every table, comparison, plot and reach where ok rows are selected "
        "(`results/ranges.py`), and the report counts what it left out",
        tests=(
            f"{DECLARED}::test_values_outside_the_declared_range_are_left_out_and_counted",
            "tests/results/test_metric_meaning.py::test_out_of_range_names_rows_that_break_the_declared_range",
        ),
    ),
]
ISSUE_41_FILES = {
    # what an interrupted download leaves: the folders, a ref, a lock, no data
    "emptycache/datasets--baber--paul_graham_essays/refs/main": "abc\n",
    "emptycache/baber___paul_graham_essays/default.lock": "",
}

WRITE_SAFETY_FILES = {
    "intkey.yaml": "model: smollm2-135m\nmethods: [plain]\ntasks: [perplexity]\nlengths: [64]\n1: x\n",
    "exit_plugin.py": "import sys\nsys.exit(3)\n",
    "kbi_plugin.py": "raise KeyboardInterrupt\n",
    "rd_foreign/records.jsonl": '{"id": 1, "score": 0.5}\n{"id": 2, "score": 0.7}\n',
    "idless/records.jsonl": '{"run": "r", "cell": "a", "task": "perplexity", "metric": "ppl", "value": 9.5}\n'
    '{"run": "r", "cell": "b", "task": "perplexity", "metric": "ppl", "value": 8.1}\n',
    "ownrun/tables/perplexity_ppl.md": "my own table\n",
    "marker_empty/.ropebench-owned.json": "",
    "marker_empty/notes.md": "my notes\n",
    "marker_bad/.ropebench-owned.json": "{not json",
    "marker_bad/report.md": "my report\n",
}


def synthetic_records(*args, **kwargs) -> list[dict]:
    """Rows of tests/results/synthetic.py's synthetic sweep (test data, not in the product), loaded by path:
    this file also runs as a script, without the conftest's fixtures."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ropebench_tests_synthetic", ROOT / "tests/results/synthetic.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic_records(*args, **kwargs)


def make_write_safety_fixtures(tmp: Path) -> None:
    """Run directories (a sweep's lock file marks them) with damaged or foreign records, a symlink loop, a
    directory that may not be read, and a run whose tables/ holds a file of the user's."""
    for name, text in WRITE_SAFETY_FILES.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    row = {
        "task": "perplexity",
        "metric": "ppl",
        "value": 1.0,
        "cell": ["a", "list"],
        "session": "s",
        "written": 1,
    }
    (tmp / "rd_celllist").mkdir()
    (tmp / "rd_celllist" / "records.jsonl").write_text(json.dumps(row) + "\n")
    (tmp / "rd_deep").mkdir()
    (tmp / "rd_deep" / "records.jsonl").write_text("[" * 200000 + "]" * 200000 + "\n")
    (tmp / "rd_dir" / "records.jsonl").mkdir(parents=True)
    for d in ("rd_dir", "rd_celllist", "rd_deep", "rd_foreign"):
        (tmp / d / ".ropebench.lock").touch()
    (tmp / "loop").symlink_to(tmp / "loop")
    (tmp / "noread" / "sub").mkdir(parents=True)
    from ropebench.results.store import RecordWriter

    RecordWriter(tmp / "ownrun").write(synthetic_records("ownrun", tasks=("perplexity",)))


@contextlib.contextmanager
def unreadable_parent(tmp: Path):
    """`noread/` may not be read (chmod 000). Root is not stopped by permissions, so for root os.stat refuses
    paths below it as the kernel refuses them for any other user."""
    noread = tmp / "noread"
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(os.fspath(path)).startswith(str(noread) + os.sep):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    noread.chmod(0)
    if os.geteuid() == 0:
        os.stat = stat
    try:
        yield
    finally:
        os.stat = real_stat
        noread.chmod(0o755)


# ---------------------------------------------------------------------------------------------- fixtures
FILES = {
    "bad.yaml": "model: [smollm2-135m\nmethods: plain\n",
    "list.yaml": "- plain\n- yarn\n",
    "typo.yaml": "model: smollm2-135m\nmethods: [plain]\nlenghts: [1024]\ntasks: [perplexity]\n",
    "dup.yaml": "model: smollm2-135m\nmethods: [plain]\ntasks: [perplexity]\nlengths: [64]\n"
    "methods: [yarn]\n",
    "empty.yaml": "model: smollm2-135m\nmethods: []\ntasks: {perplexity: {lengths: [64]}}\n",
    "factor.yaml": "model: smollm2-135m\nmethods: [{method: yarn, factor: 2}]\ntasks: [perplexity]\n"
    "lengths: [64]\n",
    "nested.yaml": "model: smollm2-135m\nmethods: [[1, 2]]\ntasks: [perplexity]\nlengths: [64]\n",
    "options.yaml": "model: smollm2-135m\nmethods: [plain]\noptions: 3\ntasks: [perplexity]\nlengths: [64]\n",
    "perlength.yaml": "model: smollm2-135m\nmethods: [plain]\ntasks: {passkey: {per_length: yes please}}\n"
    "lengths: [64]\n",
    "trust.yaml": "model: smollm2-135m\nmethods: [plain]\ntasks: [perplexity]\nlengths: [64]\n"
    "trust_remote_code: maybe\n",
    "nolengths.yaml": "model: smollm2-135m\nmethods: [plain]\ntasks: [perplexity]\n",
    "afile": "x",
    "fake.gguf": "this is not a model\n",
    "empty.txt": "",
    "pdfs/paper.pdf": "%PDF-1.4",
    "mixed/a.txt": "some text",
    "mixed/b.jsonl": '{"text": "x"}\n',
    "mine/logs/lab-notebook.txt": "my notes",
    "mine/report.md": "my report",
    "syntax_plugin.py": "def broken(:\n    pass\n",
    "raising_plugin.py": "x = 1\ny = x / 0\n",
    "damaged/records.jsonl": "{not json\nalso not json\n",
    "nofield.jsonl": '{"body": "a document"}\n',
    "broken.jsonl": '{"text": "fine"}\n{"text": "cut\n',
    "tiny.txt": "one two three four five six seven eight nine ten",
    "emptycfg/config.json": "{}",
    "optyarm.yaml": "model: smollm2-135m\nmethods: [yarn]\noptions: {yarm: {beta_fast: 16}}\n"
    "tasks: [perplexity]\nlengths: [64]\n",
}
FILES.update(ISSUE_41_FILES)
BINARY = {
    "binary.txt": bytes(range(256)) * 8,
    "utf16.txt": "a document in UTF-16\n".encode("utf-16"),
    "spaces.txt": b" \n\t" * 34000,
}


def _truncated_gguf(tmp: Path) -> None:
    """The embedded GGUF's first 64 KB: the magic bytes are right, the metadata is cut."""
    from ropebench import extend

    with open(extend.embedded_gguf(), "rb") as f:
        (tmp / "truncated.gguf").write_bytes(f.read(1 << 16))


def make_fixtures(tmp: Path) -> None:
    for name, text in FILES.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name, data in BINARY.items():
        (tmp / name).write_bytes(data)
    _truncated_gguf(tmp)
    (tmp / "emptydir").mkdir()
    (tmp / "fake" / "records.jsonl").mkdir(parents=True)
    from ropebench.results.store import RecordWriter

    RecordWriter(tmp / "run").write(synthetic_records("run"))
    make_write_safety_fixtures(tmp)


@contextlib.contextmanager
def no_model_loads():
    """Any case that reaches a model load fails: every input must be rejected before that."""
    from ropebench import extend

    def refuse(*a, **k):
        raise AssertionError("a model was loaded for a bad input")

    saved = extend.load
    extend.load = refuse
    try:
        yield
    finally:
        extend.load = saved


@contextlib.contextmanager
def environ(changes: dict):
    saved = {k: os.environ.get(k) for k in changes}
    for k, v in changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_case(case: Case, tmp: Path) -> tuple[int | None, str]:
    """(exit code, stderr) of one case; for API cases (None, the ExtendError's message)."""
    make_fixtures(tmp)
    args = [a.replace("{tmp}", str(tmp)) if isinstance(a, str) else a for a in case.args]
    env = {k: v.replace("{tmp}", str(tmp)) if isinstance(v, str) else v for k, v in case.env.items()}
    err = io.StringIO()
    holder = None
    if case.kind == "sweep" and "locked" in str(args):
        from ropebench.sweep_lib.rundir import RunLock

        (tmp / "locked").mkdir()
        holder = RunLock(tmp / "locked").acquire()  # as if another sweep were running there
    try:
        with (
            environ(env),
            no_model_loads(),
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
            unreadable_parent(tmp) if "noread" in str(args) else contextlib.nullcontext(),
        ):
            if case.kind == "sweep":
                from ropebench import sweep_lib

                code = sweep_lib.main(args)
            elif case.kind == "results":
                from ropebench.results.__main__ import main

                try:
                    code = main(args)
                except SystemExit as e:
                    code = e.code
            elif case.kind in ("lm_eval", "ropebench"):  # `ropebench lm-eval ...`, `ropebench ...`
                from ropebench.cli import main

                code = main(["lm-eval", *args] if case.kind == "lm_eval" else list(args))
            else:
                from ropebench import extend
                from transformers import LlamaConfig, LlamaForCausalLM

                # any small Llama: these cases are refused before a forward (run as a script too, so
                # built here, not taken from a fixture)
                config = LlamaConfig(
                    vocab_size=128,
                    hidden_size=64,
                    intermediate_size=128,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    max_position_embeddings=256,
                )
                model = LlamaForCausalLM(config).eval()
                try:
                    extend.patch(model, args[0], 2, **args[1])
                except extend.ExtendError as e:
                    return None, f"error: {e}"
                return None, "no error"
    finally:
        if holder is not None:
            holder.release()
    return code, err.getvalue()


def normalize(text: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "DIR")
    return re.sub(r"pid \d+ on \S+, since [\d\- :]+ UTC", "pid N on HOST, since TIME", text)


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("case", CASES, ids=[c.shown for c in CASES])
def test_bad_input_one_line_exit_2(case, tmp_path):
    code, err = run_case(case, tmp_path)
    lines = [
        x for x in err.strip().splitlines() if not x.startswith("warning: ")
    ]  # e.g. a damaged line dropped
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error: ") and " — " in line and "Traceback" not in err, line
    assert case.expect in line, line
    if case.kind != "api":
        assert code == case.code == 2, (code, line)
    if case.kind == "sweep" and not case.out_stays:  # a rejected input leaves no run directory behind
        assert not (tmp_path / "o").exists() and not (tmp_path / "o2").exists()
    if "mine" in str(case.args):  # nothing of the user's was deleted
        assert (tmp_path / "mine" / "logs" / "lab-notebook.txt").read_text() == "my notes"
        assert (tmp_path / "mine" / "report.md").read_text() == "my report"


def test_enough_cases():
    assert len(CASES) >= 60 and len({c.shown for c in CASES}) == len(CASES)


def docs_table(tmp_root: Path) -> str:
    rows = ["| input | message | exit code |", "|---|---|---|"]
    for i, case in enumerate(CASES):
        tmp = tmp_root / f"case{i}"
        tmp.mkdir(parents=True)
        code, err = run_case(case, tmp)
        lines = [x for x in err.strip().splitlines() if not x.startswith("warning: ")]
        message = normalize(lines[0] if lines else "", tmp).replace("|", "\\|")
        shown = case.shown.replace("|", "\\|")
        rows.append(f"| {shown} | {message} | {'ExtendError' if code is None else code} |")
    return "\n".join(rows)


def classes_table() -> str:
    """The classes of bad input, the rule that covers each and its tests (docs/bad-input.md)."""
    rows = [CLASSES_HEAD, "| class | rule | tests |", "|---|---|---|"]
    for c in CLASSES:
        names = "<br>".join(f"`{name}` ({path.removeprefix('tests/')})" for path, name in _split(c.tests))
        rows.append(f"| {c.what} | {c.rule} | {names} |".replace("\n", " "))
    return "\n".join(rows) + "\n\n## Every case\n\n"


CLASSES_HEAD = "## The classes and the rule that covers each\n"


def _split(tests: tuple[str, ...]) -> list[tuple[str, str]]:
    return [tuple(t.split("::")) for t in tests]


def test_every_class_names_tests_that_exist():
    for c in CLASSES:
        assert c.what and c.rule and c.tests, c.what
        for path, name in _split(c.tests):
            assert f"def {name}(" in (ROOT / path).read_text(), (path, name)


def test_docs_classes_match():
    hint = "docs/bad-input.md is out of date — run `python tests/project/test_bad_inputs.py --write-docs`"
    assert classes_table() in DOC.read_text(), hint


def _docs_rows() -> dict[str, tuple[str, str]]:
    assert DOC.is_file(), f"{DOC} is missing — run `python tests/project/test_bad_inputs.py --write-docs`"
    text = DOC.read_text()
    text = text[text.index("| input | message | exit code |") :]  # the cases' table (the classes' is above)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    rows = {}
    for line in table[1:]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows[cells[0].replace("\\|", "|")] = (cells[1].replace("\\|", "|"), cells[2])
    return rows


def test_docs_table_matches_the_cases():
    rows = _docs_rows()
    hint = "docs/bad-input.md is out of date — run `python tests/project/test_bad_inputs.py --write-docs`"
    assert list(rows) == [c.shown for c in CASES], hint
    for case in CASES:
        message, code = rows[case.shown]
        assert case.expect in message, (hint, case.shown)
        assert code == ("ExtendError" if case.kind == "api" else str(case.code)), (hint, case.shown)


# ---------------------------------------------------------------------------------------------- accepted
def test_accepted_inputs_that_used_to_be_refused_or_ignored(tmp_path):
    """`--factors 1e3` is a positive number; `1e3` in a YAML file too."""
    from ropebench.sweep_lib import config as C
    from ropebench.sweep_lib.cli import load_config, parser

    def parse(argv):
        return load_config(parser().parse_args(argv))

    cfg = parse(
        [
            "--model",
            "smollm2-135m",
            "--methods",
            "yarn",
            "--factors",
            "1e3",
            "2E0",
            "--tasks",
            "perplexity",
            "--lengths",
            "64",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert cfg["methods"][0]["factors"] == [2.0, 1000.0]
    assert C.parse_value("1e3") == 1000.0 and C.parse_value("7") == 7 and C.parse_value("[1, 2]") == [1, 2]
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "model: smollm2-135m\nmethods: [yarn]\nfactors: [1e3]\ntasks: [perplexity]\nlengths: [64]\n"
    )
    assert parse(["--config", str(conf)])["methods"][0]["factors"] == [1000.0]
    # --lengths on the command line still overrides a config file's task lengths (only -t vs
    # --lengths conflict)
    conf.write_text("model: smollm2-135m\nmethods: [plain]\ntasks: {passkey: {lengths: [4096]}}\n")
    assert parse(["--config", str(conf), "--lengths", "2048"])["tasks"]["passkey"]["lengths"] == [2048]
    assert not (tmp_path / "o").exists()


def test_corpus_under_home_is_found_by_the_check_and_the_loader(tmp_path, monkeypatch, capsys):
    """`~/x.txt` (a config file or -t value is not expanded by a shell): the check the sweep runs and the
    loader the task runs expand it the same way, so a corpus the sweep accepts is the corpus a cell reads."""
    from ropebench import sweep_lib
    from ropebench.tasks import data

    monkeypatch.setenv("HOME", str(tmp_path))
    text = "a document under the home directory, " * 3  # long enough for --lengths 64 (checked in bytes)
    (tmp_path / "x.txt").write_text(text)
    data.check_corpus("~/x.txt")
    assert [d.text for d in data.load_corpus("~/x.txt")] == [text]
    with pytest.raises(data.TaskError, match="unknown corpus '~/nope.txt'"):
        data.check_corpus("~/nope.txt")
    assert (
        sweep_lib.main(
            [
                "--model",
                "smollm2-135m",
                "--methods",
                "plain",
                "--tasks",
                "perplexity",
                "--lengths",
                "64",
                "--corpus",
                "~/x.txt",
                "--out",
                str(tmp_path / "o"),
                "--dry-run",
            ]
        )
        == 0
    )
    assert "perplexity ~/x.txt L=64" in capsys.readouterr().out


def test_records_with_odd_bookkeeping_still_report(tmp_path):
    """A hand-edited `"written": "yesterday"` is not a traceback: the row sorts as oldest."""
    from ropebench import results
    from ropebench.results.store import RecordWriter

    RecordWriter(tmp_path).write(synthetic_records("run"))
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["written"] = "yesterday"
    lines[0] = json.dumps(row)
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(results.ResultsWarning, match=f"cell {row['cell']}: .* rows on disk"):
        df = results.load(tmp_path)  # the edited row no longer matches its write: that cell is not trusted
    assert set(df["cell"]) == {json.loads(x)["cell"] for x in lines} - {row["cell"]}
    from ropebench.results.__main__ import main

    assert main(["report", str(tmp_path), "--out", str(tmp_path / "rep")]) == 0


def test_cli_runs_overriding_model_show_the_grid(tmp_path, capsys):
    """A run that inherits the demo's task options (num_docs, trials, depths) by overriding only --model says
    so first (here as a dry run)."""
    from ropebench import sweep_lib

    assert sweep_lib.main(["--model", "smollm2-135m", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "grid (options inherited from" in err and "demo.yaml" in err
    assert re.search(r"perplexity: lengths \[.*\]; .*num_docs=\d+", err)
    assert re.search(r"passkey: lengths \[.*\]; .*depths=.*trials=\d+", err) or re.search(
        r"passkey: lengths \[.*\]; .*trials=\d+.*depths=", err
    )
    assert not (tmp_path / "o").exists()


def test_plugin_errors_in_a_real_process(tmp_path):
    """The real CLI, end to end: one line, exit 2, no traceback (also for a plugin that raises)."""
    import subprocess

    make_fixtures(tmp_path)
    for plugin in ("syntax_plugin.py", "raising_plugin.py"):
        p = subprocess.run(
            check=False,
            args=[
                sys.executable,
                str(ROOT / "scripts" / "sweep.py"),
                "--plugin",
                str(tmp_path / plugin),
                "--model",
                "smollm2-135m",
                "--tasks",
                "perplexity",
                "--lengths",
                "64",
                "--out",
                str(tmp_path / "o"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"),
        )
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: plugin"), (
            p.stderr
        )
        assert not (tmp_path / "o").exists()


if __name__ == "__main__" and "--write-docs" in sys.argv:
    import tempfile

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as d:
        table = docs_table(Path(d))
    DOC.write_text(f"{DOC_HEAD}{classes_table()}{table}\n")
    print(f"wrote {len(CASES)} rows to {DOC}")


@pytest.mark.parametrize(
    "task, options",
    [("perplexity", {}), ("passkey", {"haystack": "corpus"}), ("classification", {"label": "label"})],
)
def test_suites_name_an_empty_corpus_not_the_lengths(task, options, tmp_path, smollm2_tokenizer):
    """Called directly (no sweep): an empty corpus file is named as empty, not "use shorter lengths"."""
    from ropebench import tasks

    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(tasks.TaskError, match="has no documents") as info:
        tasks.TASKS[task](
            None, smollm2_tokenizer, lengths=[64], corpus=str(tmp_path / "e.txt"), progress=False, **options
        )
    assert "shorter" not in str(info.value)


def test_suite_rules_name_real_options():
    """tasks/checks.py restates the tasks' own checks: every rule must still name an option of its task, and
    a task's defaults must pass its rules (so the pre-check never refuses what the task accepts by
    default)."""
    import inspect

    from ropebench import tasks
    from ropebench.tasks.checks import RULES, check_task_options

    for task, rules in RULES.items():
        params = inspect.signature(tasks.TASKS[task]).parameters
        assert set(rules) <= set(params), (task, set(rules) - set(params))
        defaults = {k: params[k].default for k in rules if params[k].default is not inspect.Parameter.empty}
        defaults = {k: (list(v) if isinstance(v, tuple) else v) for k, v in defaults.items()}
        check_task_options(task, tasks.TASKS[task], defaults)
