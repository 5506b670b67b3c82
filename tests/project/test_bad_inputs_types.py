"""Issue 41 item 3: the results API raises the project's error class for wrong argument types (never a bare
TypeError or AttributeError from pandas or pathlib), a flag given twice is refused instead of its first
value dropped, and the checks that used to run after the model loaded run before it."""

from __future__ import annotations

import argparse

import pytest
from ropebench import results
from ropebench.extend.errors import RopebenchError

WRONG = [3, 2.5, ["a", 1], {"a": 1}, b"runs", object()]


@pytest.fixture(scope="module")
def run(tmp_path_factory, synthetic_records):
    out = tmp_path_factory.mktemp("types") / "run"
    results.RecordWriter(out).write(synthetic_records("run"))
    return out


CALLS = {
    "load": lambda df, run, v: results.load(v),
    "load([v])": lambda df, run, v: results.load([v]),
    "report": lambda df, run, v: results.report(v),
    "report out": lambda df, run, v: results.report(run, out=v),
    "report trained_context": lambda df, run, v: results.report(run, out=run.parent / "o", trained_context=v),
    "table rows": lambda df, run, v: results.table(df, "passkey", "correct", rows=v),
    "table cols": lambda df, run, v: results.table(df, "passkey", "correct", cols=v),
    "compare rows": lambda df, run, v: results.compare(df, "passkey", "correct", rows=v),
    "to_markdown table": lambda df, run, v: results.to_markdown(v),
    "to_markdown path": lambda df, run, v: results.to_markdown(results.table(df, "passkey", "correct"), v),
    "to_csv table": lambda df, run, v: results.to_csv(v),
    "to_latex table": lambda df, run, v: results.to_latex(v),
    "write_table": lambda df, run, v: results.write_table(v, run.parent / "t"),
    "from_lm_eval": lambda df, run, v: results.from_lm_eval(v),
    "RecordWriter": lambda df, run, v: results.RecordWriter(v),
    "summary trained_context": lambda df, run, v: results.summary(df, trained_context=v),
}


# a trained context may be a number of tokens or {model: tokens}: wrong are the other types
NOT_A_CONTEXT = [["a"], b"8192", object(), 2.5, {"m": "8k"}]


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_the_results_api_raises_its_own_error_for_wrong_types(call, run):
    df = results.load(run)
    for value in NOT_A_CONTEXT if call.endswith("trained_context") else WRONG:
        with pytest.raises(RopebenchError) as info:
            CALLS[call](df, run, value)
        assert isinstance(info.value, results.ResultsError) and "\n" not in str(info.value), (call, value)
        assert " — " in str(info.value), (call, value)


def test_a_run_path_that_is_not_utf8_is_refused_with_one_line(tmp_path):
    bad = str(tmp_path / "r\udcffun")  # a byte 0xff in the name, as the file system hands it to Python
    with pytest.raises(results.ResultsError, match="is not valid UTF-8"):
        results.load(bad)
    with pytest.raises(results.ResultsError, match="is not valid UTF-8"):
        results.report(bad)


def test_a_flag_given_twice_is_refused_by_every_parser_that_refuses_repeats():
    from ropebench.extend.flags import forget_given, refuse_repeats

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise ValueError(message)

    p = refuse_repeats(Parser())
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--depths", nargs="+", type=float)
    p.add_argument("--tag", action="append")  # collects: every value kept
    p.add_argument("--quick", action="store_true")
    args = forget_given(p.parse_args(["--trials", "4", "--tag", "a", "--tag", "b", "--quick", "--quick"]))
    assert vars(args) == {"trials": 4, "depths": None, "tag": ["a", "b"], "quick": True}
    for argv, flag in (
        (["--trials", "2", "--trials", "8"], "--trials"),
        (["--depths", "0", "--depths", "1"], "--depths"),
    ):
        with pytest.raises(ValueError, match=f"{flag} is given twice"):
            p.parse_args(argv)
    assert p.parse_args(["--trials", "8"]).trials == 8  # each parse counts afresh


def test_key_tokens_settings_under_which_no_token_can_qualify_are_refused():
    """A key token's long-context loss must be below -beta: with beta >= 0 none can be (a loss is >= 0)."""
    from ropebench.tasks.checks import check_task
    from ropebench.tasks.errors import TaskError

    for beta in (0, 0.0, 1.5):
        with pytest.raises(TaskError, match=f"beta={beta!r} must be below 0"):
            check_task("perplexity", {"key_tokens": {"beta": beta}})
    check_task("perplexity", {"key_tokens": {"beta": -0.5}})


def test_an_essay_corpus_too_small_is_refused_before_the_model_loads(tmp_path):
    """Without a tokenizer (the count needs none): the words an essay haystack needs, counted from the
    corpus; a noise haystack needs none."""
    from ropebench.tasks.checks import check_lengths_fit
    from ropebench.tasks.errors import TaskError

    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(["word"] * 3000) + "\n")
    need = int(1.5 * 2048) + 2 * 500  # the run's rule: 1.5 words per token of the longest length + two steps
    with pytest.raises(TaskError, match=f"has only 3000 words, fewer than the {need}"):
        check_lengths_fit("retrieval", [1024, 2048], {"haystack": "essay"}, str(corpus))
    check_lengths_fit("retrieval", [2048], {"haystack": "noise"}, str(corpus))
    check_lengths_fit("retrieval", [128], {"haystack": "essay"}, str(corpus))  # 1192 words needed: enough
