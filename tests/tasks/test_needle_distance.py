"""Needle distance and clusters in passkey and retrieval rows (issue 29): `distance` counted on the tokenized
prompt, checked against the prompt's own tokens decoded one by one; `cluster` None for independent trials and
one id per shared haystack; several haystacks per cell, each key of a haystack at its own depth, the haystack
prefilled once and every question a short continuation."""

from __future__ import annotations

import random
import re

import pytest
from ropebench.tasks import TaskError, haystacks, passkey, retrieval
from ropebench.tasks.common import special_prefix
from ropebench.tasks.scenes import shared_scenes


def _holder(tok, ids: list[int], char: int) -> int:
    """Index in `ids` of the token that holds character `char` of their text, found by decoding growing
    prefixes (independent of the tokenizer's offsets, which the tasks use)."""
    lo, hi = 0, len(ids)
    while lo < hi:  # the least k with len(decode(ids[:k + 1])) > char
        mid = (lo + hi) // 2
        if len(tok.decode(ids[: mid + 1])) > char:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _expected_distance(tok, ids: list[int], prefix_len: int, needle: str, question: str) -> int:
    body = ids[prefix_len:]
    text = tok.decode(body)
    return _holder(tok, body, text.rindex(question)) - _holder(tok, body, text.index(needle))


def _spy_prompts(monkeypatch, module, name):
    """Record the prompt ids a task scores, in order."""
    seen = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(list(args[2]))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_passkey_distance_is_the_tokens_from_needle_to_question(tiny_model, tok, monkeypatch):
    seen = _spy_prompts(monkeypatch, passkey, "_generate")
    rows = passkey.run(tiny_model, tok, lengths=[300], depths=[0.0, 0.5, 1.0], trials=2, progress=False)
    prefix_len = len(special_prefix(tok))
    assert len(seen) == 6 and all(r["cluster"] is None for r in rows)  # each trial its own key: own unit
    expected = []
    for ids in seen:  # scored in the order that shares the most prefix, not the rows' order
        key = re.search(r"The pass key is (\d+)\. Remember", tok.decode(ids)).group(1)
        needle = passkey.NEEDLE.format(key=key)
        expected.append((len(ids), _expected_distance(tok, ids, prefix_len, needle, passkey.QUESTION)))
    tokens = sorted((r["value"], r["distance"]) for r in rows if r["metric"] == "prompt_tokens")
    assert sorted(expected) == tokens
    got = {(r["depth"], r["trial"]): r["distance"] for r in rows if r["metric"] == "correct"}
    # the needle first (depth 0) is about the whole prompt away; last (depth 1), its own ~20 tokens + newline
    assert got[0.0, 0] > 0.85 * 300 and 10 < got[1.0, 0] < 40
    assert got[0.0, 0] > got[0.5, 0] > got[1.0, 0]


def test_retrieval_distance_is_the_tokens_from_the_asked_needle(tiny_model, tok, monkeypatch):
    seen = _spy_prompts(monkeypatch, retrieval, "score_prompt")
    # length_rule fill: the haystack fills the length, so depth 0.5 is about half of it nearer the question
    kw = {"lengths": [400], "depths": [0.0, 0.5], "trials": 2, "candidates": 2, "progress": False}
    kw["length_rule"] = "fill"
    rows = retrieval.run(tiny_model, tok, variants=["niah_multikey", "vt"], **kw)
    prefix_len = len(special_prefix(tok))
    rows = [r for r in rows if r["metric"] == "prompt_tokens"]
    assert len(rows) == len(seen) == 8 and all(r["cluster"] is None for r in rows)
    expected = []
    for ids in seen:  # scored in the order that shares the most prefix, not the rows' order
        text = tok.decode(ids[prefix_len:])
        if "Question: Find all" in text:  # vt: the chain's first assignment; RULER's vt question
            needle, question = re.search(r"VAR [A-Z]{5} = \d{5}", text).group(), "Question: Find all"
        else:  # the queried key's needle: the one whose key the question names
            key = re.search(r"magic number for (\S+) mentioned", text).group(1)
            needle, question = f"One of the special magic numbers for {key} is", "What"
        expected.append((len(ids), _expected_distance(tok, ids, prefix_len, needle, question)))
    assert sorted(expected) == sorted((r["value"], r["distance"]) for r in rows)
    got = {(r["doc"], r["trial"], r["depth"]): r["distance"] for r in rows}
    for variant in ("niah_multikey", "vt"):  # the deeper needle is farther from the question
        assert all(got[variant, t, 0.0] > got[variant, t, 0.5] + 0.2 * 400 for t in (0, 1)), got


