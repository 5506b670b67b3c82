"""Issue 41 item 2: every task option that sets the size of a search, a sample or a tensor has a cost bound,
is refused above it before the model loads with the bound in the message, and a run at the bound finishes or
is refused within seconds (a retrieval `candidates` just under its pool's limit used to draw millions of
wrong answers, past 1.7 GB, before any model loaded)."""

from __future__ import annotations

import time

import pytest
from ropebench import tasks
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
