"""Issue 41 item 2: every task option that sets the size of a search, a sample or a tensor has a cost bound,
is refused above it before the model loads with the bound in the message, and a run at the bound finishes or
is refused within seconds (a retrieval `candidates` just under its pool's limit used to draw millions of
wrong answers, past 1.7 GB, before any model loaded)."""

from __future__ import annotations

import time

import pytest
from ropebench import tasks
from ropebench.benchmarks.cli import COMMANDS as BENCH_COMMANDS
from ropebench.tasks.checks import check_lengths_fit, check_task
from ropebench.tasks.errors import TaskError
from ropebench.tasks.kit import by_default, task_spec

# "within seconds" on the loaded 2-core CI machine (the checks at the bound take about 2 s there)
SECONDS = 30


def size_options() -> list[tuple[str, str, bool]]:
    """(task, option, is a list) for every option of every task that sets a size, found from what the
    options accept, not from their bounds: a count (the check takes the integer 1, or the default is an
    integer) or a list of numbers (one prompt per entry)."""
    found = []
    for name, run in tasks.TASKS.items():
        spec = task_spec(name, run)
        for key, default in spec.defaults.items():
            rule = spec.options.get(key)
            takes_one = (rule(1) if rule is not None else by_default(default, 1)) is None
            if takes_one and not isinstance(default, (bool, str)):
                found.append((name, key, isinstance(default, (list, tuple))))
    return found


SIZES = size_options()


def check_of(task: str, option: str):
    return task_spec(task, tasks.TASKS[task]).options.get(option)


def value_of(size: int, listed: bool):
    """A valid value of `size` units: the integer, or `size` distinct fractions in [0, 1] for a list."""
    return [i / max(size - 1, 1) for i in range(size)] if listed else size


def test_the_size_options_are_found():
    """The known ones, as a check that the search above finds sizes at all."""
    names = {(t, o) for t, o, _ in SIZES}
    assert {("retrieval", "candidates"), ("retrieval", "trials"), ("passkey", "depths")} <= names
    assert {("perplexity", "chunk_size"), ("classification", "num_docs")} <= names


@pytest.mark.parametrize("task, option, listed", SIZES, ids=[f"{t}.{o}" for t, o, _ in SIZES])
def test_every_size_option_has_a_cost_bound_named_in_its_message(task, option, listed):
    check = check_of(task, option)
    bound = getattr(check, "bound", None)
    assert isinstance(bound, int) and bound > 0, f"{task} option {option} sets a size without a cost bound"
    assert check(value_of(bound, listed)) is None  # the bound itself is allowed
    over = value_of(bound + 1, listed)
    with pytest.raises(TaskError) as info:
        check_task(task, {option: over})
    line = str(info.value)
    assert "cost bound" in line and str(bound) in line and "\n" not in line
    given = str(len(over) if listed else over)
    assert given not in line.split(" — ")[1]  # the advice never repeats the value given
    with pytest.raises(TaskError):  # far above: refused the same way, at once
        check_task(task, {option: value_of(10_000, True) if listed else 10**12})


COMPANIONS = {  # options a size needs beside it to be taken at all
    ("retrieval", "haystacks"): {"shared_haystack": True, "trials": 1, "depths": [0.0]},
    ("perplexity", "stride"): {"protocol": "sliding"},
    ("perplexity", "span"): {"protocol": "sliding"},
}


@pytest.mark.parametrize("task, option, listed", SIZES, ids=[f"{t}.{o}" for t, o, _ in SIZES])
def test_what_runs_before_the_model_at_the_bound_takes_seconds(task, option, listed, tok):
    """The sweep's checks before a model loads (the options, then the lengths against the tokenizer and the
    corpus, which draws every retrieval scene) at each bound: they finish, or refuse, within seconds."""
    check = check_of(task, option)
    options = {**COMPANIONS.get((task, option), {}), option: value_of(check.bound, listed)}
    start = time.perf_counter()
    try:
        check_task(task, options)
        check_lengths_fit(task, [4096], options, "sotu", tok)
    except TaskError as e:
        assert "\n" not in str(e)
    assert time.perf_counter() - start < SECONDS