def test_shared_haystack_keys_at_their_own_depths():
    """One haystack, 3 depths x 2 trials: 6 keys, each asked once, each needle at its own depth; every
    prompt has the same context."""
    scenes = shared_scenes(random.Random(2), 2, 5, depths=[0.1, 0.5, 0.9])
    haystack = [f"Sentence {i}." for i in range(100)]
    users = [haystacks.compose(s, haystack, 0.0)[0] for s in scenes]
    contexts = {u.split("\nWhat is the special magic number")[0] for u in users}
    assert len(contexts) == 1 and len(scenes) == 6
    (context,) = contexts
    bound = re.findall(r"One of the special magic numbers for (\S+) is: (\d{7})\.", context)
    assert len(bound) == 6 and len({k for k, _ in bound}) == 6
    for i, (scene, user) in enumerate(zip(scenes, users, strict=True)):
        asked = re.search(r"magic number for (\S+) mentioned", user).group(1)
        key, value = bound[i]  # key i sits at depth i // 2, in key order: text order is key order
        assert asked == key and scene.answers == (value,) and scene.asked == i
        before = context[: context.index(f"for {key} is")]
        sentences_before = sum(f"Sentence {j}." in before for j in range(100))
        assert abs(sentences_before - 100 * [0.1, 0.5, 0.9][i // 2]) <= 1


def test_several_haystacks_one_prefill_each_and_clusters(tiny_model, tok, monkeypatch):
    """haystacks=3, 2 depths x 2 trials: 12 questions on 3 haystacks. Rows of a haystack share its cluster id,
    trial numbers run on over the haystacks; a haystack's questions differ only in the question, so the cell
    computes each haystack about once (the filler before the first needle once in all) plus short questions;
    the same numbers as without sharing; haystack 0 is the single haystack's draw."""
    from ropebench.tasks import kit

    caches = []

    class Counting(kit.PrefixCache):
        def __init__(self, *a, **k):
            super().__init__(*a, **k, min_shared=1)
            caches.append(self)

    monkeypatch.setattr(kit, "PrefixCache", Counting)
    seen = _spy_prompts(monkeypatch, retrieval, "score_prompt")
    kw = {"lengths": [512], "depths": [0.3, 0.7], "trials": 2, "candidates": 3, "progress": False}
    kw["length_rule"] = "fill"  # the haystack fills the length: the bounds below count in lengths
    kw["haystack"] = "noise"  # the same blocks in every haystack: the text before the first needle is shared
    rows = retrieval.run(tiny_model, tok, shared_haystack=True, haystacks=3, **kw)
    computed = sum(c.computed for c in caches)
    prompts = list(seen)
    caches.clear()
    alone = retrieval.run(tiny_model, tok, shared_haystack=True, haystacks=3, share_prefix=False, **kw)
    assert sum(c.computed for c in caches) == sum(map(len, prompts))
    lengths = [len(p) for p in prompts]
    # each haystack from its first needle (depth 0.3) on once, the shared filler before it once, the other
    # 3 questions of a haystack only from where they differ (the asked key, near the end)
    assert computed <= 0.3 * 512 + 3 * 0.72 * 512 + 9 * 40, (computed, lengths)
    for a, b in zip(rows, alone, strict=True):
        assert a["metric"] == b["metric"] and a["value"] == pytest.approx(b["value"], abs=1e-4)
    correct = [r for r in rows if r["metric"] == "answer_top1"]
    assert len(correct) == 12
    assert {(r["cluster"], r["trial"]) for r in correct} == {
        (f"haystack-{h}", h * 2 + t) for h in range(3) for t in range(2)
    }
    assert len({(r["depth"], r["trial"]) for r in correct}) == 12  # each row its own (depth, trial)
    assert all(r["task_options"]["haystacks"] == 3 for r in rows)
    deep = {r["trial"]: r["distance"] for r in correct if r["depth"] == 0.3}
    shallow = {r["trial"]: r["distance"] for r in correct if r["depth"] == 0.7}
    assert all(deep[t] > shallow[t] + 0.3 * 512 for t in deep)  # one haystack: the deeper key is farther
    keys = [set(re.findall(r"numbers for (\S+) is:", tok.decode(p))) for p in prompts]
    assert len({frozenset(k) for k in keys}) == 3  # each haystack its own keys
    seen.clear()
    single = retrieval.run(tiny_model, tok, shared_haystack=True, **kw)
    assert len(seen) == 4 and {tuple(p) for p in seen} <= {tuple(p) for p in prompts}
    assert [r["value"] for r in single] == [r["value"] for r in rows[: len(single)]]  # haystack 0's rows


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"haystacks": 2}, "haystacks=2 takes shared_haystack=true"),
        ({"haystacks": 0, "shared_haystack": True}, "positive integer"),
    ],
)
def test_haystacks_refused_before_the_model(options, fragment, tok):
    with pytest.raises(TaskError) as info:
        retrieval.run(None, tok, lengths=[1024], progress=False, **options)
    assert fragment in str(info.value) and "\n" not in str(info.value)
