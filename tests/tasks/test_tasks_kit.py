"""The task kit (tasks/kit.py): one declaration per task, read by the pre-load checks, the sweep and the
task itself; the shared cell runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from ropebench import tasks
from ropebench.tasks import TaskError
from ropebench.tasks.kit import declare, positive, run_cells

ROOT = Path(__file__).resolve().parents[2]


def _toy_task():
    @declare(
        "toy",
        options={"trials": positive},
        metrics={"hit": "0/1", "size": "tokens"},
        pass_fail=("hit",),
        tables=(("hit", "toy hits"),),
        extra_tokens=lambda options: 7 * options.get("trials", 1),
        register=False,
    )
    def run(model, tokenizer, *, lengths, trials=1, label="x", seed=0, progress=True):
        return [{"lengths": lengths, "trials": trials}]

    return run


def test_a_declared_suite_is_checked_everywhere_from_one_declaration(monkeypatch):
    """Registered with one line, a task's options are checked before the model loads (tasks.checks), at the
    call itself (model None: never touched), and the sweep reads its tables and extra tokens."""
    from ropebench.tasks.checks import check_task, extra_tokens

    run = _toy_task()
    monkeypatch.setitem(tasks.TASKS, "toy", run)
    check_task("toy", {"trials": 2, "label": "y"})
    with pytest.raises(TaskError, match=r"toy option trials=0 must be a positive integer"):
        check_task("toy", {"trials": 0})
    with pytest.raises(
        TaskError, match=r"toy option label=3 must be a string"
    ):  # undeclared: its default's type
        check_task("toy", {"label": 3})
    with pytest.raises(TaskError, match=r"unknown option 'trails' for task 'toy' — did you mean trials"):
        check_task("toy", {"trails": 2})
    with pytest.raises(TaskError, match="trials=-1"):
        run(None, None, lengths=[8], trials=-1)
    assert run(None, None, lengths=[8], trials=3) == [{"lengths": [8], "trials": 3}]
    assert extra_tokens("toy", {"trials": 2}) == 14
    from ropebench.sweep_lib.printout import main_tables

    assert ("toy", "hit", "toy hits") in main_tables() and (
        "passkey",
        "correct",
        "passkey retrieval accuracy",
    ) in main_tables()


def test_a_declaration_naming_what_the_suite_lacks_fails_at_import():
    with pytest.raises(TypeError, match="trails"):

        @declare("bad", options={"trails": positive}, metrics={})
        def run(model, tokenizer, *, lengths, trials=1, seed=0, progress=True):
            return []

    with pytest.raises(TypeError, match="missing"):

        @declare("bad", options={}, metrics={"hit": "0/1"}, pass_fail=("missing",))
        def run2(model, tokenizer, *, lengths, seed=0, progress=True):
            return []


def test_every_builtin_suite_is_declared_and_its_defaults_pass():
    from ropebench.tasks.kit import spec_of

    for name, run in tasks.TASKS.items():
        spec = spec_of(run)
        assert spec is not None and spec.name == name, name
        assert set(spec.options) <= set(spec.defaults), name
        defaults = {
            k: (list(v) if isinstance(v, tuple) else v) for k, v in spec.defaults.items() if k in spec.options
        }
        spec.check(defaults)
        assert spec.pass_fail <= set(spec.metrics) and spec.tables, name


def test_plugin_suite_without_declaration_still_checked_by_its_signature(monkeypatch):
    from ropebench.tasks.checks import check_task, extra_tokens

    def run(model, tokenizer, *, lengths, scale=1.0, seed=0, progress=True):
        return []

    monkeypatch.setitem(tasks.TASKS, "plugin", run)
    check_task("plugin", {"scale": 2})
    with pytest.raises(TaskError, match="must be a number"):
        check_task("plugin", {"scale": "big"})
    assert extra_tokens("plugin", {}) == 0


def test_run_cells_one_length_per_cell_for_dynamic_methods(tiny_model):
    """Under a length-dependent method each cell runs under fixed_length(its length + extra): the frequencies
    a prompt sees are those of its cell, whatever other cells ran (scored here as the rotary wrapper's fixed
    length)."""
    from ropebench import extend

    seen = {}

    def score(ids, cache, at):
        seen[at] = tiny_model.base_model.rotary_emb.fixed_seq_len
        return len(ids)

    with extend.patched(tiny_model, "dynamic-ntk", factor=2):
        out = run_cells(tiny_model, {64: [[1] * 10, [2] * 12], 128: [[3] * 5]}, score, extra_tokens=3)
    assert seen == {(64, 0): 67, (64, 1): 67, (128, 0): 131}
    assert [v for v, _ in out[64]] == [10, 12] and [v for v, _ in out[128]] == [5]