@pytest.mark.parametrize(
    "options",
    [
        {"candidates": 1000},  # default: 2 trials x 3 depths x 1 variant = 6 prompts
        {"trials": 100, "candidates": 400, "variants": "vt"},
        {"trials": 10, "depths": [0.0], "variants": ["niah_single", "vt"], "candidates": 9999},
        {"trials": 5000, "depths": [0.0, 1.0], "candidates": 9},
    ],
)
def test_retrieval_answers_per_length_are_bounded_by_their_work(options):
    """Every prompt scores 1 + candidates answers (one forward each), and every scene's answers are drawn and
    tokenized before the model loads: prompts x (1 + candidates) <= 100000, whatever each option allows."""
    prompts = (
        options.get("trials", 2)
        * len(options.get("depths", [0, 0.5, 1]))
        * (1 if isinstance(options.get("variants", "x"), str) else len(options["variants"]))
    )
    candidates = options["candidates"]
    if candidates > 1000:  # its own bound first
        with pytest.raises(TaskError, match="over its cost bound 1000"):
            check_task("retrieval", options)
        return
    if prompts * (1 + candidates) <= 100_000:
        check_task("retrieval", options)
        return
    with pytest.raises(TaskError) as info:
        check_task("retrieval", options)
    most, line = 100_000 // prompts - 1, str(info.value)
    assert "over the cost bound 100000" in line and f"{prompts * (1 + candidates)}" in line
    assert f"use candidates <= {most}" in line
    check_task("retrieval", {**options, "candidates": most})  # the advice is taken


def test_retrieval_at_the_candidates_bound_finishes_within_seconds(tiny_model, tok):
    """A run at the bound: one prompt scoring its answer and 1000 wrong ones (1001 forwards on a tiny
    model), from the options to the rows."""
    start = time.perf_counter()
    rows = tasks.TASKS["retrieval"](
        tiny_model, tok, lengths=[320], depths=[0.0], trials=1, candidates=1000, progress=False
    )
    assert time.perf_counter() - start < SECONDS
    chance = [r["value"] for r in rows if r["metric"] == "chance"]
    assert chance == [1 / 1001]  # every candidate was ranked


# -- the benchmark commands' integer flags: every one has a cost bound ------------------------------------
BENCH_PROBES = ["chunk_size", "continuation_blocks", "passkey_floor", "passkey_probe", "profile_forward"]


def test_a_bench_parser_refuses_to_declare_an_unbounded_integer_flag():
    from ropebench.benchmarks.errors import ArgumentParser, at_least

    p = ArgumentParser(prog="x")
    with pytest.raises(TypeError, match="--n: an integer flag needs a cost bound"):
        p.add_argument("--n", type=int)
    with pytest.raises(TypeError, match="--m: an integer flag needs a cost bound"):
        p.add_argument("--m", type=at_least(1))
    p.add_argument("--k", type=at_least(1, 2, high=9, cost="one unit"))  # bounded: declared


@pytest.mark.parametrize("name", sorted(BENCH_COMMANDS))
def test_every_bench_command_declares_only_bounded_integer_flags(name):
    """Declaring an unbounded integer flag raises while the parser is built, so `--help` of every command
    (and of every probe, below) proves each integer flag has its cost bound."""
    from ropebench.benchmarks import cli

    assert cli.main([name, "--help"]) == 0


@pytest.mark.parametrize("probe", BENCH_PROBES)
def test_every_probe_declares_only_bounded_integer_flags(probe):
    import importlib

    module = importlib.import_module(f"ropebench.benchmarks.probes.{probe}")
    with pytest.raises(SystemExit) as done:
        module.main(["--help"])
    assert done.value.code == 0


@pytest.mark.parametrize(
    "argv, bound",
    [
        (["cpu-dtype", "--tokens", str((1 << 20) + 1)], "2 to 1048576"),
        (["retrieval-sharing", "--trials", "10001"], "1 to 10000"),
        (["longppl-bias", "--num-docs", "1001"], "1 to 1000"),
        (["run", "--repeats", "101"], "1 to 100"),
        (["compute-floor", "--gemm-size", "16385"], "64 to 16384"),
    ],
)
def test_a_bench_size_past_its_bound_is_refused_while_parsing(argv, bound, capsys):
    from ropebench.benchmarks import cli

    started = time.perf_counter()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("error: argument ") and f"must be {bound}, its cost bound" in err and "\n" not in err
    )
    assert time.perf_counter() - started < 10  # refused while parsing, before any model or measurement
